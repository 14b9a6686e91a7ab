#!/usr/bin/env python3
"""bubo on Ray Serve: what replicas add, and what prefix-aware routing buys.

    python benchmarks/bench_ray.py                       # smollm2:135m, 8 clients, 2 rounds
    python benchmarks/bench_ray.py --clients 4 --n-predict 64 --rounds 1

A local Ray cluster of two simulated nodes of one CPU each (ray.cluster_utils.Cluster; on a
2-core machine, each node is one core), then, one at a time, started and stopped by this script:

1. Throughput: --clients threads each stream one POST /completion (greedy, n_predict tokens,
   ignore_eos, its own prompt), released together; aggregate generated tokens/s = all answers'
   tokens over the wall time. Served by: `bubo serve -t 1` and `-t 2` (no Ray: the baseline),
   and `bubo ray-serve` with 1 replica of 1 thread and with 2 replicas of 1 thread, one per node.
   The servers alternate round by round; each figure is the median over the rounds. Also the
   time to first token of one short request alone (p50 of 20), direct and through Ray's proxy,
   ingress and router: the hop's cost.
2. Routing: 40 requests of 4 conversations, each with its own system prompt of about 420 tokens,
   interleaved (0, 1, 2, 3, 0, ...), one at a time, on 2 replicas whose cache (-c 1024) holds
   two conversations and not three: prompt tokens reused from the cache (usage) and the median
   time to first token, with bubo's prefix-aware router and with Ray Serve's default (power of
   two choices).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from bench_serve import (
    Server,
    chat,
    client_prompt,
    completion,
    concurrent_completions,
    free_port,
    throughput_summary,
)
from results import cpu_name

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOPICS = ["a lighthouse keeper", "a spice merchant", "a glacier survey team", "a violin workshop"]


def server(kind: str, address: str, model: Path, port: int, ctx: int, extra: list[str]) -> Server:
    """`bubo serve -t N` (kind serve-tN) or `bubo ray-serve` with R replicas of 1 thread (rayRx1), ready
    when its /health and /ready answer 200 (through Ray's proxy: once the replicas are up)."""
    serve = ["-m", str(model), "--served-model-name", "bench", "-c", str(ctx), *extra]
    if kind.startswith("serve"):
        threads = kind.split("-t")[1]
        return Server("bubo", [sys.executable, "-m", "bubo", "serve", *serve, "-t", threads, "--port", str(port)],
                      port)
    replicas = kind.split("x")[0].split("ray")[1]
    # stopping takes the application off the cluster: give it the time
    return Server("bubo", [sys.executable, "-m", "bubo", "ray-serve", "--address", address, "--port", str(port),
                           "--replicas", replicas, "-t", "1", "--one-per-node", *serve], port, stop_timeout_s=90.0)


def throughput(port: int, clients: int, n_predict: int, seed: int) -> dict[str, float]:
    completion(port, "Warm up.", 4)
    prompts = [client_prompt(seed * 1000 + c) for c in range(clients)]
    return throughput_summary(concurrent_completions(port, prompts, n_predict), n_predict)


def hop_ttft(port: int) -> float:
    return statistics.median(completion(port, "Say hi.", 1).ttft for _ in range(20)) * 1e3


def system(i: int) -> str:
    rnd = random.Random(i)
    words = ("the of and a to in is was for on that with as by at from his her it an were are which this "
             "be or had not but lamp tide ledger harbour").split()
    return f"You are the archivist of {TOPICS[i]}. " + " ".join(rnd.choice(words) for _ in range(400))


def conversations(port: int) -> dict[str, Any]:
    res = [chat(port, "bench", system(i), f"Question {j}: what happened on day {j * 7 + i}?", 2)
           for j in range(10) for i in range(4)]
    return {"prompt": sum(r.prompt_tokens or 0 for r in res), "cached": sum(r.cached_tokens or 0 for r in res),
            "ttft_ms": statistics.median(r.ttft for r in res) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    from ray.cluster_utils import Cluster

    from bubo import store

    model = store.pull(args.model)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        kinds = ["serve-t1", "serve-t2", "ray1x1", "ray2x1"]
        tps: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
        hop: dict[str, float] = {}
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                port = free_port()
                with server(kind, cluster.address, model, port, 4096, ["-np", str(min(args.clients, 8))]):
                    tps[kind].append(throughput(port, args.clients, args.n_predict, r))
                    if r == 0 and kind in ("serve-t1", "ray1x1"):
                        hop[kind] = hop_ttft(port)
                print(f"round {r + 1} {kind}: {tps[kind][-1]['tps']:.1f} tokens/s", file=sys.stderr, flush=True)
        routing = {}
        for router in ("prefix", "pow2"):
            port = free_port()
            flags = ["--router", router, "--app-name", f"b-{router}"]
            with server("ray2x1", cluster.address, model, port, 1024, flags):
                routing[router] = conversations(port)
    finally:
        cluster.shutdown()

    med = {k: statistics.median(x["tps"] for x in v) for k, v in tps.items()}
    names = {"serve-t1": "bubo serve -t 1 (no Ray)", "serve-t2": "bubo serve -t 2 (no Ray)",
             "ray1x1": "ray-serve, 1 replica x 1 thread", "ray2x1": "ray-serve, 2 replicas x 1 thread"}
    print(f"\n{cpu_name()}; {args.model}; {args.clients} clients x {args.n_predict} tokens; median of "
          f"{args.rounds} rounds\n")
    print("| served by | tokens/s | vs bubo serve -t 1 |\n| --- | ---: | ---: |")
    for k in kinds:
        print(f"| {names[k]} | {med[k]:.1f} | {med[k] / med['serve-t1']:.2f}x |")
    print(f"\ntime to first token of a 1-token answer alone (p50 of 20): direct {hop['serve-t1']:.1f} ms, "
          f"through Ray {hop['ray1x1']:.1f} ms (+{hop['ray1x1'] - hop['serve-t1']:.1f} ms)\n")
    print("| routing (2 replicas, 40 requests, 4 conversations) | prompt tokens | cached | share | median TTFT |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for router, name in (("prefix", "prefix-aware (bubo)"), ("pow2", "power of two choices (Ray's default)")):
        x = routing[router]
        print(f"| {name} | {x['prompt']} | {x['cached']} | {x['cached'] / x['prompt']:.0%} | {x['ttft_ms']:.0f} ms |")
    a, b = routing["prefix"], routing["pow2"]
    print(f"\nprefix-aware: {a['cached'] / max(b['cached'], 1):.2f}x the cached tokens, median TTFT "
          f"{b['ttft_ms'] / a['ttft_ms']:.2f}x lower")
    return 0


if __name__ == "__main__":
    import results

    with results.saving("bench_ray", "--save" in sys.argv[1:]):
        code = main()
    raise SystemExit(code)
