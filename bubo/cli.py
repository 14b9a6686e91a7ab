"""Command line: python -m bubo serve | run | pull | list | bench.

Flags follow llama.cpp's names (-m/--model, -p/--prompt, -n/--n-predict, -c/--ctx-size,
-t/--threads, ...). Every flag can also come from an environment variable BUBO_ARG_<LONG NAME>
(BUBO_ARG_MODEL, BUBO_ARG_CTX_SIZE, ...); a flag on the command line wins over its variable.
Errors are one line on stderr and a non-zero exit (BUBO_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEFAULT_SERVE_MODEL = "smollm2:135m"  # what `python -m bubo serve` serves with no -m
DEFAULT_MODELS_MAX = 4  # router mode: models loaded at once (llama-server's default)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class _ArgParser(argparse.ArgumentParser):
    def add_flag(self, *flags: str, **kw: Any) -> argparse.Action:
        """add_argument whose default comes from BUBO_ARG_<LONG NAME> when that is set."""
        long = next(f for f in flags if f.startswith("--"))
        env = "BUBO_ARG_" + long[2:].upper().replace("-", "_")
        value = os.environ.get(env)
        if value is not None:
            if kw.get("action") == "store_true":
                if value.lower() not in _TRUE | _FALSE:
                    self.error(f"{env}={value!r}: expected one of 1/0, true/false, yes/no, on/off")
                kw["default"] = value.lower() in _TRUE
            else:
                conv = kw.get("type", str)
                try:
                    kw["default"] = conv(value)
                except ValueError:
                    self.error(f"{env}={value!r} is not a valid value for {long}")
            kw["required"] = False
        kw["help"] = (kw.get("help", "") + f" [env {env}]").strip()
        return self.add_argument(*flags, **kw)


class _ModelsAction(argparse.Action):
    """-m may be given several times: args.models lists them all, args.model is the first."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        models = [*getattr(namespace, "models", []), values]
        namespace.models = models
        namespace.model = models[0]


