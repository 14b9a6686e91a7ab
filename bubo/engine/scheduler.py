"""Continuous batching over parallel slots, with a prefix cache shared by every request.

The engine thread calls Scheduler.step() in a loop (the library's bubo.Model calls it in the
caller's thread, with one slot). One step is one forward pass:

  1. requests whose client went away leave their slot (queued ones never start);
  2. waiting requests take free slots, first come first served; each new one starts from the
     longest prefix of its prompt the cache can give (see "Prefix reuse" below), and one whose
     prompt starts with blocks another slot is still reading waits for them to be cached;
  3. the batch: one row per generating slot (its last sampled token), then prompt chunks of the
     slots still reading their prompt, oldest first, up to the step's token budget (-ub): a long
     prompt is read a chunk per step while the others keep generating;
  4. decode, then each slot whose row asked for logits gets its next token from its Generation
     (bubo/engine/generation.py: sampler, grammar, detokenizer, stop strings, finish rules), and
     the event goes to the request's sink.

A task's rows never depend on the rest of the batch: the kernels give every row the same bits
whatever the batch holds (matmul per (row, token) in one summation order, attention per token),
the sampler is the task's own. So an answer is the same alone or beside any others, which also
makes preemption exact: when the KV cache is full, the newest task gives its blocks back and is
queued again at the head, to re-read prompt and answer so far (mostly from the prefix cache) and
go on as if nothing happened.

Prefix reuse, one scheme for the server and the library: a slot that keeps its sequence after a
request (retain=True, the library's single slot) first reuses it token by token, as far as the
new prompt agrees with it (a follow-up turn reuses the whole conversation so far); otherwise, or
when nothing agrees, the slot starts empty and attaches the longest run of full KV blocks the
prefix cache holds for the prompt (csrc/kv/kv.c indexes every full block by its tokens and all
tokens before it, whichever slot computed it). The server's slots give their sequence back when a
request ends (retain=False): every block they held is then free or cached for any slot.

A task is a list of tokens (the prompt, then each sampled token) and n_past, how many of them
the slot's KV sequence holds. The pending tokens tokens[n_past:] are the slot's work: many while
it reads its prompt, exactly one (the last sampled) while it generates.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from bubo.engine.contexts import Contexts
from bubo.engine.draft import (
    MODEL_PRIOR,
    PROBE_EVERY,
    PROBE_LENGTH,
    ROW_COST_ROWS,
    Costs,
    DraftConfig,
    DraftModel,
    NgramDrafter,
    Pacing,
    choose_lengths,
    logits_row_factor,
)
from bubo.engine.generation import STOP, Generation, GrammarStuck, NoTokenLeft
from bubo.engine.metrics import Histogram
from bubo.engine.types import ErrorEvent, Event, FinishEvent, GenerationRequest, Reason, SlotPhase, SlotState, Timings

if TYPE_CHECKING:
    from bubo._model import KVCache
    from bubo.runtime import Runtime

log = logging.getLogger("bubo.engine")


class Sink(Protocol):
    """Where a request's events go: the server's EventStream, the library's run."""

    @property
    def request(self) -> GenerationRequest: ...

    @property
    def cancelled(self) -> bool: ...

    @property
    def ending(self) -> bool:
        """The reader has what it needs (a tool call when one was asked for): the answer ends
        at the next step, as an end-of-generation token would end it."""
        ...

    @property
    def backlogged(self) -> bool:
        """The reader has left enough events unread: the request pauses (it generates no more
        until they are read, holding its slot), so an answer nobody reads is not kept in memory."""
        ...

    def push(self, event: Event) -> None: ...


class Task:
    """One request in flight (queued, in a slot, or preempted and queued again)."""

    def __init__(self, sink: Sink, runtime: Runtime, n_ctx: int, task_id: int, draft: DraftConfig | None = None,
                 model_drafts: bool = False, gen: Generation | None = None):
        req = sink.request
        self.sink = sink
        self.req = req
        self.id = task_id
        self.gen = gen if gen is not None and gen.req is req else Generation(runtime, req, n_ctx)
        if req.draft_max is not None and draft is not None:
            draft = dataclasses.replace(draft, n_max=req.draft_max, n_min=min(draft.n_min, req.draft_max)) \
                if req.draft_max > 0 else None
        self.drafter: Pacing | None = None  # the sequence's drafting pace (and prompt lookup's index)
        if draft is not None and model_drafts:
            self.drafter = Pacing(draft)
        elif draft is not None and draft.ngram:
            self.drafter = NgramDrafter(draft, runtime.word_starts(), runtime.separators(), len(req.prompt),
                                        runtime.grammar_pieces(), runtime.space_runs())
        self.draft: list[int] = []  # drafted tokens after the pending one, in this step's plan
        self.checking = (0, 0)  # the draft being checked: (drafted, kept so far), for an answer ending in it
        self.tokens: list[int] = list(req.prompt)
        self.n_prompt = len(req.prompt)
        self.ns: int | None = None  # its prefix-cache namespace, once the scheduler has looked it up (Scheduler._ns)
        self.n_past = 0
        self.n_registered = 0  # leading KV blocks handed to the prefix cache
        self.n_cached: int | None = None  # prompt tokens from the cache (first admission)
        self.cache_miss: str | None = None
        self.n_preempted = 0
        self.t_submit = time.perf_counter()
        self.t_admit = 0.0
        self.t_prompt_done = 0.0
        self.t_first_token = 0.0

    @property
    def n_gen(self) -> int:
        return self.gen.n_gen

    @property
    def cancelled(self) -> bool:
        return self.sink.cancelled

    @property
    def n_pending(self) -> int:
        return len(self.tokens) - self.n_past


