#!/usr/bin/env python3
"""A soak test of `bubo serve`: normal and hostile clients mixed at a steady rate for a long
time, watching the normal clients' errors, the server's memory (RSS), open file descriptors and
/health latency over time.

Clients, started at a steady rate (--rate requests/s) and each a thread. Normal (each must get its
answer): streamed chat (read to the end), non-streamed chat, streamed /completion cancelled midway
(the client closes the socket), a slow reader (reads its stream a chunk every 100 ms), a grammar
request (JSON Schema), a /v1/messages request, a /tokenize. Hostile (--hostile, the share of them;
each is answered with its 4xx, or cut off): a schema that used to expand exponentially, a
logit_bias that bans every token, 100,000 stop strings,
a rebound Host name, a client that pipelines requests and never reads, a stream nobody reads,
a 16 MB /tokenize. Plus a /health probe every 0.25 s.

    python benchmarks/soak.py [-m smollm2:135m] [--minutes 30] [--rate 4] [--hostile 0.3] [-np 4] [-t 2]

Prints a row per minute (normal requests, their errors, hostile requests, RSS MiB, fds, /health
p99 and max ms) and a summary: RSS and fds from the second minute to the last, the normal
clients' errors (0 is the goal) and every outcome by kind."""

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
                          str(parallel), "-t", str(threads), "-c", str(ctx), "--write-timeout", "5"],
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
        host, port = url.split("//")[1].split(":")
        self.addr = (host, int(port))

    def note(self, what: str) -> None:
        with self.lock:
            self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def post(self, path: str, body: dict, stream_read=None, kind: str = "", headers: dict | None = None) -> None:
        """kind: "hostile " for a hostile client's request (its outcome is not a normal error)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                if stream_read is not None:
                    stream_read(r)
                else:
                    r.read()
                self.note(f"{kind}{path} {r.status}")
        except urllib.error.HTTPError as e:
            e.read()
            self.note(f"{kind}{path} {e.code}")
        except OSError as e:
            self.note(f"{kind}{path} {type(e).__name__}")

    # --- the clients ------------------------------------------------------------------------

    def chat(self, stream: bool) -> None:
        self.post("/v1/chat/completions", {"model": "bubo", "stream": stream, "max_tokens": random.randint(8, 96),
                                           "messages": [{"role": "user", "content": random.choice(QUESTIONS)}]},
                  (lambda r: [None for _ in r]) if stream else None)

    def cancelled(self) -> None:
        body = json.dumps({"prompt": "Count: 1, 2, 3,", "n_predict": 400, "stream": True}).encode()
        try:
            s = socket.create_connection(self.addr, timeout=60)
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
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

    # --- the hostile clients (each answered with its 4xx, or cut off: never an error of the normal ones) --

    def costly_schema(self) -> None:
        defs: dict = {"d0": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 8}},
                             "required": ["a"]}}
        for i in range(1, 41):
            defs[f"d{i}"] = {"allOf": [{"$ref": f"#/$defs/d{i - 1}"}, {"$ref": f"#/$defs/d{i - 1}"}]}
        self.post("/v1/chat/completions", {"model": "bubo", "max_tokens": 8, "messages": [
            {"role": "user", "content": "Hi"}], "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"$defs": defs, "$ref": "#/$defs/d40"}}}}, kind="hostile ")

    def banned_everything(self) -> None:
        self.post("/completion", {"prompt": "x", "n_predict": 4, "logit_bias": [[t, False] for t in range(49152)]},
                  kind="hostile ")

    def many_stops(self) -> None:
        self.post("/v1/chat/completions", {"model": "bubo", "max_tokens": 8, "stop": [f"s{i}" for i in range(100_000)],
                                           "messages": [{"role": "user", "content": "Hi"}]}, kind="hostile ")

    def rebound_host(self) -> None:
        self.post("/v1/chat/completions", {"model": "bubo", "max_tokens": 4, "messages": [
            {"role": "user", "content": "Hi"}]}, kind="hostile ", headers={"Host": "attacker.example:8080"})

    def _hold(self, data: bytes, what: str) -> None:
        try:
            s = socket.create_connection(self.addr, timeout=60)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(data)
            time.sleep(10)  # never reads
            s.close()
            self.note(f"hostile {what}")
        except OSError as e:
            self.note(f"hostile {what} {type(e).__name__}")

    def pipelined_non_reader(self) -> None:
        self._hold(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 50, "pipelined, never read")

    def unread_stream(self) -> None:
        body = json.dumps({"prompt": "Once upon a time", "n_predict": 2000, "n_probs": 100, "stream": True,
                           "ignore_eos": True}).encode()
        self._hold(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body) +
                   body, "stream never read")

    def huge_tokenize(self) -> None:
        self.post("/tokenize", {"content": "hello world, " * 1_250_000}, kind="hostile ")

    def probe(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                urllib.request.urlopen(self.url + "/health", timeout=30).read()
                with self.lock:
                    self.health.append(time.monotonic() - t0)
            except OSError:
                self.note("/health failed")
            time.sleep(0.25)


QUESTIONS = ["What is the capital of France?", "Write a haiku about owls.", "Explain recursion briefly.",
             "List three rivers in Africa.", "Why is the sky blue?", "Say hi."]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=float, default=4.0, help="new client requests per second")
    ap.add_argument("--hostile", type=float, default=0.3, help="the share of hostile clients (0: none)")
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=8192)
    args = ap.parse_args()
    proc, url = start(args.model, args.parallel, args.threads, args.ctx_size)
    soak = Soak(url)
    kinds = [lambda: soak.chat(True), lambda: soak.chat(False), soak.cancelled, soak.slow_reader, soak.grammar,
             soak.messages, soak.tokenize]
    # the hostile kinds, by weight (a 16 MB /tokenize is a second of a core: rarer)
    hostile = [(soak.costly_schema, 3), (soak.banned_everything, 2), (soak.many_stops, 2),
               (soak.rebound_host, 2), (soak.pipelined_non_reader, 2), (soak.unread_stream, 2), (soak.huge_tokenize, 1)]
    stop = threading.Event()
    threading.Thread(target=soak.probe, args=(stop,), daemon=True).start()
    print(f"soak: {args.model}, -np {args.parallel}, -t {args.threads}, {args.rate:g} requests/s for "
          f"{args.minutes:g} min ({args.hostile:.0%} hostile), pid {proc.pid}", flush=True)
    print("| minute | normal requests | their errors | hostile requests | RSS MiB | fds | /health p99 ms | max ms |\n"
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    all_health: list[float] = []
    rows = []
    t_end = time.monotonic() + args.minutes * 60
    next_row = time.monotonic() + 60
    minute = 0
    workers: list[threading.Thread] = []
    while time.monotonic() < t_end:
        if random.random() < args.hostile:
            kind = random.choices([k for k, _ in hostile], weights=[w for _, w in hostile])[0]
        else:
            kind = random.choice(kinds)
        w = threading.Thread(target=kind, daemon=True)
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
            normal = {k: n for k, n in out.items() if not k.startswith("hostile")}
            errs = sum(n for k, n in normal.items() if not re.search(r" 2\d\d$", k) and k != "cancelled")
            n_hostile = sum(n for k, n in out.items() if k.startswith("hostile"))
            p99 = statistics.quantiles(health, n=100)[98] * 1e3 if len(health) >= 2 else 0.0
            all_health += health
            row = (minute, sum(normal.values()), errs, n_hostile, rss_mib(proc.pid), fds(proc.pid), p99,
                   max(health, default=0.0) * 1e3)
            rows.append((row, out))
            print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} | {row[4]:.0f} | {row[5]} | {row[6]:.1f} | "
                  f"{row[7]:.0f} |", flush=True)
    stop.set()
    for w in workers:
        w.join(120)
    proc.terminate()
    proc.wait(60)
    if len(rows) >= 2:
        first, last = rows[min(1, len(rows) - 1)][0], rows[-1][0]
        p99 = statistics.quantiles(all_health, n=100)[98] * 1e3 if len(all_health) >= 2 else 0.0
        print(f"\nRSS {first[4]:.0f} -> {last[4]:.0f} MiB ({last[4] - first[4]:+.0f}), fds {first[5]} -> {last[5]}, "
              f"normal requests {sum(r[0][1] for r in rows)} with {sum(r[0][2] for r in rows)} errors, hostile "
              f"requests {sum(r[0][3] for r in rows)}; /health p99 {p99:.1f} ms, max {max(all_health) * 1e3:.0f} ms "
              f"over {len(all_health)} probes")
        kinds_seen: dict[str, int] = {}
        for _, out in rows:
            for k, n in out.items():
                kinds_seen[k] = kinds_seen.get(k, 0) + n
        print("outcomes: " + ", ".join(f"{k}: {n}" for k, n in sorted(kinds_seen.items())))
    return 0


if __name__ == "__main__":
    import results

    with results.saving("soak", "--save" in sys.argv[1:]):
        code = main()
    raise SystemExit(code)