def _parser() -> _ArgParser:
    parser = _ArgParser(prog="bubo", description="bubo: a local LLM inference server for GGUF models")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgParser)

    p = sub.add_parser("serve", help="start the HTTP server (OpenAI, Anthropic and llama-server APIs)")
    p.add_flag("-m", "--model", default=DEFAULT_SERVE_MODEL, action=_ModelsAction,
               help=f"catalog name or GGUF path (default {DEFAULT_SERVE_MODEL}); give -m several times to serve "
                    "several models")
    p.set_defaults(models=[])
    p.add_flag("--models-dir", default=None, help="serve every .gguf file in this folder (router mode)")
    p.add_flag("--models-preset", default=None,
               help="INI file of per-model settings: [*] for every model, [name] for one; keys are flag names")
    p.add_flag("--models-max", type=int, default=DEFAULT_MODELS_MAX,
               help=f"models loaded at once (0: no limit; default {DEFAULT_MODELS_MAX}); loading one more first "
                    "unloads the least recently used idle one")
    p.add_flag("--no-models-autoload", action="store_true",
               help="load models only at start or through POST /models/load, not on their first request")
    p.add_flag("--sleep-idle-seconds", type=float, default=None,
               help="a model idle this long releases its memory and reloads on its next request")
    p.add_flag("--host", default="127.0.0.1",
               help="address to listen on (keep loopback unless remote clients must connect)")
    p.add_flag("--port", type=int, default=8080, help="port (0: any free port, logged)")
    p.add_flag("--served-model-name", default=None, help="the model id clients use (default: the model's name)")
    p.add_flag("-a", "--alias", default=None, help="more accepted model names, comma-separated")
    p.add_flag("-c", "--ctx-size", type=int, default=None,
               help="context size in tokens (default: the trained context, capped by memory)")
    p.add_flag("-t", "--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_flag("-np", "--parallel", type=int, default=None,
               help="slots: requests generated at once, sharing the context (default: up to 4, 512+ tokens each)")
    p.add_flag("-b", "--batch-size", type=int, default=None, help="most tokens one engine step takes (logical "
                                                                 "batch; default 2048)")
    p.add_flag("-ub", "--ubatch-size", type=int, default=None, help="most tokens in one forward pass (at most "
                                                                    "512, the default)")
    p.add_flag("--queue-size", type=int, default=None,
               help="requests that may wait for a slot; past it, 503 with Retry-After (default: unbounded)")
    p.add_flag("--no-slots", action="store_true", help="turn the /slots endpoint off")
    p.add_flag("--allow-special-in-content", action="store_true",
               help="let control-token text in chat messages and tools (\"<|im_start|>\") become control tokens, "
                    "as llama-server does (by default only the chat template's own markup does)")
    p.add_flag("-to", "--timeout", type=float, default=600.0,
               help="the longest a request's body may take to arrive, seconds (a body must also keep to "
                    "64 KiB/s after the first --header-timeout seconds)")
    p.add_flag("--header-timeout", type=float, default=10.0,
               help="seconds from a request's first byte to the end of its headers (then 408 and closed)")
    p.add_flag("--keepalive-timeout", type=float, default=15.0,
               help="seconds a connection may wait for its next request before it is closed")
    p.add_flag("--drain-timeout", type=float, default=30.0,
               help="on SIGTERM or SIGINT, how long requests in flight may go on before they are ended with an "
                    "error event (a second signal ends them at once)")
    p.add_flag("--max-connections", type=int, default=None,
               help="open connections at most (default 4096, kept 256 below the open-file limit); past it "
                    "the connection waiting longest for a request is closed, or the newcomer gets 503")
    p.add_flag("--api-key", default=None, help="require this key (several: comma-separated)")
    p.add_flag("--api-key-file", default=None, help="file of keys, one per line (# comments)")
    p.add_flag("--chat-template-file", default=None, help="a Jinja chat template to use instead of the model's own")
    p.add_flag("--debug-hooks", action="store_true", help="serve /debug/* (only on a loopback address)")
    p.add_flag("--cors-origins", default=None, help="origins allowed by CORS, comma-separated (* for any)")

    p = sub.add_parser("pull", help="download a catalog model into the store")
    p.add_argument("name", help="catalog name, e.g. smollm2:135m")
    p.add_flag("--force", action="store_true", help="download again even if stored (repairs a corrupt file)")

    sub.add_parser("list", help="list the stored models")

    p = sub.add_parser("run", help="generate text from a prompt, streamed to stdout")
    p.add_flag("-m", "--model", required=True, help="catalog name or GGUF path")
    p.add_flag("-p", "--prompt", required=True)
    p.add_flag("-n", "--n-predict", type=int, default=256,
               help="tokens to generate (-1: until the model stops or the context is full)")
    p.add_flag("--temp", type=float, default=None, help="temperature; <= 0 is greedy (default 0.8)")
    p.add_flag("--top-k", type=int, default=None)
    p.add_flag("--top-p", type=float, default=None)
    p.add_flag("--min-p", type=float, default=None)
    p.add_flag("-s", "--seed", type=int, default=None)
    p.add_flag("--chat", action="store_true",
               help="apply the model's chat template to the prompt (as one user message)")
    p.add_flag("-t", "--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_flag("-c", "--ctx-size", type=int, default=4096)

    p = sub.add_parser("bench", help="measure prompt processing and generation speed (llama-bench's table)")
    p.add_flag("-m", "--model", required=True, help="catalog name or GGUF path")
    p.add_flag("-p", "--n-prompt", type=int, default=512, help="prompt tokens (0: skip the prompt test)")
    p.add_flag("-n", "--n-gen", type=int, default=128, help="generated tokens (0: skip the generation test)")
    p.add_flag("-t", "--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_flag("-r", "--repetitions", type=int, default=5)
    p.add_flag("-o", "--output", choices=("md", "json"), default="md")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("\nbubo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `bubo run ... | head`: the reader left; say nothing
        sys.stderr.close()
        return EXIT_ERROR
    except Exception as e:
        if os.environ.get("BUBO_DEBUG"):
            raise
        msg = str(e) or type(e).__name__
        print(f"bubo {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_ERROR


# --- commands ------------------------------------------------------------------------------


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _serve(args: argparse.Namespace) -> int:
    from bubo.api.serve import serve

    return serve(args)


def _pull(args: argparse.Namespace) -> int:
    from bubo import store

    print(store.pull(args.name, force=args.force))
    return 0


def _list(args: argparse.Namespace) -> int:
    from bubo import store

    rows = [("NAME", "SIZE", "ARCH", "QUANT", "CONTEXT", "PATH")]
    for m in store.stored_models():
        arch, quant, ctx = _describe(m.path)
        rows.append((m.name, f"{m.size / 1e6:.0f} MB", arch, quant, ctx, str(m.path)))
    if len(rows) == 1:
        print(f"no models stored in {store.models_dir()}; get one with `bubo pull {store.DEFAULT_MODEL}`",
              file=sys.stderr)
        return 0
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def _describe(path: Any) -> tuple[str, str, str]:
    """(architecture, quantization, context length) from the GGUF metadata; '?' for what cannot
    be read (list shows a broken file rather than failing)."""
    from bubo import GGUFFile
    from bubo.store import FILE_TYPE_NAMES

    try:
        with GGUFFile(path) as f:
            md = f.metadata
    except Exception:  # noqa: BLE001 - list shows a broken file rather than failing
        return "?", "?", "?"
    arch = str(md.get("general.architecture", "?"))
    ft = md.get("general.file_type")
    quant = FILE_TYPE_NAMES.get(ft, f"type {ft}") if isinstance(ft, int) else "?"
    ctx = md.get(f"{arch}.context_length")
    return arch, quant, str(ctx) if ctx is not None else "?"


def _run(args: argparse.Namespace) -> int:
    from bubo.llm import Model

    if args.n_predict == 0 or args.n_predict < -1:
        raise ValueError(f"-n {args.n_predict}: give a positive number of tokens, or -1 for no limit")
    model = Model(args.model, n_ctx=args.ctx_size, n_threads=args.threads)
    kwargs = dict(max_tokens=None if args.n_predict < 0 else args.n_predict, seed=args.seed,
                  temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    if args.chat:
        stream = model.chat_stream([{"role": "user", "content": args.prompt}], **kwargs)
    else:
        stream = model.generate(args.prompt, **kwargs)
    out = sys.stdout
    for piece in stream:
        out.write(piece)
        out.flush()
    out.write("\n")
    return 0


# --- bench ---------------------------------------------------------------------------------


def bench(path: Any, n_prompt: int, n_gen: int, n_threads: int | None, reps: int) -> list[dict[str, Any]]:
    """llama-bench's two tests on the native model: `pp` decodes n_prompt tokens as one batch
    into an empty cache, `tg` decodes n_gen tokens one at a time; each after a warm-up run,
    `reps` times. Random tokens, as llama-bench uses: speed does not depend on the text."""
    import numpy as np

    from bubo import GGUFFile, store

    if n_prompt < 0 or n_gen < 0 or (n_prompt == 0 and n_gen == 0):
        raise ValueError("give -p and/or -n as positive token counts")
    if reps <= 0:
        raise ValueError("-r must be at least 1")
    path = store.resolve(path)
    from bubo._model import KVCache
    from bubo._model import Model as NativeModel

    with GGUFFile(path) as f:
        md = f.metadata
        size = sum(t.nbytes for t in f.tensors)
        params = sum(int(np.prod(t.shape)) for t in f.tensors)
    model = NativeModel(str(path), n_threads or 0)
    threads = n_threads or os.cpu_count() or 1
    kv = KVCache(model, max(n_prompt, n_gen, 1) + 1)
    rng = np.random.default_rng(0)
    n_vocab = model.n_vocab

    def run_pp() -> float:
        kv.truncate(0, 0)
        toks = rng.integers(0, n_vocab, n_prompt, dtype=np.int32)
        rows = np.zeros(n_prompt, dtype=bool)
        rows[-1] = True
        t0 = time.perf_counter()
        model.decode(kv, toks, np.arange(n_prompt, dtype=np.int32), np.zeros(n_prompt, dtype=np.int32), rows)
        return time.perf_counter() - t0

    def run_tg() -> float:
        kv.truncate(0, 0)
        toks = rng.integers(0, n_vocab, n_gen, dtype=np.int32)
        one_row = np.ones(1, dtype=bool)
        seq = np.zeros(1, dtype=np.int32)
        t0 = time.perf_counter()
        for i in range(n_gen):
            model.decode(kv, toks[i : i + 1], np.array([i], dtype=np.int32), seq, one_row)
        return time.perf_counter() - t0

    arch = str(md.get("general.architecture", "?"))
    ft = md.get("general.file_type")
    quant = store.FILE_TYPE_NAMES.get(ft, "?") if isinstance(ft, int) else "?"
    desc = f"{arch} {md.get('general.size_label', '?')} {quant}"
    results = []
    for test, n, fn in (("pp", n_prompt, run_pp), ("tg", n_gen, run_tg)):
        if n == 0:
            continue
        fn()  # warm-up: page in the weights, spin up the threads
        speeds = [n / fn() for _ in range(reps)]
        results.append({
            "model": desc, "model_size": size, "model_n_params": params, "backend": "CPU",
            "n_threads": threads, "test": f"{test}{n}", "n_prompt": n if test == "pp" else 0,
            "n_gen": n if test == "tg" else 0, "avg_ts": statistics.mean(speeds),
            "stddev_ts": statistics.stdev(speeds) if len(speeds) > 1 else 0.0, "samples_ts": speeds,
        })
    return results


def markdown_table(results: list[dict[str, Any]]) -> str:
    """llama-bench's markdown table."""
    head = ("model", "size", "params", "backend", "threads", "test", "t/s")
    right = (False, True, True, False, True, True, True)
    rows = []
    for r in results:
        p = r["model_n_params"]
        rows.append((
            r["model"], f"{r['model_size'] / 1024**2:.2f} MiB",
            f"{p / 1e9:.2f} B" if p >= 1e9 else f"{p / 1e6:.2f} M",
            r["backend"], str(r["n_threads"]), r["test"],
            f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}",
        ))
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(head)]
    widths[0] = max(widths[0], 30)
    widths[-1] = max(widths[-1], 20)

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if r else "-" * w for w, r in zip(widths, right)) + " |"
    return "\n".join([line(head), sep] + [line(row) for row in rows])


def _bench(args: argparse.Namespace) -> int:
    results = bench(args.model, args.n_prompt, args.n_gen, args.threads, args.repetitions)
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        print(markdown_table(results))
    return 0


_COMMANDS = {"serve": _serve, "pull": _pull, "list": _list, "run": _run, "bench": _bench}
