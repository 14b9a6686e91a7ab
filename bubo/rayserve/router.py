"""Ray Serve's request router for bubo replicas: send a request where its prompt's prefix is cached.

For each replica the router remembers the block hashes (bubo.rayserve.prefix) of the prompts it
sent there, most recent last, up to `blocks_per_replica` of them: its picture of what that
replica's prefix cache holds. A request goes to the replica that holds the longest run of its
leading blocks, unless that replica has `busy_threshold` requests or more under way; then, as for
a request with no match (a new conversation, a GET), it goes to the least loaded replica (among
equally loaded ones, the one whose cache the router has sent least, so that conversations spread
evenly over the caches). Ray
Serve does the rest: it asks the chosen rank's replicas for their queue lengths, and one that is
full (max_ongoing_requests) passes the request to the next rank. Each choice is for its own
request (RequestRouter's exact matching by request id, not FIFOMixin's first-come: a replica
chosen for one prompt's prefix must not serve another)."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

DEFAULT_BUSY_THRESHOLD = 4
DEFAULT_BLOCKS_PER_REPLICA = 16384
MAX_CHOOSING = 4096


def request_prefix(pending: PendingRequest | None) -> tuple[int, ...]:
    """The prefix hashes the ingress put on the request (its first argument's `prefix`)."""
    if pending is None or not pending.args:
        return ()
    prefix = getattr(pending.args[0], "prefix", ())
    return tuple(prefix) if isinstance(prefix, tuple) else ()


class PrefixAwareRouter(RequestRouter):
    def initialize_state(self, busy_threshold: int = DEFAULT_BUSY_THRESHOLD,
                         blocks_per_replica: int = DEFAULT_BLOCKS_PER_REPLICA, **_: Any) -> None:
        self.busy_threshold = busy_threshold
        self.blocks_per_replica = blocks_per_replica
        self.held: dict[ReplicaID, OrderedDict[int, None]] = {}
        # requests under way on each replica, as this router sent them (sent and not completed),
        # and those it chose a replica for that Ray has not sent yet: concurrent choices see them
        self.inflight: dict[ReplicaID, int] = {}
        self.choosing: dict[str, ReplicaID] = {}

    def _load(self, r: RunningReplica) -> int:
        rid = r.replica_id
        mine = self.inflight.get(rid, 0) + sum(1 for c in self.choosing.values() if c == rid)
        cached = self.replica_queue_len_cache.get(rid)  # other routers' requests too (several ingresses)
        return max(mine, int(cached) if cached is not None else 0)

    def _chose(self, pending: PendingRequest | None, r: RunningReplica) -> None:
        if pending is not None:
            if len(self.choosing) > MAX_CHOOSING:  # choices whose request went away unrouted
                self.choosing.clear()
            self.choosing[pending.metadata.internal_request_id] = r.replica_id

    def match(self, replica_id: ReplicaID, prefix: tuple[int, ...]) -> int:
        """How many of prefix's leading blocks replica_id was sent."""
        held = self.held.get(replica_id)
        if not held:
            return 0
        n = 0
        for h in prefix:
            if h not in held:
                break
            n += 1
        return n

    def _by_load(self, replicas: list[RunningReplica]) -> list[RunningReplica]:
        """Least loaded first; among equals, the one whose cache holds least (a new conversation
        goes where it evicts least), then any."""
        shuffled = list(replicas)
        random.shuffle(shuffled)
        return sorted(shuffled, key=lambda r: (self._load(r), len(self.held.get(r.replica_id, ()))))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        prefix = request_prefix(pending_request)
        best: RunningReplica | None = None
        best_n = 0
        for r in candidate_replicas:
            n = self.match(r.replica_id, prefix) if prefix else 0
            if n > best_n or (n == best_n and n > 0 and best is not None and self._load(r) < self._load(best)):
                best, best_n = r, n
        if best is not None and self._load(best) < self.busy_threshold:
            self._chose(pending_request, best)
            return [[best], *([r] for r in self._by_load([r for r in candidate_replicas if r is not best]))]
        # one replica a rank, in this order: Ray Serve sends to the first whose queue has room
        ranked = self._by_load(candidate_replicas)
        self._chose(pending_request, ranked[0])
        return [[r] for r in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self.choosing.pop(pending_request.metadata.internal_request_id, None)
        self.inflight[replica_id] = self.inflight.get(replica_id, 0) + 1
        prefix = request_prefix(pending_request)
        if not prefix:
            return
        held = self.held.setdefault(replica_id, OrderedDict())
        for h in prefix:
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.blocks_per_replica:
            held.popitem(last=False)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        n = self.inflight.get(replica_id, 0)
        if n > 0:
            self.inflight[replica_id] = n - 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.held.pop(replica_id, None)  # its replacement starts with an empty cache
        self.inflight.pop(replica_id, None)
