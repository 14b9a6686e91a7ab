"""Speculative decoding, bubo beside llama-server, in one run.

Each server is started twice on the same GGUF (-np 1, -t 2): without drafting and with it, side by
side, and the two are asked the same greedy chat requests (/v1/chat/completions, temperature 0) in
turn, prompt by prompt (so that the drift of a shared machine's speed hits both alike). Drafts come from
prompt lookup (bubo: its default; llama-server: `--spec-type ngram-simple`, its prompt-lookup
mode) or, with --draft-model, from a draft model (both: `-md`; llama-server also
`--spec-type draft-simple`, which this build needs, its other draft settings at their defaults:
--spec-draft-n-max 3, --draft-p-min 0):

  edit  answers that repeat much of their prompt (rename a variable in a function, correct the
        spelling of a paragraph, turn a list into a table): where prompt lookup pays;
  code  code written from a description (a draft model's task: nothing to copy);
  free  answers that do not repeat their prompt (a story, an explanation): where prompt lookup
        must cost next to nothing.

For each task and server: generated tokens per second without and with drafting (the server's
own `timings.predicted_per_second`, summed tokens over summed time), the ratio, the drafted
tokens the answers kept (acceptance), and whether the drafted answer is the plain one token for
token (it must be). The peer is llama-server from the pinned llama.cpp sdist, built once by
bench_llamacpp.build_llama_tool (which names the ISA instead of GGML_NATIVE=ON on a CPU that lists
AMX the kernel does not grant: such a build dies of SIGILL), unless --llama-server names one.

    python benchmarks/bench_spec.py [--model qwen2.5-coder:0.5b] [--max-tokens 256] [--rounds 1]
    python benchmarks/bench_spec.py --model qwen2.5-coder:1.5b --draft-model qwen2.5-coder:0.5b [--draft-requant none]
    python benchmarks/bench_spec.py --model qwen2.5-coder:1.5b --draft-model qwen2.5-coder:0.5b --level avx2

--level avx2 runs both at the AVX2 level (what an AVX2-only CPU such as a Zen 3 runs) on a CPU that
has more: bubo with BUBO_FORCE_ISA=avx2, and a llama-server built with AVX2 alone
(bench_llamacpp.build_llama_tool, unless --llama-server names one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_llamacpp import LEVELS, build_llama_tool, level_env, level_title  # noqa: E402
from bench_serve import HOST, Server, free_port  # noqa: E402
from results import cpu_name  # noqa: E402

CODE = '''def summarize(records):
    total = 0
    count = 0
    largest = None
    for record in records:
        value = record["value"]
        total += value
        count += 1
        if largest is None or value > largest:
            largest = value
    average = total / count if count else 0.0
    return {"total": total, "count": count, "average": average, "largest": largest}
'''
PARAGRAPH = ("The harbour town was quite in the mornings. Fishermen prepaired there nets before dawn, and "
             "the baker opend his shop at six. Visitors often remarked that the lighthouse, wich stood on "
             "the northern hill, was the most beautifull building in the region. In the evenings the "
             "market square filled with musicians, and the smell of fresh bread drifted accross the streets.")
ITEMS = ("apples: 3 kg, 4.50 EUR; pears: 2 kg, 3.80 EUR; plums: 1 kg, 2.90 EUR; cherries: 500 g, 5.20 EUR; "
         "grapes: 1.5 kg, 4.10 EUR; lemons: 6 pieces, 2.40 EUR")
TASKS = {
    "edit": [
        "Rename the variable `value` to `amount` everywhere in this function. Answer with the whole "
        "function only.\n\n```python\n" + CODE + "```",
        "Correct the spelling mistakes in this paragraph and answer with the corrected paragraph only:\n\n"
        + PARAGRAPH,
        "Turn this list into a Markdown table with columns fruit, quantity and price:\n\n" + ITEMS,
    ],
    "code": [
        "Write a Python function that parses a CSV file into a list of dictionaries, with type hints and a "
        "docstring.",
        "Write a JavaScript function that debounces another function, with a short usage example.",
        "Write a C function that reverses a singly linked list in place, with the struct definition.",
        "Write a Python class for a least-recently-used cache with get and put methods.",
    ],
    "free": [
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain how a hash table works, with an example.",
        "Describe a walk through a busy market on a summer morning.",
    ],
}


def post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    import http.client

    conn = http.client.HTTPConnection(HOST, port, timeout=900)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = json.loads(r.read())
        if r.status != 200:
            raise RuntimeError(f"{path}: {r.status} {data}")
        return data  # type: ignore[no-any-return]
    finally:
        conn.close()


def command(who: str, drafted: bool, args: argparse.Namespace, model: Path, port: int) -> list[str]:
    common = ["-m", str(model), "--host", HOST, "--port", str(port), "-c", "4096", "-t", str(args.threads),
              "-np", "1"]
    draft = ["-md", str(args.draft_path)] if args.draft_path else []
    if who == "bubo":
        requant = ["--draft-requant", args.draft_requant] if draft and args.draft_requant else []
        return [sys.executable, "-m", "bubo", "serve", *common] + (draft + requant if drafted else ["--no-draft"])
    peer = [*draft, "--spec-type", "draft-simple"] if draft else ["--spec-type", "ngram-simple"]
    return [args.llama_server, *common] + (peer if drafted else [])


def ask(port: int, prompt: str, args: argparse.Namespace) -> dict[str, Any]:
    r = post(port, "/v1/chat/completions",
             {"model": "bubo", "max_tokens": args.max_tokens, "temperature": 0, "cache_prompt": False,
              "messages": [{"role": "user", "content": prompt}]})
    t = r.get("timings", {})
    return {"text": r["choices"][0]["message"]["content"], "n": t.get("predicted_n", 0),
            "ms": t.get("predicted_ms", 0.0), "draft_n": t.get("draft_n", 0),
            "draft_n_accepted": t.get("draft_n_accepted", 0)}


def run(who: str, args: argparse.Namespace, model: Path) -> dict[bool, dict[str, list[dict[str, Any]]]]:
    """One server's answers without drafting (False) and with it (True): both run side by side and
    are asked in turn, prompt by prompt, which goes first alternating (a shared machine's speed
    drifts by a third within minutes: one run after the other would measure the drift)."""
    ports = {d: free_port() for d in (False, True)}
    out: dict[bool, dict[str, list[dict[str, Any]]]] = {False: {}, True: {}}
    with Server(who, command(who, False, args, model, ports[False]), ports[False]), \
            Server(who, command(who, True, args, model, ports[True]), ports[True]):
        for port in ports.values():
            post(port, "/v1/chat/completions", {"model": "bubo", "max_tokens": 8, "temperature": 0,
                                                "messages": [{"role": "user", "content": "Hello"}]})  # warm-up
        turn = 0
        for task in args.tasks:
            rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
            for _ in range(args.rounds):
                for p in TASKS[task]:
                    for drafted in ((False, True) if turn % 2 == 0 else (True, False)):
                        rows[drafted].append(ask(ports[drafted], p, args))
                    turn += 1
            for drafted in (False, True):
                out[drafted][task] = rows[drafted]
    return out


def summary(rows: list[dict[str, Any]]) -> tuple[float, int, int]:
    n = sum(r["n"] for r in rows)
    ms = sum(r["ms"] for r in rows)
    return (n / ms * 1e3 if ms else 0.0), sum(r["draft_n"] for r in rows), sum(r["draft_n_accepted"] for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    ap.add_argument("--model", default="qwen2.5-coder:0.5b")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-server", default=None,
                    help="its path, or none: bubo alone (default: built from the pinned llama.cpp sdist)")
    ap.add_argument("--level", choices=LEVELS, default="native",
                    help="avx2: both at the AVX2 level (bubo: BUBO_FORCE_ISA; llama-server built without AVX-512)")
    ap.add_argument("--draft-model", default=None, help="draft with this model (a catalog name or a GGUF path)")
    ap.add_argument("--draft-requant", default=None,
                    help="bubo's --draft-requant (default: bubo's own, q4_0; none: the draft file's types)")
    ap.add_argument("--tasks", default=None, help="comma-separated (default: edit,free; code,free with a draft model)")
    args = ap.parse_args(argv)
    from bubo import store

    if args.llama_server is None:
        try:
            args.llama_server = str(build_llama_tool("llama-server", args.level))
        except (OSError, subprocess.CalledProcessError, SystemExit) as e:  # no cmake, no network, a failed build
            print(f"bench_spec: llama-server could not be built ({e})", file=sys.stderr)
            args.llama_server = "none"
    os.environ.update(level_env(args.level))  # the servers inherit it
    at = level_title(args.level)
    model = store.resolve(args.model)
    args.draft_path = store.resolve(args.draft_model) if args.draft_model else None
    args.tasks = (args.tasks.split(",") if args.tasks else ["code", "free"] if args.draft_model else ["edit", "free"])
    servers = ["bubo"] + (["llama"] if args.llama_server != "none" and os.path.exists(args.llama_server) else [])
    if "llama" not in servers:
        print(f"bench_spec: no llama-server at {args.llama_server}: bubo only", file=sys.stderr)
    runs = {who: run(who, args, model) for who in servers}
    results = {(who, d): runs[who][d] for who in servers for d in (False, True)}
    drafts = f"drafted by {args.draft_model}" if args.draft_model else "prompt-lookup drafts"
    kind = "draft model" if args.draft_model else "prompt lookup"
    what = f"draft model {args.draft_model} for {args.model}" if args.draft_model else f"prompt lookup, {args.model}"
    print(f"### {what}{at}\n")
    print(f"model {args.model}, {drafts}, -t {args.threads}, greedy, max_tokens {args.max_tokens}, CPU: {cpu_name()}\n")
    print("| task | server | plain tok/s | drafted tok/s | drafted / plain | drafted tokens kept | same answer |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for task in args.tasks:
        for who in servers:
            plain, _, _ = summary(results[(who, False)][task])
            fast, dn, da = summary(results[(who, True)][task])
            same = all(a["text"] == b["text"] for a, b in zip(results[(who, False)][task], results[(who, True)][task]))
            peer = "llama-server (-md)" if args.draft_model else "llama-server (ngram-simple)"
            name = "bubo" if who == "bubo" else peer
            kept = f"{da}/{dn} ({da / dn:.0%})" if dn else "0/0"
            print(f"| {task} | {name} | {plain:.1f} | {fast:.1f} | {fast / plain:.2f}x | {kept} | {same} |")
    if "llama" in servers:
        print(f"\n### {kind}: bubo against llama-server{at}\n")
        print("| task | bubo drafted / llama-server drafted | bubo plain / llama-server plain |")
        print("| --- | ---: | ---: |")
        for task in args.tasks:
            b0, b1 = summary(results[("bubo", False)][task])[0], summary(results[("bubo", True)][task])[0]
            l0, l1 = summary(results[("llama", False)][task])[0], summary(results[("llama", True)][task])[0]
            print(f"| {task} | {b1 / l1:.2f}x | {b0 / l0:.2f}x |")
    print(f"\n### {kind}, each prompt{at}\n")
    print("| task | prompt | server | plain tok/s | drafted tok/s | drafted / plain | drafted tokens kept |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for task in args.tasks:
        prompts = TASKS[task]
        for i, p in enumerate(prompts):
            for who in servers:
                pick = [r for j, r in enumerate(results[(who, False)][task]) if j % len(prompts) == i]
                plain = summary(pick)[0]
                pick = [r for j, r in enumerate(results[(who, True)][task]) if j % len(prompts) == i]
                fast, dn, da = summary(pick)
                kept = f"{da}/{dn} ({da / dn:.0%})" if dn else "0/0"
                words = " ".join(p.split()[:5]) + " ..."
                name = "bubo" if who == "bubo" else "llama-server"
                print(f"| {task} | {words} | {name} | {plain:.1f} | {fast:.1f} | {fast / plain:.2f}x | {kept} |")
    return 0


if __name__ == "__main__":
    import results

    with results.saving("bench_spec", "--save" in sys.argv[1:]):
        code = main()
    raise SystemExit(code)