@dataclasses.dataclass
class Slot:
    id: int
    task: Task | None = None
    admitted: int = 0  # admission order: the newest is preempted first
    last: Task | None = None  # what the slot served last (shown while idle)
    held: list[int] = dataclasses.field(default_factory=list)  # what an idle slot's sequence holds (retain)
    used: float = 0.0  # when it last ended a request: the oldest held sequence goes first
    kept: list[int] | None = None  # what a slot file restored into it (until its next request)
    owner: str | None = None  # the caller whose request or restored file it holds (GenerationRequest.caller)
    ns: int = 0  # the prefix-cache namespace of what its sequence holds (Scheduler.namespace)


class SlotError(ValueError):
    """A slot file's operation that cannot be done: no such slot, or it is busy (busy True)."""

    def __init__(self, message: str, busy: bool = False):
        super().__init__(message)
        self.busy = busy


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    for x, y in zip(a, b):
        if n >= limit or x != y:
            break
        n += 1
    return n


class Scheduler:
    """Slots, the wait queue and the step. Only the thread that drives the engine calls step(),
    admit() and the private methods; snapshot methods may be called from any thread (stale
    figures, no crash: they read Python objects under the GIL and KV counters that are plain
    integers).

    The queue is the scheduler's own: add() queues a task and close() ends the queued ones, each
    under the scheduler's lock, which step() takes around admission (lock: the lock to use, an
    unpatched one in a gevent process; a new threading.Lock by default).

    memory_short(bytes): whether committing that much more KV memory would overrun what the
    machine has free now (None: never asked). retain: an idle slot keeps its sequence for the
    next request to continue (the library's one slot). draft: how sequences draft (None: they
    do not); draft_model: the draft model that drafts for them (draft.model loaded), its
    sequences following the slots'."""

    def __init__(self, runtime: Runtime, kv: KVCache, n_slots: int, n_step: int, n_ctx: int,
                 memory_short: Callable[[int], bool] | None = None, retain: bool = False,
                 draft: DraftConfig | None = None, draft_model: DraftModel | None = None,
                 lock: AbstractContextManager[Any] | None = None):
        self.runtime = runtime
        self._lock: AbstractContextManager[Any] = lock if lock is not None else threading.Lock()
        self._closed: ErrorEvent | None = None
        # drafting rolls the cache back past a refused draft: a sliding-window pool that has
        # already dropped the positions the rollback returns to cannot (swa_full=False)
        self.draft = draft if kv.sliding_window == 0 or kv.swa_full else None
        self.draft_model = draft_model if self.draft is not None else None
        self.native = runtime.native
        self.kv = kv
        self.n_ctx = n_ctx
        self.n_step = n_step
        self.retain = retain
        self._namespaces: collections.OrderedDict[tuple[str | None, tuple[tuple[int, float], ...]], int] = \
            collections.OrderedDict()  # namespace()
        self._next_ns = 0
        self.block_size = kv.block_size
        self.slots = [Slot(i) for i in range(n_slots)]
        # the cache's sequences past the slots' are contexts (bubo.engine.contexts)
        self.contexts = Contexts(kv, n_slots) if kv.n_seq_max > n_slots else None
        self._queue: collections.deque[Task] = collections.deque()
        # requests whose readers left their events unread while others waited for a slot: out of
        # their slots (their blocks in the prefix cache) until read, then queued again at the head
        self.parked: list[Task] = []
        self._memory_short = memory_short
        self._n_admitted = 0
        self.n_task = 0
        self.counters: dict[str, float] = dict(
            requests_total=0, prompt_tokens_total=0, prompt_tokens_cached_total=0, prompt_seconds_total=0.0,
            tokens_predicted_total=0, tokens_predicted_seconds_total=0.0, n_decode_total=0,
            n_tokens_max=0, n_busy_slots_total=0, n_preemptions_total=0,
            prefix_cache_lookup_tokens_total=0, prefix_cache_hit_tokens_total=0,
            n_drafted_total=0, n_drafted_accepted_total=0,
        )
        self.ttft = Histogram()
        self.queue_wait = Histogram()
        # what a forward pass of n rows costs and how drafts fare, for the draft lengths
        self.costs = Costs(MODEL_PRIOR if self.draft_model is not None else 0.5, logits_row_factor(self.native))

    # --- the queue (add, close and the counts: any thread, under the scheduler's lock) -------

    def new_generation(self, req: GenerationRequest) -> Generation:
        """The request's sampler and grammar state (any thread: the costly part of a new task)."""
        return Generation(self.runtime, req, self.n_ctx)

    def new_task(self, sink: Sink, gen: Generation | None = None) -> Task:
        """The request's Task (its sampler and grammar state built here, outside the queue's lock,
        unless gen, from new_generation, has them)."""
        self.n_task += 1
        return Task(sink, self.runtime, self.n_ctx, self.n_task, self.draft, self.draft_model is not None, gen)

    def add(self, task: Task, most: int | None = None) -> ErrorEvent | str | None:
        """Queue task: None when it is queued; "full" when most (busy slots and waiting tasks
        together) are there already; the closing event when the scheduler is closed."""
        with self._lock:
            if self._closed is not None:
                return self._closed
            if most is not None and self.n_busy() + self._n_waiting() >= most:
                return "full"
            self._queue.append(task)
            return None

    def close(self, event: ErrorEvent) -> None:
        """End every task, running, waiting or parked, with event; later adds are refused with it
        (the engine stops). Only the stepping thread calls it, after its last step."""
        with self._lock:
            self._closed = event
            self.fail_all(event, queued=True)

    def n_waiting(self) -> int:
        """Tasks waiting for a slot (any thread)."""
        with self._lock:
            return self._n_waiting()

    def _n_waiting(self) -> int:
        return sum(1 for t in self._queue if not t.cancelled)

    def n_busy(self) -> int:
        return sum(1 for s in self.slots if s.task is not None)

    def idle(self) -> bool:
        return all(s.task is None for s in self.slots) and not self._queue and not self.parked

    # --- one step ---------------------------------------------------------------------------

    def step(self) -> bool:
        """Run one forward pass over every active slot. False when there was nothing to do."""
        for s in self.slots:
            if s.task is not None and s.task.cancelled:
                self._release(s)
            elif s.task is not None and s.task.n_gen and s.task.sink.ending:
                self._finish(s, STOP)
        with self._lock:
            self._end_prefills()
            self._park_unread()
            self._admit()
        # a generating request whose reader is behind pauses: no token for it this step
        active = sorted((s for s in self.slots if s.task is not None and not (s.task.n_gen and s.task.sink.backlogged)),
                        key=lambda s: s.admitted)
        if not active:
            return False
        batch = self._plan(active)
        if not batch:
            return True  # everything was preempted or finished for lack of room: plan again
        self._run(batch)
        return True

    def _park_unread(self) -> None:
        """A request whose reader is behind gives its slot to the requests waiting for one (a
        client that reads nothing cannot keep a slot from one that does), and comes back at the
        head of the queue once its events are read; its answer goes on exactly (preemption)."""
        for t in list(self.parked):
            if t.cancelled:
                self.parked.remove(t)
                self._ended(t)
            elif not t.sink.backlogged:
                self.parked.remove(t)
                self._queue.appendleft(t)
        if not self._n_waiting():
            return
        for s in self.slots:
            held = s.task
            if held is not None and held.n_gen and held.sink.backlogged and not held.cancelled:
                log.info("task %d is not being read: it gives its slot to a waiting request", held.id)
                self._give_back(s)
                self.parked.append(held)

    def _end_prefills(self) -> None:
        """A prefill yields: every one ends when another request waits for a slot, and all but the
        newest when there are several. Each answers with what it read so far."""
        prefills = [t for t in self._queue if t.req.prefill and not t.cancelled]
        prefills += [s.task for s in self.slots if s.task is not None and s.task.req.prefill]
        if not prefills:
            return
        other = any(not t.req.prefill and not t.cancelled for t in self._queue)
        newest = max(t.id for t in prefills)
        for t in prefills:
            if not (other or t.id != newest):
                continue
            slot = next((s for s in self.slots if s.task is t), None)
            if slot is not None:
                self._finish_prefill(slot)
            else:
                self._queue.remove(t)
                t.sink.push(FinishEvent(STOP, None, t.n_prompt, 0, 0, Timings()))

    def _finish_prefill(self, s: Slot) -> None:
        """A prefill's end: its full blocks are in the prefix cache (the slot gives them back)."""
        t = self._task(s)
        n_cached = t.n_cached or 0
        end = time.perf_counter()
        timings = Timings(cached_n=n_cached, prompt_n=max(t.n_past - n_cached, 0),
                          prompt_s=max(end - t.t_admit, 0.0), queue_s=max(t.t_admit - t.t_submit, 0.0),
                          cache_miss=t.cache_miss)
        self._keep(s, t)
        t.sink.push(FinishEvent(STOP, None, t.n_prompt, n_cached, 0, timings,
                                prefilled=t.n_registered * self.block_size))
        self._release(s, keep=False)

    def _admit(self) -> None:
        waiting: list[Task] = []  # tasks that wait for a running slot's prompt: back at the head after
        try:
            self._admit_some(waiting)
        finally:
            self._queue.extendleft(reversed(waiting))

    def _admit_some(self, waiting: list[Task]) -> None:
        free = [s for s in self.slots if s.task is None]
        while free and self._queue:
            task = self._queue[0]
            if task.cancelled:
                self._ended(self._queue.popleft())
                continue
            if self._prefix_coming(task):
                waiting.append(self._queue.popleft())
                continue
            if task.req.prefill and task.n_cached is None:
                # only whole blocks outlive the slot: a prefill reads up to the last one
                task.n_prompt = len(task.tokens) // self.block_size * self.block_size
                del task.tokens[task.n_prompt:]
                if task.n_prompt == 0:
                    self._queue.popleft()
                    task.sink.push(FinishEvent(STOP, None, 0, 0, 0, Timings()))
                    continue
            slot = self._pick(free, task)
            slot.kept = None
            self._start_from_context(slot, task)
            n_hit = self._reuse(slot, task)
            need = len(task.tokens) - n_hit + (self.block_size if self.kv.seq_last_shared(slot.id) else 0)
            if need > self.kv.n_free_tokens:
                self._drop_held(keep=slot)
            if need > self.kv.n_free_tokens and any(s.task is not None for s in self.slots):
                # not enough room now beside the running slots: wait (first come, first served)
                self._clear(slot)
                return
            self._queue.popleft()
            free.remove(slot)
            task.n_past = n_hit
            task.n_registered = n_hit // self.block_size
            self._n_admitted += 1
            slot.admitted = self._n_admitted
            slot.task = task
            slot.owner = task.req.caller
            if self.draft_model is not None and task.drafter is not None:
                self.draft_model.start(slot.id, task.tokens)
            now = time.perf_counter()
            if task.n_cached is None:  # first admission (a preempted task keeps its figures)
                task.t_admit = now
                task.n_cached = min(n_hit, task.n_prompt)
                task.cache_miss = self._miss_reason(task, n_hit)
                self.queue_wait.observe(now - task.t_submit)
                c = self.counters
                c["requests_total"] += 1
                c["prompt_tokens_cached_total"] += task.n_cached
                c["prefix_cache_lookup_tokens_total"] += task.n_prompt
                c["prefix_cache_hit_tokens_total"] += task.n_cached

    def _prefix_coming(self, task: Task) -> bool:
        """Whether a running slot is still reading a prompt that starts with full blocks of task's
        prompt which the prefix cache does not hold yet. Then task waits (later tasks go past it)
        and starts once those blocks are read and cached, instead of computing the same rows beside
        them: clients that send one long history at once have it read once. Only slots still
        reading their prompt are waited for, and each step reads more of it, so the wait ends."""
        if not task.req.cache_prompt:
            return False
        last = len(task.tokens) - 1
        ns = self._ns(task)
        for s in self.slots:
            t = s.task
            if t is None or t.n_past >= t.n_prompt or not t.req.cache_prompt or s.ns != ns:
                continue  # (another namespace's blocks are never this task's to attach)
            shared = common_prefix(t.tokens, task.tokens, min(last, t.n_prompt)) // self.block_size
            if shared > t.n_registered:
                return True
        return False

    def _pick(self, free: list[Slot], task: Task) -> Slot:
        """The free slot whose held sequence agrees longest with the task's tokens (an empty one
        on a tie, then the one that held its sequence longest ago)."""
        if not self.retain:
            return free[0]  # an idle slot's sequence is empty: _release and _preempt free it
        last = len(task.tokens) - 1

        ns = self._ns(task)

        def score(s: Slot) -> tuple[int, int, float]:
            n = common_prefix(s.held, task.tokens, last) if task.req.cache_prompt and s.ns == ns else 0
            return (n, not s.held, -s.used)

        return max(free, key=score)

    def _reuse(self, slot: Slot, task: Task) -> int:
        """Start slot's sequence with as much of task's tokens as the cache holds; returns how
        many. The last known token always runs: its logits (or its row) are what comes next."""
        last = len(task.tokens) - 1
        ns = self._ns(task)
        if not task.req.cache_prompt:
            self._clear(slot, ns)
            return 0
        if slot.held and slot.ns == ns:
            n = common_prefix(slot.held, task.tokens, last)
            if n > 0:
                try:
                    self.kv.truncate(slot.id, n)
                    slot.held = []
                    return n
                except ValueError:
                    # a sliding-window layer has already released the blocks the next token would
                    # attend to: start the prompt over (llama-server does the same)
                    pass
        self._clear(slot, ns)
        return self.kv.prefix_attach(slot.id, task.tokens[:last])

    def _start_from_context(self, slot: Slot, task: Task) -> None:
        """A request that starts from a context: its slot's sequence becomes the context's (shared
        blocks), held so that _reuse keeps what agrees with the prompt."""
        seq = task.req.context
        ctx = self.contexts.by_seq(seq) if seq is not None and self.contexts is not None else None
        if ctx is None or ctx.spilled is not None or not ctx.tokens or task.n_cached is not None:
            return
        if ctx.ns != self._ns(task):
            return  # its rows were computed with other adapters (or for another caller): read the prompt again
        self._clear(slot)
        self.kv.fork(ctx.seq, slot.id)  # (the fork takes the context's namespace, which is the task's)
        slot.held, slot.ns = list(ctx.tokens), ctx.ns

    def _clear(self, slot: Slot, ns: int | None = None) -> None:
        """Empty slot's sequence: its indexed blocks stay in the prefix cache. ns: the namespace
        its next sequence attaches and registers in."""
        self.kv.free(slot.id)
        slot.held = []
        if ns is not None:
            self.kv.prefix_namespace(slot.id, ns)
            slot.ns = ns
        if self.draft_model is not None:
            self.draft_model.forget(slot.id)

    def _drop_held(self, keep: Slot | None = None) -> bool:
        """Give back every idle slot's held sequence (oldest first) but keep's. True if any was."""
        held = sorted((s for s in self.slots if s.task is None and s.held and s is not keep), key=lambda s: s.used)
        for s in held:
            self._clear(s)
        return bool(held)

    def _miss_reason(self, task: Task, n_hit: int) -> str | None:
        """Why prompt tokens were computed rather than reused; None when everything that could be
        reused was (all full blocks but the one holding the last prompt token)."""
        if not task.req.cache_prompt:
            return "cache_prompt is false"
        reusable = (task.n_prompt - 1) // self.block_size * self.block_size
        if reusable == 0:
            return f"the prompt is shorter than one cache block ({self.block_size} tokens) plus one"
        if n_hit >= reusable:
            return None
        if n_hit == 0:
            return "no cached block starts this prompt (new prefix, or evicted)"
        return (f"the cache holds the first {n_hit} tokens of this prompt; block {n_hit // self.block_size} "
                "differs from anything cached (or was evicted)")

    def _plan(self, active: list[Slot]) -> list[tuple[Slot, int]]:
        """(slot, tokens to run) for this step: generating slots first, then prompt chunks, oldest
        first, within the step budget and the KV cache's room (preempting the newest if short).
        Drafts are extras: they go first when the cache or the memory is short, never a request."""
        # each draft is proposed once per step (a drafter keeps state); a plan made again with
        # fewer slots leaves every draft within the budget it was proposed in
        self._draft_step(active)
        while True:
            budget = self.n_step
            plan: list[tuple[Slot, int]] = []
            for s in active:
                t = self._task(s)
                if t.n_pending == 1:
                    plan.append((s, 1 + len(t.draft)))
                    budget -= 1 + len(t.draft)
            for s in active:
                n = self._task(s).n_pending
                if n > 1 and budget > 0:
                    take = min(n, budget)
                    plan.append((s, take))
                    budget -= take
            need = sum(self._new_blocks(s, n) for s, n in plan) * self.block_size
            if need <= self.kv.n_free_tokens:
                break
            if self._drop_held():
                continue
            if any(self._task(s).draft for s, _ in plan):
                for s, _ in plan:
                    self._task(s).draft = []
                continue
            victim = active[-1]
            if len(active) == 1:
                # alone and still short: the cache cannot hold this sequence
                self._finish_full(victim)
                return []
            self._preempt(victim)
            active = active[:-1]
        for i, (s, n) in enumerate(plan):
            t = self._task(s)
            if t.draft and self._memory_short_for(s, n):
                t.draft = []  # the draft would take memory the machine is short of: no draft
                plan[i] = (s, 1)
        short = [(s, n) for s, n in plan if self._memory_short_for(s, n)]
        for s, _ in short:
            self._finish_no_memory(s)
        return [(s, n) for s, n in plan if s.task is not None]

    def _draft_step(self, active: list[Slot]) -> None:
        """Each generating task's draft for this step (t.draft): prompt lookup's, or the draft
        model's, as long as choose_lengths finds it pays, within the step's budget, the answer's
        max_tokens and the context (the pending token and the draft must fit, and one more token
        after them)."""
        # generating tasks (a prompt's last token is no draft's place: a prefill or a context's
        # making generates nothing)
        gen = [t for s in active if (t := self._task(s)).n_pending == 1 and not (t.req.prefill or t.req.read_only)]
        for t in gen:
            t.draft = []
        drafting = [t for t in gen if t.drafter is not None]
        if not drafting:
            return
        base = len(gen) + min(sum(self._task(s).n_pending for s in active if self._task(s).n_pending > 1),
                              max(self.n_step - len(gen), 0))
        budget = self.n_step - base
        offers: list[list[int]] = []  # prompt lookup's longest drafts on offer
        caps: list[int] = []
        for t in drafting:
            assert t.drafter is not None
            limit = min(budget, self.n_ctx - len(t.tokens) - 1, t.drafter.config.n_max)
            if t.req.max_tokens is not None:
                limit = min(limit, t.req.max_tokens - t.n_gen - 1)
            limit = max(limit, 0)
            if isinstance(t.drafter, NgramDrafter):
                offer = t.drafter.propose(t.tokens, limit) if limit > 0 else []
                offers.append(offer)
                caps.append(len(offer))
            else:
                offers.append([])
                caps.append(limit)
        one = self.costs.target(base)
        if one is None:  # nothing measured yet: the plain step first
            return
        draft_s = 0.0
        if self.draft_model is not None:
            draft_s = self.draft_model.costs.draft_s if self.draft_model.costs.draft_s is not None else one / 4
        step_s = self.costs.target
        prior = self.costs.alpha
        ks = choose_lengths([t.drafter.alpha(prior) for t in drafting if t.drafter is not None], caps,
                            lambda m: step_s(base + m) or one, draft_s)
        jobs: list[tuple[int, list[int], int]] = []  # the draft model's: (sequence, tokens, most to draft)
        if any(k == 0 for k in ks):
            self.costs.idle()
        for t, k, offer, cap in zip(drafting, ks, offers, caps):
            assert t.drafter is not None
            if k == 0 and t.drafter.since >= PROBE_EVERY:
                k = min(cap, PROBE_LENGTH)  # a probe: the estimates that said no may be stale
            if k < max(1, t.drafter.config.n_min):
                t.drafter.idle()
            elif isinstance(t.drafter, NgramDrafter):
                t.draft = offer[:k]
            else:
                jobs.append((self._slot_of(t), t.tokens, k))
        if jobs:
            assert self.draft_model is not None
            drafts = self.draft_model.propose(jobs, lambda m: step_s(base + m) or one)
            for t in drafting:
                assert t.drafter is not None
                if (seq := self._slot_of(t)) not in drafts:
                    continue
                if len(drafts[seq]) >= max(1, t.drafter.config.n_min):
                    t.draft = drafts[seq]
                else:  # asked and had nothing worth checking: a refusal, as far as pacing goes
                    t.drafter.taken(0, 0)
                    self.costs.record(0, 0)

    MAX_NAMESPACES = 4096  # past it the least recently used (caller, adapters) gets a new one when next seen

    def namespace(self, req: GenerationRequest) -> int:
        """The prefix-cache namespace of req's rows: one per (caller, adapters and scales), 0 for
        the unnamed caller without adapters. Rows of another adapter set are other numbers, and
        another caller's prompt is not theirs to find by its cached prefix; a namespace forgotten
        (least recently used) is never given again: its blocks are simply not found."""
        key = (req.caller, req.lora)
        if key == (None, ()):
            return 0
        ns = self._namespaces.pop(key, None)
        if ns is None:
            self._next_ns += 1
            ns = self._next_ns
            if len(self._namespaces) >= self.MAX_NAMESPACES:
                self._namespaces.pop(next(iter(self._namespaces)))
        self._namespaces[key] = ns
        return ns

    def _ns(self, task: Task) -> int:
        """task's namespace, looked up once (the engine's thread: namespace() keeps its own order)."""
        if task.ns is None:
            task.ns = self.namespace(task.req)
        return task.ns

    def _slot_of(self, t: Task) -> int:
        return next(s.id for s in self.slots if s.task is t)

    @staticmethod
    def _task(s: Slot) -> Task:
        assert s.task is not None
        return s.task

    def _new_blocks(self, s: Slot, n: int) -> int:
        """Blocks s's sequence takes to add n tokens: those it crosses into, and a copy of its
        partly filled last block when a context shares it (kv.c copies it on write)."""
        bs = self.block_size
        past = self._task(s).n_past
        return -(-(past + n) // bs) - (-(-past // bs)) + int(self.kv.seq_last_shared(s.id))

    def _short(self, n_bytes: int) -> bool:
        return n_bytes > 0 and self._memory_short is not None and self._memory_short(n_bytes)

    def _memory_short_for(self, s: Slot, n: int) -> bool:
        """The cache must take more memory from the OS for this slot's rows and the machine is
        short of it now (the memory guard; 0 bytes to commit never asks the OS)."""
        return self._short(self.kv.grow_bytes(s.id, self._task(s).n_past + n))

    def _run(self, plan: list[tuple[Slot, int]]) -> None:
        n_rows = sum(n for _, n in plan)
        toks = np.empty(n_rows, dtype=np.int32)
        pos = np.empty(n_rows, dtype=np.int32)
        seq = np.empty(n_rows, dtype=np.int32)
        want = np.zeros(n_rows, dtype=bool)
        lora = None
        if any(self._task(s).req.lora for s, _ in plan):
            from bubo._model import MAX_LORA

            lora = np.zeros((n_rows, MAX_LORA), dtype=np.float32)
        i = 0
        sampled: list[Slot] = []
        for s, n in plan:
            t = self._task(s)
            if lora is not None:
                for index, scale in t.req.lora:
                    lora[i:i + n, index] = scale
            if t.draft:  # the pending token and its draft: every row's logits are checked
                toks[i:i + n] = [t.tokens[t.n_past], *t.draft]
                want[i:i + n] = True
                sampled.append(s)
            else:
                toks[i:i + n] = t.tokens[t.n_past:t.n_past + n]
                if t.n_past + n == len(t.tokens) and not (t.req.prefill or t.req.read_only):
                    want[i + n - 1] = True
                    sampled.append(s)
            pos[i:i + n] = np.arange(t.n_past, t.n_past + n, dtype=np.int32)
            seq[i:i + n] = s.id
            i += n
        try:
            t0 = time.perf_counter()
            logits = self.native.decode(self.kv, toks, pos, seq, want, lora_scales=lora)
            seconds, n_logits = time.perf_counter() - t0, int(want.sum())
            if n_logits == n_rows:  # rows that all give logits, as a drafting step's do
                self.costs.observe(n_rows, seconds)
            elif n_rows - n_logits >= ROW_COST_ROWS:  # a prompt's chunk: what a row's arithmetic costs at most
                self.costs.observe_rows(n_rows, n_logits, seconds)
        except MemoryError as e:
            log.warning("the KV cache could not grow: %s", e)
            for s, _ in plan:
                self._fail(s, ErrorEvent(Reason.MEMORY_SHORT, f"out of memory: {e}"))
            return
        except Exception as e:  # noqa: BLE001 - the batch failed; the engine goes on
            log.exception("decode failed")
            for s, _ in plan:
                self._fail(s, ErrorEvent(Reason.INTERNAL, f"generation failed: {type(e).__name__}: {e}"))
            return
        c = self.counters
        c["n_decode_total"] += 1
        c["n_busy_slots_total"] += len(plan)
        now = time.perf_counter()
        for s, n in plan:
            t = self._task(s)
            t.n_past += 1 if t.draft else n  # a draft's rows count once they are checked
            if t.n_past <= t.n_prompt:
                c["prompt_tokens_total"] += n
            self._register(s, t)
        c["n_tokens_max"] = max(c["n_tokens_max"], max(self._task(s).n_past for s, _ in plan))
        if self.draft_model is not None:  # the draft model's sequences read the prompts too
            self.draft_model.follow([(s.id, t.tokens, t.n_past) for s, _ in plan
                                     if (t := self._task(s)).drafter is not None and t.n_gen == 0])
        for s, _ in plan:
            if ((t := self._task(s)).req.prefill or t.req.read_only) and t.n_past == len(t.tokens):
                self._finish_prefill(s)  # read: its blocks go to the prefix cache
        row = 0
        for s in sampled:  # (a prefill or a context's making is never among them: no logits, no draft)
            t = self._task(s)
            n = 1 + len(t.draft) if t.draft else 1
            try:
                if t.draft:
                    self._verify(s, t, logits[row:row + n], now)
                else:
                    self._sample(s, logits[row], now)
            except Exception as e:  # noqa: BLE001 - one sequence's failure ends that request, no other
                log.exception("task %d failed after a forward pass", t.id)
                if s.task is t:
                    self._fail(s, ErrorEvent(Reason.INTERNAL, f"generation failed: {type(e).__name__}: {e}"))
            row += n

    def _register(self, s: Slot, t: Task) -> None:
        """Hand s's full blocks of checked tokens to the prefix cache."""
        n_full = t.n_past // self.block_size
        if n_full > t.n_registered:
            self.kv.prefix_register(s.id, t.tokens[: n_full * self.block_size])
            t.n_registered = n_full

    def _verify(self, s: Slot, t: Task, rows: npt.NDArray[np.float32], now: float) -> None:
        """Sample t's rows in order, exactly as plain decoding would (the same sampler chain,
        grammar and random draws: one per token the answer keeps), keeping each drafted token
        while it equals the token sampled before it; the cache forgets the rest."""
        draft, t.draft = t.draft, []
        accepted = 0
        for i in range(len(draft) + 1):
            t.checking = (len(draft), accepted)  # what the timings count if the answer ends here
            self._sample(s, rows[i], now)
            if s.task is not t:  # it ended (or failed) at this token
                break
            if i == len(draft) or t.tokens[-1] != draft[i]:
                break
            accepted += 1
            t.n_past += 1  # the drafted token is in the cache and is now the answer's
        t.checking = (0, 0)
        c = self.counters
        c["n_drafted_total"] += len(draft)
        c["n_drafted_accepted_total"] += accepted
        if t.drafter is not None:
            t.drafter.taken(len(draft), accepted)
            self.costs.record(len(draft), accepted)
        if s.task is t:
            self.kv.truncate(s.id, t.n_past)
            self._register(s, t)
        elif s.held:  # the library's slot keeps what its sequence holds: only checked tokens
            self.kv.truncate(s.id, len(s.held))

    def _sample(self, s: Slot, logits: npt.NDArray[np.float32], now: float) -> None:
        t = self._task(s)
        if t.n_gen == 0 and t.t_prompt_done == 0.0:
            t.t_prompt_done = now
            self.counters["prompt_seconds_total"] += now - t.t_admit
        try:
            event, reason = t.gen.step(logits, len(t.tokens) + 1,
                                       lambda n: not self._short(self.kv.grow_bytes(s.id, n)))
        except GrammarStuck as e:
            self._fail(s, ErrorEvent(Reason.GRAMMAR_STUCK, str(e)))
            return
        except NoTokenLeft as e:
            self._fail(s, ErrorEvent(Reason.NO_TOKEN, str(e)))
            return
        t.tokens.append(event.token)
        if t.n_gen == 1:
            t.t_first_token = time.perf_counter()
            self.ttft.observe(t.t_first_token - t.t_submit)
        t.sink.push(event)
        if reason is not None:
            self._finish(s, reason)

    # --- endings ----------------------------------------------------------------------------

    def _timings(self, t: Task) -> Timings:
        end = time.perf_counter()
        n_cached = t.n_cached or 0
        return Timings(
            cached_n=n_cached,
            prompt_n=t.n_prompt - n_cached,
            prompt_s=max((t.t_prompt_done or end) - t.t_admit, 0.0),
            predicted_n=t.n_gen,
            predicted_s=max(end - (t.t_prompt_done or end), 0.0),
            queue_s=max(t.t_admit - t.t_submit, 0.0),
            cache_miss=t.cache_miss,
            draft_n=t.drafter.n_drafted + t.checking[0] if t.drafter is not None else 0,
            draft_n_accepted=t.drafter.n_accepted + t.checking[1] if t.drafter is not None else 0,
        )

    def _finish(self, s: Slot, reason: str) -> None:
        t = self._task(s)
        timings = self._timings(t)
        c = self.counters
        c["tokens_predicted_total"] += t.n_gen
        c["tokens_predicted_seconds_total"] += timings.predicted_s
        self._keep(s, t)
        t.sink.push(FinishEvent(reason, t.gen.stop_string, t.n_prompt, t.n_cached or 0, t.n_gen, timings,
                                 steered=t.gen.steered))
        self._release(s)

    def _keep(self, s: Slot, t: Task) -> None:
        """A request with keep: its context becomes what its sequence holds now."""
        if t.req.keep is not None and self.contexts is not None:
            self.contexts.kept(t.req.keep, t.tokens[: t.n_past], s.id, s.ns)

    def _finish_full(self, s: Slot) -> None:
        """The cache cannot hold this sequence's next tokens even alone."""
        t = self._task(s)
        if t.n_gen == 0:
            self._fail(s, ErrorEvent(Reason.CONTEXT_EXCEEDED,
                                     f"the prompt ({t.n_prompt} tokens) does not fit in the KV cache "
                                     f"({self.n_ctx} tokens)"))
            return
        # (unreachable while the pool holds n_ctx tokens and sampling stops at n_ctx: kept as the
        # safe ending; text the stop matcher held back for a possible stop string is dropped)
        self._finish(s, "length")

    def _finish_no_memory(self, s: Slot) -> None:
        if self._task(s).n_gen == 0:
            self._fail(s, ErrorEvent(Reason.MEMORY_SHORT,
                                     "the KV cache cannot grow: the machine's memory is short; try again"))
        else:
            self._finish_full(s)

    def _fail(self, s: Slot, event: ErrorEvent) -> None:
        self._task(s).sink.push(event)
        self._release(s, keep=False)

    def fail_all(self, event: ErrorEvent, queued: bool = False) -> None:
        """End every task in a slot with event (after an unexpected error in a step), and with
        queued the waiting ones too (the engine stops)."""
        for s in self.slots:
            if s.task is not None:
                self._fail(s, event)
        while queued and self._queue:
            t = self._queue.popleft()
            self._ended(t)
            t.sink.push(event)
        while queued and self.parked:
            t = self.parked.pop()
            self._ended(t)
            t.sink.push(event)

    def reset(self) -> None:
        """Forget every task and empty every sequence (after an exception the caller re-raises:
        what the cache holds is then unknown)."""
        self._queue.clear()
        self.parked.clear()
        for s in self.slots:
            s.task = None
            self._clear(s)

    def _preempt(self, s: Slot) -> None:
        t = self._task(s)
        log.info("KV cache full: task %d gives back its slot and waits to resume", t.id)
        self._give_back(s)
        self._queue.appendleft(t)

    def _give_back(self, s: Slot) -> None:
        """Take s's task out of its slot, to be admitted again later (its full blocks stay in the
        prefix cache, so it re-reads little)."""
        t = self._task(s)
        t.n_preempted += 1
        self.counters["n_preemptions_total"] += 1
        self._clear(s)
        t.n_past = 0
        t.n_registered = 0
        t.draft = []
        s.task = None

    def _ended(self, t: Task) -> None:
        """A task is over, whichever way: the context it was writing (keep) is free again."""
        if t.req.keep is not None and self.contexts is not None:
            self.contexts.ended(t.req.keep)

    def _release(self, s: Slot, keep: bool = True) -> None:
        t = self._task(s)
        self._ended(t)
        s.last = t
        s.used = time.perf_counter()
        s.task = None
        if keep and self.retain:
            s.held = t.tokens[: t.n_past]  # exactly what the sequence holds
        else:
            self._clear(s)  # its indexed blocks stay in the prefix cache

    # --- slot files (a slot's KV rows saved and restored; on the stepping thread) -------------

    def _idle_slot(self, slot_id: int) -> Slot:
        if not 0 <= slot_id < len(self.slots):
            raise SlotError(f"there is no slot {slot_id}: this server has {len(self.slots)} "
                            f"(0 to {len(self.slots) - 1})")
        s = self.slots[slot_id]
        if s.task is not None:
            raise SlotError(f"slot {slot_id} is serving a request: try again once it is idle", busy=True)
        return s

    @staticmethod
    def _slot_tokens(s: Slot) -> list[int]:
        """What an idle slot holds for a client: what was restored into it, else its last
        request's prompt and answer."""
        if s.kept is not None:
            return list(s.kept)
        if s.held:
            return list(s.held)
        return list(s.last.tokens[: s.last.n_past]) if s.last is not None else []

    def save_slot(self, slot_id: int) -> tuple[list[int], bytes]:
        """(tokens, their K and V rows) of what the idle slot holds, as far as the KV cache holds
        it: a server slot's sequence went to the prefix cache when its request ended, so its whole
        blocks (what outlives a request) are what is saved."""
        s = self._idle_slot(slot_id)
        if s.kept is None and s.last is not None and s.last.req.lora:
            # its rows are an adapter's: a file does not say which, and another server's rows of
            # the same tokens would be taken for them
            raise SlotError(f"slot {slot_id} holds a conversation generated with LoRA adapters: slot files keep "
                            "the base model's rows only")
        tokens = self._slot_tokens(s)
        if not s.held:
            self.kv.prefix_namespace(s.id, s.ns)  # the blocks its last request registered
        n = len(s.held) if s.held else self.kv.prefix_attach(s.id, tokens)
        try:
            rows = self.kv.export_rows(s.id, n) if n else b""
        finally:
            if not s.held:
                self.kv.free(s.id)
        return tokens[:n], rows

    def restore_slot(self, slot_id: int, tokens: list[int], rows: bytes, owner: str | None = None) -> int:
        """Put tokens and their rows (save_slot's, of this model and cache) into the idle slot:
        its whole blocks are indexed in the prefix cache, so a prompt that starts with them reads
        only what follows; the slot is owner's now. Returns how many tokens. Nothing changes when
        the rows are refused."""
        s = self._idle_slot(slot_id)
        self._clear(s, self.namespace(GenerationRequest([], caller=owner)))
        if tokens:
            self.kv.import_rows(s.id, len(tokens), rows)
            self.kv.prefix_register(s.id, tokens)
        s.owner = owner
        if self.retain:
            s.held = list(tokens)
        else:
            self.kv.free(s.id)  # its indexed blocks stay in the prefix cache
        s.kept = list(tokens)
        return len(tokens)

    def erase_slot(self, slot_id: int) -> int:
        """Forget what the idle slot holds; returns how many tokens that was (blocks other
        requests share stay in the prefix cache)."""
        s = self._idle_slot(slot_id)
        n = len(self._slot_tokens(s))
        self._clear(s)
        s.kept, s.last, s.owner = [], None, None
        return n

    def slot_owner(self, slot_id: int) -> tuple[str | None, bool]:
        """(whose the idle slot's tokens are, whether it holds any): a slot file's route keeps one
        caller from saving or erasing another's conversation."""
        s = self._idle_slot(slot_id)
        return s.owner, bool(self._slot_tokens(s))

    # --- introspection (any thread) ---------------------------------------------------------

    def _state(self, s: Slot, t: Task, phase: SlotPhase) -> SlotState:
        req = t.req
        params = req.params if req.params.n_probs == req.n_probs else req.params.replace(n_probs=req.n_probs)
        return SlotState(
            id=s.id, n_ctx=self.n_ctx, phase=phase, task_id=t.id, n_prompt=t.n_prompt,
            n_prompt_processed=max(min(t.n_past, t.n_prompt) - (t.n_cached or 0), 0),
            n_prompt_cached=t.n_cached or 0, n_decoded=t.n_gen,
            n_remain=req.max_tokens - t.n_gen if req.max_tokens is not None else -1,
            n_cache=self.kv.seq_len(s.id), params=params, max_tokens=req.max_tokens, stop=tuple(req.stop),
            cache_prompt=req.cache_prompt, caller=s.owner)

    def slot_states(self) -> list[SlotState]:
        out = []
        for s in self.slots:
            t = s.task
            if t is not None:
                out.append(self._state(s, t, SlotPhase.PROMPT if t.n_gen == 0 else SlotPhase.GENERATING))
            elif s.last is not None:
                out.append(self._state(s, s.last, SlotPhase.IDLE))
            else:
                out.append(SlotState(id=s.id, n_ctx=self.n_ctx, phase=SlotPhase.IDLE, n_cache=self.kv.seq_len(s.id),
                                     caller=s.owner))
        return out
