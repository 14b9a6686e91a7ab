"""The pieces of bubo ray-serve that need no cluster: a request's prefix key, the router's choices
(on stand-in replicas), the errors the ingress makes itself, and the command's refusals (bad
flags; Ray not installed)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from bubo.api.errors import ApiError
from bubo.rayserve.forward import Forward, end_to_end, error_body, replica_lost, stream_error_bytes
from bubo.rayserve.prefix import BLOCK_BYTES, block_hashes, prefix_key, routing_parts

SYSTEM = "You are a careful archivist. " * 40


def chat(*turns: str, system: str = SYSTEM, model: str = "m") -> bytes:
    msgs = [{"role": "system", "content": system}]
    msgs += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return json.dumps({"model": model, "messages": msgs, "max_tokens": 8}).encode()


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_a_conversation_shares_its_leading_blocks_and_a_new_one_shares_none():
    k1 = prefix_key("/v1/chat/completions", chat("What is a ledger?"))
    k2 = prefix_key("/v1/chat/completions", chat("What is a ledger?", "A book of accounts.", "Who keeps it?"))
    other = prefix_key("/v1/chat/completions", chat("What is a ledger?", system="You are a pirate. " * 60))
    assert len(k1) >= 4 and len(k2) > len(k1)
    # the system prompt's blocks agree; the first turn's last partial block need not
    assert shared(k1, k2) >= len(SYSTEM) // BLOCK_BYTES
    assert shared(k1, other) == 0
    # another model is another cache
    assert shared(k1, prefix_key("/v1/chat/completions", chat("What is a ledger?", model="n"))) == 0


def test_every_dialect_routes_by_its_prompt_fields():
    long = "x" * (BLOCK_BYTES * 3)
    bodies = {
        "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": long}]},
        "/v1/messages": {"model": "m", "system": long, "messages": [], "max_tokens": 1},
        "/v1/responses": {"model": "m", "instructions": long, "input": "hi"},
        "/api/chat": {"model": "m", "messages": [{"role": "user", "content": long}]},
        "/v1/completions": {"model": "m", "prompt": long},
        "/completion": {"prompt": long},
        "/api/generate": {"model": "m", "prompt": long},
    }
    for path, body in bodies.items():
        assert len(prefix_key(path, json.dumps(body).encode())) >= 2, path
    # a batch of prompts routes by its first; token ids count as a prompt too
    assert routing_parts("/v1/completions", {"prompt": ["a", "b"]}) == ["a"]
    assert routing_parts("/completion", {"prompt": [1, 2, 3]}) == [[1, 2, 3]]
    # nothing to route by: no key (least loaded)
    for raw, ctype in ((b"", "application/json"), (b"{not json", "application/json"), (b"[1,2]", "application/json"),
                       (json.dumps({"prompt": long}).encode(), "text/plain"), (b"[" * 100_000, "application/json")):
        assert prefix_key("/v1/completions", raw, ctype) == ()


def test_block_hashes_chain_and_stop_at_full_blocks():
    data = bytes(range(256)) * 5
    h = block_hashes(data, 256)
    assert len(h) == 5 and len(set(h)) == 5
    assert block_hashes(data[:256 * 3 + 10], 256) == h[:3]
    changed = bytearray(data)
    changed[300] ^= 1
    h2 = block_hashes(bytes(changed), 256)
    assert h2[0] == h[0] and all(a != b for a, b in zip(h[1:], h2[1:]))
    assert len(block_hashes(data * 100, 256, max_blocks=7)) == 7


# --- the router, on stand-ins ------------------------------------------------------------------

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'bubo[ray]'")


@dataclass(frozen=True)
class _Id:
    unique_id: str


@dataclass
class _Replica:
    replica_id: _Id
    max_ongoing_requests: int = 32


@dataclass
class _Meta:
    internal_request_id: str


@dataclass
class _Pending:
    args: list
    metadata: _Meta
    kwargs: dict = field(default_factory=dict)


class _QueueLens:
    def __init__(self) -> None:
        self.lens: dict[_Id, int] = {}

    def get(self, rid: _Id) -> int | None:
        return self.lens.get(rid)


def _router(busy: int = 4):
    from bubo.rayserve.router import PrefixAwareRouter

    r = PrefixAwareRouter.__new__(PrefixAwareRouter)  # no Serve controller here: only the policy
    r._replica_queue_len_cache = _QueueLens()
    r._replicas, r._replicas_list, r._replica_id_set, r._queue_len_gauge_last_update = {}, [], set(), {}
    r.initialize_state(busy_threshold=busy)
    return r


def _req(n: int, body: bytes) -> _Pending:
    return _Pending([Forward("POST", "/v1/chat/completions", "", (), body,
                             prefix_key("/v1/chat/completions", body))], _Meta(f"req-{n}"))


def _route(router, replicas, pending) -> _Replica:
    ranks = asyncio.run(router.choose_replicas(replicas, pending))
    chosen = ranks[0][0]
    router.on_request_routed(pending, chosen.replica_id, None)
    return chosen


def test_the_router_keeps_each_conversation_on_one_replica_and_spreads_new_ones():
    router = _router()
    a, b = _Replica(_Id("a")), _Replica(_Id("b"))
    systems = [f"System prompt number {i}. " * 30 for i in range(4)]
    homes: dict[int, set[str]] = {i: set() for i in range(4)}
    n = 0
    for turn in range(5):
        for i in range(4):
            n += 1
            pending = _req(n, chat(f"question {turn}", system=systems[i]))
            chosen = _route(router, [a, b], pending)
            homes[i].add(chosen.replica_id.unique_id)
            router.on_request_completed(chosen.replica_id, f"req-{n}")
    assert all(len(h) == 1 for h in homes.values()), homes
    # four new conversations, one at a time: two to each cache
    assert sorted(h for hs in homes.values() for h in hs) == ["a", "a", "b", "b"]
    assert router.inflight == {a.replica_id: 0, b.replica_id: 0}


def test_a_busy_home_replica_sends_the_request_to_the_least_loaded():
    router = _router(busy=2)
    a, b = _Replica(_Id("a")), _Replica(_Id("b"))
    body = chat("hello", system="A long shared system prompt. " * 30)
    home = _route(router, [a, b], _req(1, body))
    other = b if home is a else a
    assert _route(router, [a, b], _req(2, body)) is home  # 1 under way: below the threshold
    assert _route(router, [a, b], _req(3, body)) is other  # 2 under way: busy
    # a request with no prefix goes where least is under way
    assert _route(router, [a, b], _Pending([Forward("GET", "/v1/models", "", (), b"")], _Meta("req-4"))) is other
    # a replica that died takes its picture of the cache with it
    assert router.match(home.replica_id, prefix_key("/v1/chat/completions", body)) > 0
    router.on_replica_actor_died(home.replica_id)
    assert router.match(home.replica_id, prefix_key("/v1/chat/completions", body)) == 0
    assert home.replica_id not in router.inflight


def test_concurrent_choices_count_each_other_before_ray_sends():
    router = _router()
    a, b = _Replica(_Id("a")), _Replica(_Id("b"))
    firsts = []
    for n in range(4):  # four new conversations chosen before any is routed
        body = chat("q", system=f"Conversation {n} has its own long system prompt. " * 20)
        ranks = asyncio.run(router.choose_replicas([a, b], _req(n, body)))
        firsts.append(ranks[0][0].replica_id.unique_id)
    assert sorted(firsts) == ["a", "a", "b", "b"]


# --- the errors the ingress makes ----------------------------------------------------------------


def test_the_ingress_errors_have_each_dialects_shape():
    err = replica_lost("ActorDiedError")
    assert err.status == 503 and err.headers == {"Retry-After": "2"}
    openai = json.loads(error_body("/v1/chat/completions", err))
    assert openai["error"]["code"] == "replica_lost" and "send the request again" in openai["error"]["message"]
    anthropic = json.loads(error_body("/v1/messages", err))
    assert anthropic["type"] == "error" and anthropic["error"]["type"] == "overloaded_error"
    assert json.loads(error_body("/api/chat", err)) == {"error": err.message}
    # in-band, where a stream's 200 had gone out
    sse = stream_error_bytes("/v1/chat/completions", "text/event-stream", err).decode()
    assert sse.startswith("data: ") and json.loads(sse[6:])["error"]["code"] == "replica_lost"
    anth = stream_error_bytes("/v1/messages", "text/event-stream", err).decode()
    assert anth.startswith("event: error\ndata: ")
    resp = stream_error_bytes("/v1/responses", "text/event-stream", err).decode()
    assert json.loads(resp.split("data: ", 1)[1])["code"] == "replica_lost"
    line = stream_error_bytes("/api/generate", "application/x-ndjson", err)
    assert line.endswith(b"\n") and json.loads(line) == {"error": err.message}
    assert isinstance(err, ApiError)
    hop = end_to_end([("Content-Type", "application/json"), ("Connection", "close"), ("Date", "x"),
                      ("Transfer-Encoding", "chunked"), ("Retry-After", "1")])
    assert hop == (("Content-Type", "application/json"), ("Retry-After", "1"))


# --- the command's refusals ----------------------------------------------------------------------


def _cli(*args: str, block_ray: bool = False) -> subprocess.CompletedProcess:
    code = ("import sys\n" + ("sys.modules['ray'] = None\n" if block_ray else "") +
            "from bubo.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_ray_serve_without_ray_says_how_to_install_it():
    p = _cli("ray-serve", "-m", "smollm2:135m", "--replicas", "2", block_ray=True)
    assert p.returncode == 1 and "pip install 'bubo[ray]'" in p.stderr, p.stderr


@pytest.mark.parametrize("args,says", [
    (["--replicas", "0"], "--replicas 0: give at least 1"),
    (["-t", "0"], "-t 0: give at least 1"),
    (["--min-replicas", "2"], "--min-replicas needs --max-replicas"),
    (["--min-replicas", "3", "--max-replicas", "2"], "--min-replicas 3 is more than --max-replicas 2"),
    (["--port", "70000"], "--port 70000: give 1..65535"),
    (["--router", "random"], "invalid choice: 'random'"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["-c", "many"], "argument -c/--ctx-size: invalid int value: 'many'"),  # serve's flags, checked here
])
def test_bad_flags_are_refused_before_any_cluster_starts(args, says):
    p = _cli("ray-serve", "-m", "smollm2:135m", *args, block_ray=True)
    assert p.returncode in (1, 2) and says in p.stderr, p.stderr
    assert "pip install" not in p.stderr  # refused before Ray was needed


def test_serve_already_running_elsewhere_or_another_application_at_the_prefix_is_a_clear_error(monkeypatch):
    """Against the Serve instance a cluster already runs (its client: the proxy's address and the
    applications' route prefixes), before anything is deployed."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'bubo[ray]'")
    import argparse
    import types

    from ray.serve import context

    from bubo.cli.ray_serve import _check_serve
    from bubo.rayserve import Options

    apps = {"bubo": {"route_prefix": "/"}, "docs": {"route_prefix": "/docs"}}
    client = types.SimpleNamespace(http_config=types.SimpleNamespace(host="127.0.0.1", port=8000),
                                   get_serve_details=lambda: {"applications": apps})
    monkeypatch.setattr(context, "_get_global_client", lambda: client)
    here = argparse.Namespace(host="127.0.0.1", port=8000)
    _check_serve(here, Options(serve_argv=[], name="bubo"))  # the same name: replaced, as Serve does
    _check_serve(here, Options(serve_argv=[], name="bubo-2", route_prefix="/two"))
    with pytest.raises(ValueError, match=r"^the application 'bubo' already serves / on this cluster's Ray Serve: "
                                         r"give --app-name bubo to replace it, or stop the ray-serve that runs it"):
        _check_serve(here, Options(serve_argv=[], name="bubo-2"))
    with pytest.raises(ValueError, match="HTTP proxy on 127.0.0.1:8000; stop it first"):
        _check_serve(argparse.Namespace(host="127.0.0.1", port=9000), Options(serve_argv=[], name="bubo"))


# --- what is deployed --------------------------------------------------------------------------


def _replica_deployment(app):
    ingress = app._bound_deployment
    assert ingress.name == "BuboIngress" and ingress.ray_actor_options == {"num_cpus": 0}
    return ingress.init_args[0]._bound_deployment


def test_the_application_carries_the_flags():
    from bubo.rayserve import Options, build_app

    rep = _replica_deployment(build_app(Options(serve_argv=["-m", "smollm2:135m", "-c", "2048"], replicas=3,
                                                threads=2, one_per_node=True, busy_threshold=6)))
    cfg = rep._deployment_config
    assert rep.name == "BuboReplica" and rep.ray_actor_options == {"num_cpus": 2}
    assert cfg.num_replicas == 3 and cfg.autoscaling_config is None
    assert rep._replica_config.max_replicas_per_node == 1
    assert cfg.request_router_config.request_router_class.endswith("router.PrefixAwareRouter")
    assert cfg.request_router_config.request_router_kwargs == {"busy_threshold": 6}
    assert rep.init_args == (["-m", "smollm2:135m", "-c", "2048"], 2, 600.0)
    assert cfg.health_check_period_s <= 2

    # autoscaling on requests under way, and Ray's own router
    rep = _replica_deployment(build_app(Options(replicas=1, min_replicas=2, max_replicas=5,
                                                target_ongoing_requests=3, router="pow2")))
    auto = rep._deployment_config.autoscaling_config
    assert (auto.min_replicas, auto.initial_replicas, auto.max_replicas, auto.target_ongoing_requests) == (2, 2, 5, 3)
    assert "PrefixAware" not in str(rep._deployment_config.request_router_config.request_router_class)


def test_a_replicas_key_comes_from_the_command_line_or_its_own_node(monkeypatch, tmp_path):
    """The replicas' health checks use their server's first key as that server finds it: the
    command line's --api-key / --api-key-file (the driver passes only those), else the variables
    of the replica's own node; the driver's environment stays on the driver."""
    from bubo.cli.ray_serve import _key_flags
    from bubo.rayserve.app import _first_key

    monkeypatch.delenv("BUBO_ARG_API_KEY", raising=False)
    monkeypatch.delenv("BUBO_ARG_API_KEY_FILE", raising=False)
    assert _key_flags(["-m", "x", "--api-key", "k1, k2", "-c", "512"]) == (["k1", "k2"], None)
    monkeypatch.setenv("BUBO_ARG_API_KEY", "driver")
    assert _key_flags(["-m", "x"]) == ([], None)
    monkeypatch.setenv("BUBO_ARG_API_KEY", "node")  # now as the replica's node sees it
    assert _first_key([], None) == "node" and _first_key(["k1"], None) == "k1"
    keys = tmp_path / "keys"
    keys.write_text("# the keys\nfromfile\n")
    monkeypatch.delenv("BUBO_ARG_API_KEY")
    monkeypatch.setenv("BUBO_ARG_API_KEY_FILE", str(keys))
    assert _first_key([], None) == "fromfile" and _first_key([], str(keys)) == "fromfile"
    monkeypatch.delenv("BUBO_ARG_API_KEY_FILE")
    assert _first_key([], None) is None
