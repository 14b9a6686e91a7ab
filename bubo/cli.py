"""Command line: python -m bubo serve | run | pull | list | show | rm | ps | bench.

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
from typing import Any, NoReturn

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEFAULT_SERVE_MODEL = "smollm2:135m"  # what `python -m bubo serve` serves with no -m
DEFAULT_MODELS_MAX = 4  # router mode: models loaded at once (llama-server's default)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class _ArgParser(argparse.ArgumentParser):
    intermixed = False  # positionals may come between flags (bubo run MODEL -n 8 PROMPT)
    _mixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        if not self.intermixed or self._mixing:
            return super().parse_known_args(args, namespace)
        self._mixing = True  # parse_known_intermixed_args calls this again for each of its passes
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False

    def error(self, message: str) -> NoReturn:
        """One line naming the flag as typed, and where the help is (argparse prints the usage too)."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

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


class _TypedStore(argparse._StoreAction):
    """argparse's store, also noting the flag as typed (-c or --ctx-size) for error messages."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        if option_string is not None:
            namespace.typed_flags = {**(getattr(namespace, "typed_flags", None) or {}), self.dest: option_string}


def _given_as(args: argparse.Namespace, dest: str, long: str, value: Any) -> str:
    """How the user gave a flag's value: `-c -5` as typed, or `BUBO_ARG_CTX_SIZE=-5`."""
    typed = (getattr(args, "typed_flags", None) or {}).get(dest)
    if typed is not None:
        return f"{typed} {value}"
    env = "BUBO_ARG_" + long[2:].upper().replace("-", "_")
    if env in os.environ:
        return f"{env}={os.environ[env]}"
    return f"{long} {value}"


