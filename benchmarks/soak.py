#!/usr/bin/env python3
"""A soak test of `bubo serve`: mixed clients at a steady rate for a long time, watching the
server's errors, memory (RSS), open file descriptors and /health latency over time.

Clients, started at a steady rate (--rate requests/s) and each a thread:
  streamed chat (read to the end), non-streamed chat, streamed /completion cancelled midway (the
  client closes the socket), a slow reader (reads its stream a chunk every 100 ms), a grammar
  request (JSON Schema), a /v1/messages request, a /tokenize; plus a /health probe every 0.5 s.

    python benchmarks/soak.py [-m smollm2:135m] [--minutes 30] [--rate 4] [-np 4] [-t 2]

Prints a row per minute (requests by outcome, 5xx, RSS MiB, fds, /health p99 ms) and a summary
whose last lines say whether RSS and fds stayed flat (the last minute against the second)."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from bubo import store


def start(model: str, parallel: int, threads: int, ctx: int) -> tuple[subprocess.Popen[str], str]:
    path = store.pull(model)
    p = subprocess.Popen([sys.executable, "-m", "bubo", "serve", "-m", str(path), "--port", "0", "-np",
                          str(parallel), "-t", str(threads), "-c", str(ctx)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
            threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()  # drain
            while True:
                try:
                    urllib.request.urlopen(url + "/ready", timeout=5).read()
                    return p, url
                except (urllib.error.URLError, OSError):
                    time.sleep(0.2)
    raise SystemExit("the server did not start")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Soak:
    def __init__(self, url: str):
        self.url = url
        self.lock = threading.Lock()
        self.outcomes: dict[str, int] = {}
        self.health: list[float] = []

    def note(self, what: str) -> None:
        with self.lock:
            self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def post(self, path: str, body: dict, stream_read=None) -> None:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                if stream_read is not None:
                    stream_read(r)
                else:
                    r.read()
                self.note(f"{path} {r.status}")
        except urllib.error.HTTPError as e:
            e.read()
            self.note(f"{path} {e.code}")
        except OSError as e:
            self.note(f"{path} {type(e).__name__}")

    # --- the clients ------------------------------------------------------------------------

    def chat(self, stream: bool) -> None:
        self.post("/v1/chat/completions", {"model": "bubo", "stream": stream, "max_tokens": random.randint(8, 96),
                                           "messages": [{"role": "user", "content": random.choice(QUESTIONS)}]},
                  (lambda r: [None for _ in r]) if stream else None)

    def cancelled(self) -> None:
        host, port = self.url.split("//")[1].split(":")
        body = json.dumps({"prompt": "Count: 1, 2, 3,", "n_predict": 400, "stream": True}).encode()
        try:
            s = socket.create_connection((host, int(port)), timeout=60)
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            s.recv(4096)
            time.sleep(random.uniform(0.05, 0.5))
            s.close()
            self.note("cancelled")
        except OSError as e:
            self.note(f"cancelled {type(e).__name__}")

    def slow_reader(self) -> None:
        def read(r):
            while r.read(64):
                time.sleep(0.1)
        self.post("/v1/chat/completions", {"model": "bubo", "stream": True, "max_tokens": 48,
                                           "messages": [{"role": "user", "content": "Tell me a story."}]}, read)

    def grammar(self) -> None:
        self.post("/v1/chat/completions", {"model": "bubo", "max_tokens": 64, "messages": [
            {"role": "user", "content": "Name a city and its country as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {
                "type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                 "country": {"type": "string", "maxLength": 30}},
                "required": ["city", "country"]}}}})

    def messages(self) -> None:
        self.post("/v1/messages", {"model": "bubo", "max_tokens": 32,
                                   "messages": [{"role": "user", "content": random.choice(QUESTIONS)}]})

    def tokenize(self) -> None:
        self.post("/tokenize", {"content": random.choice(QUESTIONS) * 20})

    def probe(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                urllib.request.urlopen(self.url + "/health", timeout=30).read()
                with self.lock:
                    self.health.append(time.monotonic() - t0)
            except OSError:
                self.note("/health failed")
            time.sleep(0.5)


QUESTIONS = ["What is the capital of France?", "Write a haiku about owls.", "Explain recursion briefly.",
             "List three rivers in Africa.", "Why is the sky blue?", "Say hi."]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=float, default=4.0, help="new client requests per second")
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=8192)
    args = ap.parse_args()
    proc, url = start(args.model, args.parallel, args.threads, args.ctx_size)
    soak = Soak(url)
    kinds = [lambda: soak.chat(True), lambda: soak.chat(False), soak.cancelled, soak.slow_reader, soak.grammar,
             soak.messages, soak.tokenize]
    stop = threading.Event()
    threading.Thread(target=soak.probe, args=(stop,), daemon=True).start()
    print(f"soak: {args.model}, -np {args.parallel}, -t {args.threads}, {args.rate:g} requests/s for "
          f"{args.minutes:g} min, pid {proc.pid}", flush=True)
    print("| minute | requests | 5xx | errors | RSS MiB | fds | /health p99 ms |\n"
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    rows = []
    t_end = time.monotonic() + args.minutes * 60
    next_row = time.monotonic() + 60
    minute = 0
    workers: list[threading.Thread] = []
    while time.monotonic() < t_end:
        w = threading.Thread(target=random.choice(kinds), daemon=True)
        w.start()
        workers.append(w)
        workers = [x for x in workers if x.is_alive()]
        time.sleep(random.expovariate(args.rate))
        if time.monotonic() >= next_row:
            minute += 1
            next_row += 60
            with soak.lock:
                out, soak.outcomes = soak.outcomes, {}
                health, soak.health = soak.health, []
            total = sum(out.values())
            e5 = sum(n for k, n in out.items() if re.search(r" 5\d\d$", k))
            errs = sum(n for k, n in out.items() if not re.search(r" [1-4]\d\d$", k) and k != "cancelled")
            p99 = statistics.quantiles(health, n=100)[98] * 1e3 if len(health) >= 2 else 0.0
            row = (minute, total, e5, errs, rss_mib(proc.pid), fds(proc.pid), p99)
            rows.append((row, out))
            print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} | {row[4]:.0f} | {row[5]} | {row[6]:.1f} |", flush=True)
    stop.set()
    for w in workers:
        w.join(120)
    proc.terminate()
    proc.wait(60)
    if len(rows) >= 2:
        first, last = rows[min(1, len(rows) - 1)][0], rows[-1][0]
        print(f"\nRSS {first[4]:.0f} -> {last[4]:.0f} MiB ({last[4] - first[4]:+.0f}), fds {first[5]} -> {last[5]}, "
              f"5xx {sum(r[0][2] for r in rows)}, other errors {sum(r[0][3] for r in rows)}, "
              f"requests {sum(r[0][1] for r in rows)}")
        kinds_seen: dict[str, int] = {}
        for _, out in rows:
            for k, n in out.items():
                kinds_seen[k] = kinds_seen.get(k, 0) + n
        print("outcomes: " + ", ".join(f"{k}: {n}" for k, n in sorted(kinds_seen.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
