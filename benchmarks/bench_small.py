#!/usr/bin/env python3
"""Small requests: bubo's server beside llama-server on the lightest routes, where the HTTP path
costs more than the engine. Both servers run the same GGUF with the same threads (-t), side by
side (started one after the other by this script and kept up together, each idle while the other
is asked: an idle server's threads sleep), and each load is sent to them in turn in bursts
(--bursts, the order alternating burst by burst and round by round), so that the machine's drift,
which moves a shared machine's speed by a third over minutes, hits both alike. Each figure is the
median over the rounds, and the ratio is also given per round (its two servers' bursts close in
time: the figure the drift moves least).

    python benchmarks/bench_small.py                 # 3 rounds of 2,000 requests per load
    python benchmarks/bench_small.py --rounds 5 --requests 4000 --save
    python benchmarks/bench_small.py --floor-only --rounds 5 --save   # in-process only (the two floors)

The loads, each from N client threads on keep-alive connections (as an SDK's connection pool):
- GET /health, 8 clients;
- POST /tokenize, one sentence, 8 clients;
- POST /completion, one sentence, n_predict 1, 4 clients (llama-server -np 4; bubo -np 4);
- POST /v1/embeddings, one input, 4 clients (both with --embedding on all-minilm:l6-v2).
Each reports requests per second (per burst, wall time from the moment every client is connected
and ready to the last answer; summed over the bursts) and the server process's CPU time per
request (its threads' time on a CPU, from /proc's schedstat), and for bubo the part outside its
engine's threads (named bubo-engine and bubo-pool): the HTTP path and the request's preparation,
and how often per request those threads went to sleep (waiting on the engine, or for the GIL).
The client threads run on the same machine and take CPU too, the same for both servers. The
sentences are bench_serve.sentence's varied prose (10-25 tokens), a different one per request of
a load. Each round also runs the completion's core steps in a process of their own, with no
HTTP server or Flask request (floor()): the part of its CPU outside the engine that no HTTP
path could remove; and what a sleep costs the event loop's thread on this machine (wake_costs()):
its CPU for a wait of a few milliseconds and for the same work right after it, which runs slower
than without the sleep. A request that waits on the engine sleeps the server's thread in this
way; a wait for the GIL, which the sleeps counted above also hold, is a shorter one.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_embed import DEFAULT_LLAMA_SERVER  # noqa: E402
from bench_serve import HOST, LABEL, Server, free_port, sentence  # noqa: E402
from results import cpu_name  # noqa: E402

LOADS = [  # (name, method, path, clients, server kind)
    ("health", "GET", "/health", 8, "gen"),
    ("tokenize", "POST", "/tokenize", 8, "gen"),
    ("completion", "POST", "/completion", 4, "gen"),
    ("embeddings", "POST", "/v1/embeddings", 4, "embed"),
]
TITLES = {"health": "GET /health, 8 clients", "tokenize": "POST /tokenize, 8 clients",
          "completion": "POST /completion n_predict 1, 4 clients",
          "embeddings": "POST /v1/embeddings 1 input, 4 clients"}


ENGINE_THREADS = ("bubo-engine", "bubo-pool")  # bubo's engine thread and its compute pool (bubo.cpus.name_thread)


def cpu_by_thread(pid: int) -> dict[str, tuple[float, bool, int]]:
    """Each live thread of a process: its CPU time so far (nanoseconds on a CPU, from schedstat:
    stat's 10 ms ticks are coarse beside a burst of light requests), whether it is outside
    bubo's engine (every thread but ENGINE_THREADS: the HTTP work, the preparation pool's), and
    how many times it has gone to sleep (status' voluntary context switches: any blocking
    wait, e.g. for the event loop's next event, for the GIL, an idle pool's next job)."""
    out: dict[str, tuple[float, bool, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                sleeps = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (OSError, ValueError, IndexError, StopIteration):
            continue  # the thread ended meanwhile
        out[tid] = (ns / 1e9, name not in ENGINE_THREADS, sleeps)
    return out


def cpu_between(before: dict[str, tuple[float, bool, int]],
                after: dict[str, tuple[float, bool, int]]) -> tuple[float, float, int]:
    """(all, outside the engine) CPU seconds that the threads alive at `after` spent since
    `before`, and how often the threads outside the engine went to sleep meanwhile (one started
    meanwhile, from zero; one that ended meanwhile is not counted)."""
    total = outside = 0.0
    sleeps = 0
    for tid, (seconds, is_outside, slept) in after.items():
        was = before.get(tid, (0.0, is_outside, 0))
        spent = seconds - was[0]
        total += spent
        if is_outside:
            outside += spent
            sleeps += slept - was[2]
    return total, outside, sleeps


def body_for(name: str, text: str) -> dict[str, Any] | None:
    if name == "tokenize":
        return {"content": text}
    if name == "completion":
        return {"prompt": text, "n_predict": 1, "temperature": 0}
    if name == "embeddings":
        return {"input": text}
    return None


def run_load(port: int, pid: int, name: str, method: str, path: str, n_clients: int, texts: list[str],
             n_requests: int, start: int = 0, warm: bool = True) -> tuple[int, float, float, float, int]:
    """(requests sent, seconds, server CPU seconds, of which outside bubo's engine, and the times
    the threads outside the engine went to sleep) for n_requests (rounded down to a whole number
    per client) spread over n_clients, on texts[start:]; after a warm-up of 20 requests on one
    connection, on the last 20 texts, with warm. The window opens once every client is connected
    and closes once every one has its last answer (its connection still open): the server's
    threads are read there, while no client runs (reading a server of many threads takes long
    enough that a short burst would be partly over meanwhile), and no connection's opening or
    closing falls inside it."""
    per = n_requests // n_clients
    errors: list[BaseException] = []
    window: list[Any] = []  # (the threads' CPU, the clock) as it opens, then as it closes

    def mark() -> None:  # a barrier's action: the last party runs it before any is let go
        window.append((cpu_by_thread(pid), time.perf_counter()))

    ready = threading.Barrier(n_clients + 1, action=mark, timeout=120)
    done = threading.Barrier(n_clients, action=mark, timeout=120)

    def client(k: int, count: int, stride: int, timed: bool) -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=120)
        try:
            conn.connect()
            if timed:
                ready.wait()
            for i in range(count):  # each request its own text (no two clients send the same prompt)
                body = body_for(name, texts[(start + i * stride + k) % len(texts)])
                conn.request(method, path, json.dumps(body) if body is not None else None,
                             {"Content-Type": "application/json"} if body is not None else {})
                resp = conn.getresponse()
                data = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{path}: {resp.status} {data[:200]!r}")
            if timed:
                done.wait()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            if timed:
                ready.abort()  # the others stop waiting for this one
                done.abort()
        finally:
            conn.close()

    if warm:
        client(len(texts) - 20 - start, 20, 1, False)  # on texts the load does not send
        if errors:
            raise errors[0]
    threads = [threading.Thread(target=client, args=(k, per, n_clients, True)) for k in range(n_clients)]
    for t in threads:
        t.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        pass  # a client failed: reported below
    except BaseException:
        ready.abort()  # reading the server's threads failed here: the clients stop waiting
        done.abort()
        raise
    for t in threads:
        t.join()
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    (c0, t0), (c1, t1) = window
    return (per * n_clients, t1 - t0, *cpu_between(c0, c1))


def figures(runs: list[tuple[int, float, float, float, int]]) -> tuple[float, float, float, float]:
    """(requests per second, CPU ms per request, of which outside the engine, sleeps outside the
    engine per request) over a load's bursts."""
    n, dt, cpu, outside, sleeps = (sum(x[i] for x in runs) for i in range(5))
    return n / dt, cpu / n * 1000, outside / n * 1000, sleeps / n