def _parser() -> _ArgParser:
    parser = _ArgParser(prog="bubo", description="bubo: a local LLM inference server for GGUF models")
    parser.add_argument("--version", action="version", version=f"bubo {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgParser)

    p = sub.add_parser("serve", help="start the HTTP server (OpenAI, Anthropic, llama-server and Ollama APIs)")
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
    p.add_flag("--no-webui", action="store_true", help="no chat page at / (browsers get a short page about the server)")
    p.add_flag("--ui-config", default=None,
               help='the chat page\'s defaults for new conversations, JSON or a JSON file: {"temperature": 0.7, '
                    '"system": "...", "max_tokens": 512, ...}')
    p.add_flag("--embedding", "--embeddings", action="store_true",
               help="serve an embedding model (bert, e.g. all-minilm:l6-v2) for /v1/embeddings; a text-generation "
                    "model is refused (an embedding model is served for embeddings with or without the flag)")
    p.add_flag("--pooling", choices=("mean", "cls", "last"), default=None,
               help="how an embedding model pools its token rows (default: the model file's pooling_type)")
    p.add_flag("--ollama", action="store_true",
               help="also listen on Ollama's port 11434, for clients that assume it (every route answers on both)")
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
    add_cache_type_flags(p)
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
    p.add_flag("--prepare-timeout", type=float, default=5.0,
               help="seconds of work a request may cost before it is generated (reading its JSON, converting a "
                    "schema, rendering the template, tokenizing); past it, 400 too_costly and the work is dropped")
    p.add_flag("--write-timeout", type=float, default=30.0,
               help="seconds a client may leave an answer unread (its socket full) before its connection is "
                    "closed and its generation ended")
    p.add_flag("--host-allow", default=None,
               help="more host names clients may reach this server by (the Host header), comma-separated "
                    "(.example.com: it and every name under it; *: any); loopback names and IP addresses are "
                    "always allowed, and any name when the server has an API key")
    p.add_flag("--allow-copy", action="store_true",
               help="let POST /api/copy copy a model's file where it cannot make a hard link (another "
                    "filesystem), within the disk space a pull would check")
    p.add_flag("--max-connections", type=int, default=None,
               help="open connections at most (default 4096, kept 256 below the open-file limit); past it "
                    "the connection waiting longest for a request is closed, or the newcomer gets 503")
    p.add_flag("--api-key", default=None, help="require this key (several: comma-separated)")
    p.add_flag("--api-key-file", default=None, help="file of keys, one per line (# comments)")
    p.add_flag("--chat-template-file", default=None, help="a Jinja chat template to use instead of the model's own")
    p.add_flag("--debug-hooks", action="store_true", help="serve /debug/* (only on a loopback address)")
    p.add_flag("--cors-origins", default=None, help="origins allowed by CORS, comma-separated (* for any)")
    add_sampling_flags(p, server=True)
    p.add_flag("-md", "--model-draft", default=None,
               help="speculative decoding with a draft model (a catalog name or a GGUF path) that shares the model's "
                    "vocabulary and is smaller, e.g. qwen2.5-coder:0.5b for qwen2.5-coder:1.5b; without it, drafts "
                    "come from the sequence's own prompt and answer (prompt lookup). Drafts never change an answer")
    p.add_flag("--draft-max", type=int, default=None,
               help="speculative decoding: most drafted tokens checked per forward pass (default 16; bubo picks "
                    "each draft's length within it by what drafts have been kept and what a pass costs)")
    p.add_flag("--draft-min", type=int, default=None, help="fewer drafted tokens than this are not checked (default 0)")
    p.add_flag("--draft-p-min", type=float, default=None,
               help="the draft model stops drafting where its top token's probability is under this (default 0: "
                    "each draft's length is chosen by what drafts have been kept and what a pass costs)")
    p.add_flag("--draft-requant", default=None, metavar="TYPE",
               help="the draft model's matrices wider than this type are rewritten in it at load: q4_0 (the "
                    "default), q4_1, q5_0, q5_1, q8_0, or none to keep the file's (drafts are only checked, so "
                    "fewer bytes per pass make drafting faster and change no answer)")
    p.add_flag("--no-draft", action="store_true", help="no speculative decoding")
    p.add_flag("--spec-type", default=None,
               help="llama-server's speculative decoding types, comma-separated: ngram-simple (or any ngram-*) is "
                    "bubo's prompt lookup, draft (or draft-*) the draft model of --model-draft, none turns it off")
    p.add_flag("-v", "--verbose", action="store_true",
               help="log more: every request, polled routes (/health, /metrics, ...) included, and debug lines")
    p.add_flag("--log-disable", action="store_true",
               help="print nothing but a fatal error (no start-up lines, no request log)")
    p.add_flag("--log-format", choices=("text", "json"), default="text",
               help="the log's lines as text or as JSON objects, one per line (default text)")
    add_habit_flags(p)

    p = sub.add_parser(
        "ray-serve", help="serve replicas of `bubo serve` on a Ray cluster, routed by prompt prefix "
                          "(pip install 'bubo[ray]')",
        description="Start N replicas, each a `bubo serve` with its model, behind Ray Serve's HTTP proxy. Every "
                    "flag that is not ray-serve's own below (-m, -c, -np, --api-key, ...) is `bubo serve`'s and "
                    "goes to each replica.")
    p.add_flag("--replicas", type=int, default=1, help="replicas to start (default 1)")
    p.add_flag("-t", "--threads", type=int, default=1, help="CPU threads per replica: its -t and its Ray num_cpus "
                                                            "(default 1)")
    p.add_flag("--address", default=None, help="the Ray cluster to join (auto: the one running here, or "
                                               "HOST:PORT); default RAY_ADDRESS, else a new cluster on this machine")
    p.add_flag("--host", default="127.0.0.1", help="the HTTP proxy's address (default 127.0.0.1)")
    p.add_flag("--port", type=int, default=8000, help="the HTTP proxy's port (default 8000)")
    p.add_flag("--proxy-location", choices=("HeadOnly", "EveryNode"), default="HeadOnly",
               help="an HTTP proxy on the head node only (default), or on every node (then put a load balancer "
                    "in front)")
    p.add_flag("--router", choices=("prefix", "pow2"), default="prefix",
               help="prefix: to the replica holding the prompt's prefix in its cache, else the least loaded "
                    "(default); pow2: Ray Serve's default, the shorter queue of two random replicas")
    p.add_flag("--busy-threshold", type=int, default=4,
               help="a replica with this many requests under way takes no more for its prefix (default 4)")
    p.add_flag("--min-replicas", type=int, default=None, help="autoscaling: the fewest replicas (default 1)")
    p.add_flag("--max-replicas", type=int, default=None,
               help="autoscaling on queue depth: at most this many replicas (without it, --replicas, fixed)")
    p.add_flag("--target-ongoing-requests", type=float, default=2.0,
               help="autoscaling: the requests under way per replica it aims at (default 2)")
    p.add_flag("--max-ongoing-requests", type=int, default=32,
               help="requests one replica holds at once (bubo queues those past its slots; default 32)")
    p.add_flag("--one-per-node", action="store_true", help="at most one replica on a node")
    p.add_flag("--ready-timeout", type=float, default=600.0,
               help="seconds the replicas may take to load (a catalog model is pulled first; default 600)")
    p.add_flag("--app-name", default="bubo", help="the Serve application's name (default bubo)")

    p = sub.add_parser("pull", help="download a catalog model into the store")
    p.add_argument("name", help="catalog name, e.g. smollm2:135m")
    p.add_flag("--force", action="store_true", help="download again even if stored (repairs a corrupt file)")

    sub.add_parser("list", help="list the stored models")

    p = sub.add_parser("convert", help="convert a BERT checkpoint (safetensors, tokenizer.json) to a GGUF file")
    p.add_argument("src", metavar="SRC_DIR", help="the checkpoint's directory: config.json, tokenizer.json, "
                   "model.safetensors (and 1_Pooling/config.json for a sentence-transformers model)")
    p.add_argument("out", metavar="OUT.gguf", help="the GGUF file to write (replaced only once complete)")
    p.add_flag("--type", dest="out_type", choices=("f32", "f16"), default="f16",
               help="the matrices' type (default f16; norms and biases stay f32)")

    p = sub.add_parser(
        "run", help="chat with a model, or answer one prompt (as `ollama run`)",
        description="Chat with a model: with PROMPT (or -p, or text piped to stdin) answer it and exit; "
                    "with none and a terminal, an interactive chat (/? for its commands). The model's chat "
                    "template renders the conversation unless --raw, or the model has none.")
    for key in (None, "store"):  # argparse's default action, and by name: errors name each flag as typed
        p.register("action", key, _TypedStore)
    p.intermixed = True
    p.add_argument("model_arg", nargs="?", metavar="MODEL", help="catalog name (smollm2, smollm2:135m) or GGUF path")
    p.add_argument("prompt_args", nargs="*", metavar="PROMPT",
                   help="answer this and exit (several words are joined; piped stdin comes first)")
    p.add_flag("-m", "--model", default=None, help="the model, as a flag (then every positional word is the prompt)")
    p.add_flag("-p", "--prompt", default=None, help="the prompt, as a flag (-: read it from stdin)")
    p.add_flag("--system", default=None, help="the system message")
    p.add_flag("--raw", action="store_true", help="complete the prompt as plain text, without the chat template")
    p.add_argument("--chat", action="store_true", help=argparse.SUPPRESS)  # the old default-off flag: a no-op
    p.add_flag("--verbose", action="store_true", help="print timings after each answer (as ollama run --verbose)")
    p.add_flag("-n", "--n-predict", type=int, default=-1,
               help="most tokens an answer generates (-1, the default: until the model stops or the context is full)")
    p.add_flag("-c", "--ctx-size", type=int, default=4096,
               help="context size in tokens (0: the model's trained context; default 4096)")
    p.add_flag("-t", "--threads", type=int, default=None, help="CPU threads (default: all)")
    add_cache_type_flags(p)
    add_sampling_flags(p, server=False)

    p = sub.add_parser("rm", help="delete a stored model")
    p.add_argument("names", nargs="+", metavar="NAME", help="catalog name (smollm2, smollm2:135m) or stored file name")

    p = sub.add_parser("show", help="show a model's information (architecture, parameters, template, license)")
    p.add_argument("name", metavar="NAME", help="catalog name, stored file name or GGUF path")
    part = p.add_mutually_exclusive_group()
    part.add_argument("--template", action="store_true", help="print only the chat template")
    part.add_argument("--license", action="store_true", help="print only the license")
    part.add_argument("--parameters", action="store_true", help="print only the sampling defaults")

    p = sub.add_parser("ps", help="list the models a running server has (loaded or not)")
    p.add_flag("--host", default="127.0.0.1", help="the server's address")
    p.add_flag("--port", type=int, default=8080, help="the server's port")
    p.add_flag("--api-key", default=None, help="the key the server requires (the first, if several are given)")

    p = sub.add_parser("bench", help="measure prompt processing and generation speed (llama-bench's table)")
    p.add_flag("-m", "--model", required=True, help="catalog name or GGUF path")
    p.add_flag("-p", "--n-prompt", type=int, default=512, help="prompt tokens (0: skip the prompt test)")
    p.add_flag("-n", "--n-gen", type=int, default=128, help="generated tokens (0: skip the generation test)")
    p.add_flag("-d", "--n-depth", type=int, default=0,
               help="tokens already in the cache before each test (llama-bench's depth: \"tg128 @ d4096\")")
    p.add_flag("-t", "--threads", type=int, default=None, help="CPU threads (default: all)")
    add_cache_type_flags(p)
    p.add_flag("-r", "--repetitions", type=int, default=5)
    p.add_flag("-o", "--output", choices=("md", "json"), default="md")
    p.add_flag("--draft", default=None, metavar="ngram|MODEL",
               help="instead: generation with speculative decoding against without it, on text prompts (greedy "
                    "chat answers of -n tokens): prompt-lookup drafts (ngram) or a draft model (a catalog name or "
                    "a GGUF path)")
    p.add_flag("--prompt", action="append", default=None,
               help="with --draft: a user message to answer (repeatable; default: an editing task for ngram, "
                    "code writing for a draft model)")
    return parser


def add_cache_type_flags(p: _ArgParser) -> None:
    from bubo.engine.engine import KV_TYPES, KV_TYPES_K

    p.add_flag("-ctk", "--cache-type-k", default=None, metavar="TYPE",
               help=f"the KV cache's K rows stored as {', '.join(KV_TYPES_K)} (default f16; q8_0 takes about half "
                    "the memory)")
    p.add_flag("-ctv", "--cache-type-v", default=None, metavar="TYPE",
               help=f"the V rows, likewise: {', '.join(KV_TYPES)}")


def check_cache_flags(args: argparse.Namespace) -> None:
    """ValueError naming -ctk/-ctv as given for a type the KV cache does not store."""
    from bubo.engine.engine import check_cache_type

    for dest, long in (("cache_type_k", "--cache-type-k"), ("cache_type_v", "--cache-type-v")):
        value = getattr(args, dest, None)
        if value is not None:
            check_cache_type(value, long, k=dest == "cache_type_k", given=_given_as(args, dest, long, value))


def add_sampling_flags(p: _ArgParser, *, server: bool) -> None:
    """llama.cpp's sampling flags. On `serve` they are the defaults of requests that do not set
    the field (as llama-server's are); on `run`, the answer's settings."""
    who = "default for requests that do not set it" if server else "default: llama.cpp's"
    p.add_flag("--temp", type=float, default=None, help=f"temperature; <= 0 is greedy ({who}: 0.8)")
    p.add_flag("--top-k", type=int, default=None, help=f"top-k, 0: off ({who}: 40)")
    p.add_flag("--top-p", type=float, default=None, help=f"top-p, 1: off ({who}: 0.95)")
    p.add_flag("--min-p", type=float, default=None, help=f"min-p, 0: off ({who}: 0.05)")
    p.add_flag("--repeat-penalty", type=float, default=None, help=f"repetition penalty, 1: off ({who}: 1)")
    p.add_flag("--repeat-last-n", type=int, default=None, help=f"tokens the penalties look back on ({who}: 64)")
    p.add_flag("--presence-penalty", type=float, default=None, help=f"presence penalty ({who}: 0)")
    p.add_flag("--frequency-penalty", type=float, default=None, help=f"frequency penalty ({who}: 0)")
    p.add_flag("-s", "--seed", type=int, default=None, help="random seed (-1: a random one)")
    if server:
        p.add_flag("-n", "--n-predict", type=int, default=None,
                   help="most tokens an answer generates when the request does not say (-1 or unset: until the "
                        "model stops or the context is full)")


# llama-server flags people bring by habit: (flags, takes a value, what bubo does with them)
HABIT_NOTES: list[tuple[tuple[str, ...], bool, str]] = [
    (("-ngl", "--n-gpu-layers", "--gpu-layers"), True,
     "this build runs on the CPU: every layer stays there"),
    (("-fa", "--flash-attn"), False, "bubo has one attention path: the flag changes nothing"),
    (("--jinja",), False, "chat templates are always Jinja templates here"),
    (("-cb", "--cont-batching"), False, "requests are always batched continuously"),
    (("--metrics",), False, "/metrics is always served"),
    (("--slots",), False, "/slots is served unless --no-slots"),
    (("--mlock", "--no-mmap", "--mmap", "--no-warmup"), False, "bubo manages the weights' memory itself"),
]
# ... and those it refuses: a flag that would change the answer or the memory, not honoured here
HABIT_REFUSED: list[tuple[tuple[str, ...], bool, str]] = [
    (("-devd", "--device-draft", "-ngld", "--gpu-layers-draft"), True,
     "this build has no GPU backend: the draft model runs on the CPU"),
    (("--lora", "--lora-scaled", "--control-vector"), True, "adapters are not supported"),
    (("--mmproj", "--mmproj-url"), True, "images are not supported: the catalog models read text"),
    (("--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx"), True,
     "RoPE scaling is taken from the model file only"),
    (("-dev", "--device", "-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu"), True,
     "this build has no GPU backend"),
    (("--numa",), True, "NUMA placement is not supported"),
    (("-hf", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"), True,
     "bubo does not download from model hubs: give a catalog name (bubo pull) or a GGUF path"),
]


class _HabitAction(argparse.Action):
    """A llama-server flag: noted and ignored (HABIT_NOTES), or refused (HABIT_REFUSED), in one
    line naming the flag as typed."""

    def __init__(self, *args: Any, note: str, refused: bool, **kw: Any):
        super().__init__(*args, **kw)
        self.note = note
        self.refused = refused

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.refused:
            parser.error(f"{option_string}: not supported: {self.note}")
        notes: list[str] = getattr(namespace, "habit_notes", None) or []
        notes.append(f"{option_string}: accepted, {self.note}")
        namespace.habit_notes = notes


def add_habit_flags(p: _ArgParser) -> None:
    p.set_defaults(habit_notes=[])
    for table, refused in ((HABIT_NOTES, False), (HABIT_REFUSED, True)):
        for flags, takes_value, note in table:
            # -fa takes an optional on/off/auto (llama-server's newer form) or nothing
            nargs = 1 if takes_value else "?"
            p.add_argument(*flags, action=_HabitAction, note=note, refused=refused, nargs=nargs,
                           dest="habit_" + flags[-1].lstrip("-").replace("-", "_"), help=argparse.SUPPRESS)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("bubo")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser.print_help()
        return 0
    if argv[0] == "ray-serve":
        # ray-serve's own flags, and `bubo serve`'s for the replicas (checked here, before a cluster starts)
        args, serve_argv = parser.parse_known_args(argv)
        parser.parse_args(["serve", *serve_argv])
        args.serve_argv = serve_argv
    else:
        args = parser.parse_args(argv)
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


def _ray_serve(args: argparse.Namespace) -> int:
    from bubo.rayserve.cli import ray_serve

    return ray_serve(args)


def _pull(args: argparse.Namespace) -> int:
    from bubo import store

    print(store.pull(args.name, force=args.force))
    return 0


def _convert(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bubo.convert import convert_file

    print(convert_file(Path(args.src), Path(args.out), out_type=args.out_type))
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


# llama.cpp's flags on `run` -> the session's options (bubo.cli_chat.OPTIONS: Ollama's names)
_RUN_OPTIONS = (("temp", "--temp", "temperature"), ("top_k", "--top-k", "top_k"), ("top_p", "--top-p", "top_p"),
                ("min_p", "--min-p", "min_p"), ("repeat_penalty", "--repeat-penalty", "repeat_penalty"),
                ("repeat_last_n", "--repeat-last-n", "repeat_last_n"),
                ("presence_penalty", "--presence-penalty", "presence_penalty"),
                ("frequency_penalty", "--frequency-penalty", "frequency_penalty"),
                ("seed", "--seed", "seed"), ("n_predict", "--n-predict", "num_predict"))


def _run(args: argparse.Namespace) -> int:
    """One answer (a prompt given, or piped to stdin), or an interactive chat (bubo/cli_chat.py)."""
    from bubo import store
    from bubo.cli_chat import Session, check_option
    from bubo.llm import Model

    typed = getattr(args, "typed_flags", None) or {}
    words = list(args.prompt_args)
    if "model" in typed:  # -m: every positional word is the prompt
        model_name = args.model
        words = [args.model_arg, *words] if args.model_arg is not None else words
    else:
        model_name = args.model_arg if args.model_arg is not None else args.model
    if not model_name:
        print("bubo run: error: no model: give one, as in `bubo run smollm2 [PROMPT]` (or -m MODEL)",
              file=sys.stderr)
        return EXIT_USAGE
    options: dict[str, Any] = {}
    for dest, long, name in _RUN_OPTIONS:
        value = getattr(args, dest)
        if value is None or (dest == "n_predict" and value == -1):
            continue
        try:
            check_option(name, value)
        except ValueError as e:
            raise ValueError(f"{_given_as(args, dest, long, value)}: {e}") from None
        options[name] = value
    if args.ctx_size < 0:
        raise ValueError(f"{_given_as(args, 'ctx_size', '--ctx-size', args.ctx_size)}: give 0 (the trained "
                         "context) or a positive number of tokens")
    if args.threads is not None and args.threads <= 0:
        raise ValueError(f"{_given_as(args, 'threads', '--threads', args.threads)}: give a positive number of "
                         "threads (leave the flag out for every CPU)")
    check_cache_flags(args)
    if args.raw and args.chat:
        raise ValueError("--raw and --chat: give one (chat is the default when the model has a chat template)")
    if words and "prompt" in typed:
        raise ValueError(f"{typed['prompt']}: give the prompt once, as PROMPT or with {typed['prompt']}")

    path = store.resolve(model_name)  # a catalog model not stored yet is pulled here
    name = (None if os.path.isfile(model_name) else store.catalog_name(model_name)) or model_name
    n_ctx = args.ctx_size or _trained_context(path, _given_as(args, "ctx_size", "--ctx-size", 0))
    prompt = _run_prompt(args, words)
    t0 = time.perf_counter()
    model = Model(name, n_ctx=n_ctx, n_threads=args.threads, cache_type_k=args.cache_type_k or "f16",
                  cache_type_v=args.cache_type_v or "f16")
    load_s = time.perf_counter() - t0
    has_template = model.runtime.chat_template_source is not None
    chat = has_template and not args.raw
    if args.system and not chat:
        why = ("--raw leaves the chat template out" if has_template
               else f"{name} has no chat template (a base model)")
        raise ValueError(f"--system: a system message needs the chat template, and {why}; put the text in the "
                         "prompt")
    session = Session(model, name, chat=chat, system=args.system or None, options=options, verbose=args.verbose,
                      load_s=load_s)
    if prompt is None:
        return session.repl()
    return 0 if session.answer(prompt) else EXIT_INTERRUPTED


def _trained_context(path: Any, given: str) -> int:
    from bubo import GGUFFile

    with GGUFFile(path) as f:
        md = f.metadata
    n = md.get(f"{md.get('general.architecture')}.context_length")
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"{given}: {path} does not record the context it was trained with: give a size (-c 4096)")
    return n


def _run_prompt(args: argparse.Namespace, words: list[str]) -> str | None:
    """The prompt to answer, or None for an interactive chat. Text piped to stdin is read as the
    prompt; with a PROMPT too, the stdin text comes first, then a blank line, then PROMPT (Ollama
    puts stdin first as well). `-p -` reads the prompt from stdin, a terminal's too."""
    prompt: str | None = " ".join(words) if words else args.prompt
    if prompt == "-" and not words:
        text = sys.stdin.read()
        if not text.strip():
            raise ValueError(f"{_given_as(args, 'prompt', '--prompt', '-')}: stdin gave no text")
        return text.rstrip("\n")
    if not sys.stdin.isatty():
        text = sys.stdin.read().rstrip("\n")
        if text:
            prompt = text if prompt is None else f"{text}\n\n{prompt}"
        elif prompt is None:
            raise ValueError("no prompt: stdin is not a terminal and gave no text; give PROMPT (or -p)")
    if prompt is not None and not prompt.strip():
        raise ValueError("the prompt is empty")
    return prompt


def _rm(args: argparse.Namespace) -> int:
    from bubo import store

    status = 0
    for name in args.names:
        try:
            removed = store.remove(name)
        except store.UnknownModelError as e:
            print(f"bubo rm: error: {e}", file=sys.stderr)
            status = EXIT_ERROR
            continue
        print(f"deleted '{removed.name}'")
    return status


def _show(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bubo import store
    from bubo.cli_chat import ModelCard, parameters_text

    given = args.name
    store.stored_models()  # adopts models stored at the legacy location
    if Path(given).is_file():
        path, name = Path(given), given
    elif (canonical := store.catalog_name(given)) is not None:
        if not store.is_stored(canonical):
            raise FileNotFoundError(f"{canonical} is not stored; get it with `bubo pull {canonical}`")
        path, name = store.model_path(canonical), canonical
    elif given.endswith(".gguf") and os.sep not in given and (store.models_dir() / given).is_file():
        path, name = store.models_dir() / given, given
    else:
        path, name = store.resolve(given), given  # raises: no such file, or not a catalog name
    card = ModelCard.read(path, name)
    if args.template:
        if card.template is None:
            raise ValueError(f"{name} has no chat template (a base model)")
        print(card.template)
    elif args.license:
        if card.license is None:
            raise ValueError(f"{name}'s file names no license")
        print(card.license)
    elif args.parameters:
        print(parameters_text({}, header=False))
    else:
        print(card.full())
    return 0


def _ps(args: argparse.Namespace) -> int:
    """What a running server serves: GET /v1/models (each model's status and context), and
    GET /slots for a loaded model's busy slots."""
    import urllib.error
    import urllib.parse
    import urllib.request

    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(args.host, args.host)
    base = f"http://[{host}]:{args.port}" if ":" in host else f"http://{host}:{args.port}"
    keys = _csv(args.api_key)
    headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}

    def get(path: str) -> Any:
        req = urllib.request.Request(base + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 401:
                raise RuntimeError(f"the server at {base} refused "
                                   f"{'the API key given' if keys else 'to answer without an API key'}: give its "
                                   "key with --api-key or BUBO_ARG_API_KEY") from None
            raise RuntimeError(f"the server at {base} answered GET {path} with HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", None) or e
            raise RuntimeError(f"no server answers at {base} ({why}); start one with `bubo serve`") from None
        except ValueError:
            raise RuntimeError(f"the server at {base} answered GET {path} with something that is not JSON") from None

    listing = get("/v1/models")
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise RuntimeError(f"the server at {base} answered GET /v1/models without a \"data\" list")
    aliases_of: dict[str, list[str]] = {}
    for m in data:
        if isinstance(m, dict) and isinstance(m.get("alias_of"), str):
            aliases_of.setdefault(m["alias_of"], []).append(str(m.get("id")))
    rows = [("NAME", "STATUS", "CONTEXT", "SLOTS", "ALIASES")]
    for m in data:
        if not isinstance(m, dict) or "alias_of" in m:
            continue
        status = m.get("status")
        state = str(status.get("value", "?")) if isinstance(status, dict) else "loaded"
        slots = "-"
        if state in ("loaded", "sleeping"):
            try:
                got = get(f"/slots?model={urllib.parse.quote(str(m.get('id', '')))}")
                if isinstance(got, list) and got:
                    slots = f"{sum(1 for s in got if s.get('is_processing'))}/{len(got)} busy"
            except RuntimeError:
                pass  # --no-slots, or a server without /slots
        given = [a for a in m.get("aliases") or [] if isinstance(a, str)]
        aliases = ", ".join(dict.fromkeys([*given, *aliases_of.get(str(m.get("id")), [])])) or "-"
        rows.append((str(m.get("id", "?")), state, str(m.get("context_length", "?")), slots, aliases))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


# --- bench ---------------------------------------------------------------------------------


def bench(path: Any, n_prompt: int, n_gen: int, n_threads: int | None, reps: int,
          n_depth: int = 0, type_k: str = "f16", type_v: str = "f16") -> list[dict[str, Any]]:
    """llama-bench's two tests on the native model: `pp` decodes n_prompt tokens as one batch,
    `tg` decodes n_gen tokens one at a time, each after n_depth tokens already in the cache
    (decoded once, untimed; 0: an empty cache), in a KV cache of type_k and type_v; each after a
    warm-up run, `reps` times. Random tokens, as llama-bench uses: speed does not depend on the
    text."""
    import numpy as np

    from bubo import GGUFFile, store

    if n_prompt < 0 or n_gen < 0 or (n_prompt == 0 and n_gen == 0):
        raise ValueError("give -p and/or -n as positive token counts")
    if reps <= 0:
        raise ValueError("-r must be at least 1")
    if n_depth < 0:
        raise ValueError(f"-d {n_depth}: the depth is a token count, 0 or more")
    path = store.resolve(path)
    from bubo._model import KVCache
    from bubo._model import Model as NativeModel

    with GGUFFile(path) as f:
        md = f.metadata
        size = sum(t.nbytes for t in f.tensors)
        params = sum(int(np.prod(t.shape)) for t in f.tensors)
    n_ctx = n_depth + max(n_prompt, n_gen, 1) + 1
    n_ctx_train = md.get(f"{md.get('general.architecture')}.context_length")
    if n_depth and isinstance(n_ctx_train, int) and n_ctx > n_ctx_train:
        raise ValueError(f"-d {n_depth}: the depth and the test ({n_ctx} tokens) pass the model's context "
                         f"({n_ctx_train})")
    model = NativeModel(str(path), n_threads or 0)
    threads = n_threads or os.cpu_count() or 1
    kv = KVCache(model, n_ctx, type=type_k, type_v=type_v)
    rng = np.random.default_rng(0)
    n_vocab = model.n_vocab
    depth = rng.integers(0, n_vocab, n_depth, dtype=np.int32)
    for a in range(0, n_depth, 512):  # the depth, once: each test truncates back to it
        b = min(a + 512, n_depth)
        model.decode(kv, depth[a:b], np.arange(a, b, dtype=np.int32), np.zeros(b - a, dtype=np.int32),
                     np.zeros(b - a, dtype=bool))

    def run_pp() -> float:
        kv.truncate(0, n_depth)
        toks = rng.integers(0, n_vocab, n_prompt, dtype=np.int32)
        rows = np.zeros(n_prompt, dtype=bool)
        rows[-1] = True
        t0 = time.perf_counter()
        model.decode(kv, toks, np.arange(n_depth, n_depth + n_prompt, dtype=np.int32),
                     np.zeros(n_prompt, dtype=np.int32), rows)
        return time.perf_counter() - t0

    def run_tg() -> float:
        kv.truncate(0, n_depth)
        toks = rng.integers(0, n_vocab, n_gen, dtype=np.int32)
        one_row = np.ones(1, dtype=bool)
        seq = np.zeros(1, dtype=np.int32)
        t0 = time.perf_counter()
        for i in range(n_gen):
            model.decode(kv, toks[i : i + 1], np.array([n_depth + i], dtype=np.int32), seq, one_row)
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
            "n_threads": threads, "test": f"{test}{n}" + (f" @ d{n_depth}" if n_depth else ""),
            "n_prompt": n if test == "pp" else 0, "n_gen": n if test == "tg" else 0, "n_depth": n_depth,
            "type_k": type_k, "type_v": type_v,
            "avg_ts": statistics.mean(speeds),
            "stddev_ts": statistics.stdev(speeds) if len(speeds) > 1 else 0.0, "samples_ts": speeds,
        })
    return results


BENCH_EDIT = ("Rename the variable `total` to `acc` everywhere in this function and answer with the whole function "
              "only.\n\n```python\ndef mean_and_spread(values):\n    total = 0\n    for v in values:\n"
              "        total += v\n    mean = total / len(values)\n    total = 0\n    for v in values:\n"
              "        total += (v - mean) ** 2\n    return mean, (total / len(values)) ** 0.5\n```")
BENCH_CODE = ("Write a Python function that parses a CSV file into a list of dictionaries, with type hints and a "
              "docstring.")


def bench_draft(path: Any, draft: str, n_gen: int, n_threads: int | None, reps: int,
                prompts: list[str] | None = None) -> list[dict[str, Any]]:
    """Generation with speculative decoding against without it: greedy chat answers of at most
    n_gen tokens to each prompt, by two bubo.Model instances of the same model (one drafting:
    prompt lookup for draft "ngram", else the draft model `draft`), alternated `reps` times after
    a warm-up. Tokens per second are the answers' own (Timings.predicted_*), summed."""
    from bubo import store
    from bubo.engine.draft import DraftConfig
    from bubo.llm import Model

    if n_gen <= 0 or reps <= 0:
        raise ValueError("give -n and -r as positive counts")
    path = store.resolve(path)
    config = DraftConfig() if draft == "ngram" else DraftConfig(model=draft)
    prompts = prompts or [BENCH_EDIT if draft == "ngram" else BENCH_CODE]
    with Model(path, n_ctx=4096, n_threads=n_threads, draft=False) as plain, \
            Model(path, n_ctx=4096, n_threads=n_threads, draft=config) as drafted:
        sums = {"plain": [0, 0.0], "drafted": [0, 0.0]}
        n_drafted = n_kept = 0
        same = True
        for rep in range(reps + 1):
            for p in prompts:
                msgs = [{"role": "user", "content": p}]
                a = plain.chat(msgs, max_tokens=n_gen, temperature=0)
                b = drafted.chat(msgs, max_tokens=n_gen, temperature=0)
                if rep == 0:
                    continue  # the warm-up: page the weights in, learn what a pass costs
                same = same and a.tokens == b.tokens
                for key, c in (("plain", a), ("drafted", b)):
                    sums[key][0] += c.timings.predicted_n
                    sums[key][1] += c.timings.predicted_s
                n_drafted += b.timings.draft_n
                n_kept += b.timings.draft_n_accepted
    plain_ts, drafted_ts = (sums[k][0] / sums[k][1] if sums[k][1] else 0.0 for k in ("plain", "drafted"))
    return [{"model": str(path.name), "draft": draft, "n_threads": n_threads or os.cpu_count() or 1,
             "test": f"tg{n_gen} x{len(prompts)}", "plain_ts": plain_ts, "drafted_ts": drafted_ts,
             "speedup": drafted_ts / plain_ts if plain_ts else 0.0, "draft_n": n_drafted,
             "draft_n_accepted": n_kept, "same_answers": same}]


def draft_table(results: list[dict[str, Any]]) -> str:
    lines = ["| model | draft | threads | test | plain t/s | drafted t/s | drafted / plain | drafted tokens kept "
             "| same answers |", "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        n, k = r["draft_n"], r["draft_n_accepted"]
        kept = f"{k}/{n} ({k / n:.0%})" if n else "0/0"
        lines.append(f"| {r['model']} | {r['draft']} | {r['n_threads']} | {r['test']} | {r['plain_ts']:.2f} | "
                     f"{r['drafted_ts']:.2f} | {r['speedup']:.2f}x | {kept} | {r['same_answers']} |")
    return "\n".join(lines)


def markdown_table(results: list[dict[str, Any]]) -> str:
    """llama-bench's markdown table (with its type_k and type_v columns where a cache is not f16)."""
    types = any(r.get("type_k", "f16") != "f16" or r.get("type_v", "f16") != "f16" for r in results)
    head: tuple[str, ...] = ("model", "size", "params", "backend", "threads") + (
        ("type_k", "type_v") if types else ()) + ("test", "t/s")
    right: tuple[bool, ...] = (False, True, True, False, True) + ((False, False) if types else ()) + (True, True)
    rows = []
    for r in results:
        p = r["model_n_params"]
        rows.append((
            r["model"], f"{r['model_size'] / 1024**2:.2f} MiB",
            f"{p / 1e9:.2f} B" if p >= 1e9 else f"{p / 1e6:.2f} M",
            r["backend"], str(r["n_threads"]),
        ) + ((r.get("type_k", "f16"), r.get("type_v", "f16")) if types else ()) + (
            r["test"], f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}",
        ))
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(head)]
    widths[0] = max(widths[0], 30)
    widths[-1] = max(widths[-1], 20)

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if r else "-" * w for w, r in zip(widths, right)) + " |"
    return "\n".join([line(head), sep] + [line(row) for row in rows])


def _bench(args: argparse.Namespace) -> int:
    if args.draft is not None:
        results = bench_draft(args.model, args.draft, args.n_gen, args.threads, args.repetitions, args.prompt)
        print(json.dumps(results, indent=2) if args.output == "json" else draft_table(results))
        return 0
    check_cache_flags(args)
    results = bench(args.model, args.n_prompt, args.n_gen, args.threads, args.repetitions, args.n_depth,
                    args.cache_type_k or "f16", args.cache_type_v or "f16")
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        print(markdown_table(results))
    return 0


_COMMANDS = {"serve": _serve, "pull": _pull, "convert": _convert, "list": _list, "run": _run, "rm": _rm,
             "show": _show, "ps": _ps, "bench": _bench,
             "ray-serve": _ray_serve}