def floor(model: Path, threads: int, n_requests: int, texts: list[str]) -> float:
    """CPU ms per request of the core of the one-token completion's steps, with no HTTP server
    and no Flask request: in a process of its own (monkey-patched as the server's), 4 greenlets
    on one engine (-np 4) each read the request's fields, tokenize, check and submit (outside a
    request: no caller, receipt or log record), read the events (no disconnect watch) and write
    the answer's bytes (its werkzeug Response), with the route's functions; the main thread's CPU
    time over n_requests, after a warm-up on other prompts."""
    code = f"""
from gevent import monkey; monkey.patch_all()
import json, sys, time, gevent
from bubo.api import jsonout, pipeline
from bubo.api.llamacpp import completion as nc
from bubo.api.request import Body
from bubo.engine.engine import Engine
from bubo.engine.types import GenerationRequest
texts = json.loads(sys.stdin.read())
engine = Engine({str(model)!r}, n_ctx=4096, n_threads={threads}, n_parallel=4)
engine.start()
while not engine.ready:
    assert not engine.load_error, engine.load_error
    gevent.sleep(0.05)
rt = engine.runtime
def one(text):
    req = nc.parse_native_request(Body({{"prompt": text, "n_predict": 1, "temperature": 0}}))
    ids = pipeline.prompt_tokens(rt, req.prompt)
    stream = pipeline.submit(engine, GenerationRequest(ids, req.params, req.n_predict, req.stop, req.n_probs,
                                                       req.cache_prompt, req.ignore_eos))
    out = pipeline.Output()
    pipeline.gather(out, pipeline.run_events(stream, None))
    answer = nc.native_response(model="m", content=out.content, fin=out.finished, tokens=None, probs=None,
                                prompt_text=text, settings=nc.generation_settings(req, 4096))
    return jsonout.response(answer, small=True).get_data()
def client(k, todo):
    for text in todo[k::4]:
        one(text)
gevent.joinall([gevent.spawn(client, k, [f"Warm-up number {{i}}." for i in range(40)]) for k in range(4)])
t0 = time.thread_time()
gevent.joinall([gevent.spawn(client, k, texts[:{n_requests}]) for k in range(4)])
print(json.dumps((time.thread_time() - t0) / {n_requests} * 1000))
engine.stop()
"""
    run = subprocess.run([sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True,
                         timeout=600, check=True)
    return float(json.loads(run.stdout.strip().splitlines()[-1]))


WAKE_GAPS_MS = (0.0, 1.0, 3.0, 10.0)


def wake_costs(n: int) -> list[tuple[float, float, float]]:
    """What going idle costs the event loop's thread on this machine, per idle gap of
    WAKE_GAPS_MS: the CPU microseconds of a gevent.sleep of the gap (0: a yield to the loop,
    which does not sleep) and of the same small piece of work done right after it (a JSON round
    trip of an answer's size); n of each, in a process of its own (monkey-patched as the
    server's), after a warm-up. A request that waits on the engine leaves the server's main
    thread idle for about a batch's time (a few ms): this is the part of its CPU outside the
    engine that the waiting costs."""
    code = f"""
from gevent import monkey; monkey.patch_all()
import gevent, json, time
DATA = {{"object": "list", "model": "m", "data": [{{"object": "embedding", "index": 0, "embedding": [0.0123] * 64}}]}}
def work():
    json.loads(json.dumps(DATA))
for _ in range(2000):
    work()
out = []
for gap in {WAKE_GAPS_MS!r}:
    woke = did = 0.0
    for _ in range({n}):
        t0 = time.thread_time()
        gevent.sleep(gap / 1000)
        t1 = time.thread_time()
        work()
        t2 = time.thread_time()
        woke += t1 - t0
        did += t2 - t1
    out.append((gap, woke / {n} * 1e6, did / {n} * 1e6))
print(json.dumps(out))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    return [tuple(x) for x in json.loads(run.stdout.strip().splitlines()[-1])]


def command(who: str, kind: str, args: argparse.Namespace, model: Path, port: int) -> list[str]:
    common = ["-m", str(model), "--host", HOST, "--port", str(port), "-t", str(args.threads)]
    if kind == "embed":
        common.append("--embedding")
        extra = ["-np", "4", "-c", "2048", "-b", "2048", "-ub", "2048"] if who == "llama" else []
    else:
        extra = ["-np", "4", "-c", "4096"]
    if who == "bubo":
        return [sys.executable, "-m", "bubo", "serve", *common, *(extra if kind == "gen" else [])]
    return [args.llama_server, *common, *extra]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    ap.add_argument("--model", default="smollm2:135m", help="the generating model (catalog name or GGUF path)")
    ap.add_argument("--embed-model", default="all-minilm:l6-v2")
    ap.add_argument("--llama-server", default=DEFAULT_LLAMA_SERVER)
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--requests", type=int, default=2000, help="requests per load and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bursts", type=int, default=4,
                    help="per load and round, its requests go to the two servers in this many bursts each, in turn")
    ap.add_argument("--only", action="append", choices=[n for n, *_ in LOADS], help="these loads only")
    ap.add_argument("--floor-only", action="store_true",
                    help="only what runs in-process: the completion's core steps and the event loop's sleeps (no "
                         "servers, no llama-server)")
    args = ap.parse_args(argv)
    most_clients = max(n for _, _, _, n, _ in LOADS)
    if args.bursts < 1 or args.requests // args.bursts < most_clients:
        ap.error(f"--requests / --bursts must leave at least {most_clients} requests a burst (one per client)")

    from bubo import store

    models = {"gen": store.resolve(args.model), "embed": store.resolve(args.embed_model)}
    rng = random.Random(11)
    texts = [sentence(rng) for _ in range(args.requests + 20)]
    loads = [x for x in LOADS if not args.only or x[0] in args.only]
    wakes: list[list[tuple[float, float, float]]] = []
    floors: list[float] = []
    if args.floor_only:
        for _ in range(args.rounds):
            floors.append(floor(models["gen"], args.threads, args.requests, texts))
            wakes.append(wake_costs(WAKE_N))
        print_floor(floors, args, models)
        print_wakes(wakes)
        return 0
    got: dict[str, dict[str, list[tuple[float, float, float, float]]]] = {w: {n: [] for n, *_ in loads}
                                                                          for w in ("bubo", "llama")}
    per_burst = args.requests // args.bursts  # at least most_clients
    for r in range(args.rounds):
        wakes.append(wake_costs(WAKE_N))
        if any(x[0] == "completion" for x in loads):
            floors.append(floor(models["gen"], args.threads, args.requests, texts))
            print(f"round {r + 1} the completion's own steps in-process: {floors[-1]:.3f} ms CPU/request",
                  file=sys.stderr)
        for kind in ("gen", "embed"):
            mine = [x for x in loads if x[4] == kind]
            if not mine:
                continue
            ports = {"bubo": free_port(), "llama": free_port()}
            while ports["llama"] == ports["bubo"]:  # a readiness check must not reach the other server
                ports["llama"] = free_port()
            with contextlib.ExitStack() as stack:
                pids = {}
                for who in ("bubo", "llama"):  # one at a time: each loads its model alone
                    srv = stack.enter_context(Server(who, command(who, kind, args, models[kind], ports[who]),
                                                     ports[who]))
                    assert srv.proc is not None
                    pids[who] = srv.proc.pid
                for name, method, path, n_clients, _ in mine:
                    runs: dict[str, list[tuple[int, float, float, float, int]]] = {"bubo": [], "llama": []}
                    for b in range(args.bursts):
                        for who in (("bubo", "llama") if (r + b) % 2 == 0 else ("llama", "bubo")):
                            runs[who].append(run_load(ports[who], pids[who], name, method, path, n_clients, texts,
                                                      per_burst, start=b * per_burst, warm=b == 0))
                    for who in ("bubo", "llama"):
                        rps, ms, outside, sleeps = figures(runs[who])
                        got[who][name].append((rps, ms, outside, sleeps))
                        part = f" ({outside:.3f} outside the engine's threads, {sleeps:.2f} sleeps)" if who == "bubo" \
                            else ""
                        print(f"round {r + 1} {LABEL[who]} {name}: {rps:.0f}/s, {ms:.3f} ms CPU/request{part}",
                              file=sys.stderr)
    print("\n### the lightest routes, bubo against llama-server")
    print(f"\nSmall requests, {args.requests} per load in {args.bursts} bursts a server (each a whole number per "
          f"client), -t {args.threads}, median of {args.rounds} rounds, on "
          f"{cpu_name()}; models {models['gen'].name} and {models['embed'].name}\n")
    print("| load | bubo req/s | llama-server req/s | bubo / llama-server | the same per round: median (range) | "
          "bubo CPU ms/req | of which outside the engine | bubo's sleeps/req outside the engine | "
          "llama-server CPU ms/req |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, *_ in loads:
        b_rps, l_rps = (statistics.median(x[0] for x in got[w][name]) for w in ("bubo", "llama"))
        b_ms, l_ms = (statistics.median(x[1] for x in got[w][name]) for w in ("bubo", "llama"))
        b_out = statistics.median(x[2] for x in got["bubo"][name])
        b_sleeps = statistics.median(x[3] for x in got["bubo"][name])
        # a round's two servers take the load in alternating bursts close in time: their ratio
        # within a round is the least moved by the machine's drift
        paired = [b[0] / max(lm[0], 1e-9) for b, lm in zip(got["bubo"][name], got["llama"][name])]
        print(f"| {TITLES[name]} | {b_rps:.0f} | {l_rps:.0f} | {b_rps / l_rps:.2f}x | "
              f"{statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f}) | {b_ms:.3f} | {b_out:.3f} | "
              f"{b_sleeps:.2f} | {l_ms:.3f} |")
    if floors:
        print_floor(floors, args, models)
    print_wakes(wakes)
    return 0


def print_floor(floors: list[float], args: argparse.Namespace, models: dict[str, Path]) -> None:
    print("\n### a one-token completion's core steps, without HTTP")
    print(f"\nThe core of POST /completion's steps (n_predict 1) without an HTTP server or a Flask request: its "
          f"fields read, its prompt tokenized, checked and submitted, its events read and its answer's bytes "
          f"written, by the route's functions (no caller, receipt, log record or disconnect watch); 4 greenlets "
          f"on one engine with -np 4 and -t {args.threads}, in one process; {args.requests} requests a round, "
          f"median of {len(floors)} rounds, on {cpu_name()}; model {models['gen'].name}\n")
    print("| steps | CPU ms/req, the main thread | rounds' range |")
    print("|---|---:|---:|")
    print(f"| the completion's core, in-process | {statistics.median(floors):.3f} | "
          f"{min(floors):.3f}-{max(floors):.3f} |")


WAKE_N = 300  # waits of each gap per round (10 ms gaps: 3 s)


def print_wakes(wakes: list[list[tuple[float, float, float]]]) -> None:
    print("\n### the event loop's thread after an idle gap")
    print(f"\nA gevent.sleep of each gap (0: a yield to the event loop, no sleep), then the same small piece of work "
          f"(a JSON round trip of an answer's size), in a process of its own: the thread's CPU microseconds for "
          f"the wait and for the work right after it; {WAKE_N} of each a round, median of {len(wakes)} rounds, on "
          f"{cpu_name()}. A sleep costs about the wait, plus what the work takes beyond its 0 ms figure. The "
          f"server's thread sleeps in this way when a request waits on the engine (the sleeps column of the "
          f"lightest routes' table counts these, and the shorter waits for the GIL).\n")
    print("| idle gap | CPU µs, the wait | CPU µs, the work after it |")
    print("|---|---:|---:|")
    for i, gap in enumerate(WAKE_GAPS_MS):
        woke = statistics.median(w[i][1] for w in wakes)
        did = statistics.median(w[i][2] for w in wakes)
        label = f"{gap:g} ms" if gap else "0 ms (a yield to the loop, no sleep)"
        print(f"| {label} | {woke:.1f} | {did:.1f} |")


if __name__ == "__main__":
    import results

    with results.saving("bench_small", "--save" in sys.argv[1:]):
        code = main()
    raise SystemExit(code)
