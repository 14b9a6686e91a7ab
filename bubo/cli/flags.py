"""The command line's parser: llama.cpp's flag names, each also read from BUBO_ARG_<LONG NAME>
(BUBO_ARG_MODEL, BUBO_ARG_CTX_SIZE, ...; a flag on the command line wins over its variable).
`serve`'s defaults are ServeOptions' (bubo/api/options.py), which has them from their owners."""

from __future__ import annotations

import argparse
import difflib
import os
import re
from typing import Any, NoReturn

from bubo import sampling
from bubo.api.config import REASONING_FORMATS
from bubo.api.options import LOG_FORMATS, POOLINGS, ServeOptions
from bubo.engine.memory import KV_TYPES, KV_TYPES_K, check_cache_type

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
SERVE = ServeOptions.defaults()

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ArgParser(argparse.ArgumentParser):
    """argparse's parser without its prefix matching (`--chat-template` is never taken for
    `--chat-template-file`), with a "did you mean" for a mistyped flag or command."""

    intermixed = False  # positionals may come between flags (bubo run MODEL -n 8 PROMPT)
    _mixing = False

    def __init__(self, *args: Any, **kw: Any):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, but an unknown flag is reported by the command's parser that saw it,
        with the flag of that command it is closest to."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            target = self._command_parser(getattr(ns, "command", None)) or self
            flag = next((e for e in extras if e.startswith("-")), None)
            close = difflib.get_close_matches(flag.split("=", 1)[0], target._option_string_actions, n=1,
                                              cutoff=0.6) if flag else []
            hint = f"; did you mean {close[0]}?" if close else ""
            target.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return ns

    def _command_parser(self, command: str | None) -> ArgParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                found = action.choices[command]
                return found if isinstance(found, ArgParser) else None
        return None

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        if not self.intermixed or self._mixing:
            return super().parse_known_args(args, namespace)
        self._mixing = True  # parse_known_intermixed_args calls this again for each of its passes
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False

    def error(self, message: str) -> NoReturn:
        """One line naming the flag as typed, and where the help is (argparse prints the usage too);
        a mistyped command or choice gets the one it is closest to."""
        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if bad:
            close = difflib.get_close_matches(bad.group(1), re.findall(r"'([^']*)'", bad.group(2)), n=1, cutoff=0.6)
            if close:
                message += f"; did you mean {close[0]}?"
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def add_flag(self, *flags: str, **kw: Any) -> argparse.Action:
        """add_argument whose default comes from BUBO_ARG_<LONG NAME> when that is set."""
        long = next(f for f in flags if f.startswith("--"))
        env = "BUBO_ARG_" + long[2:].upper().replace("-", "_")
        value = os.environ.get(env)
        if value is not None:
            if kw.get("action") == "append":  # FILE,FILE or, for two values, FILE VALUE
                kw["default"] = [value.split()] if kw.get("nargs") == 2 else [v for v in value.split(",") if v]
            elif kw.get("action") == "store_true":
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


def given_as(args: argparse.Namespace, dest: str, long: str, value: Any) -> str:
    """How the user gave a flag's value: `-c -5` as typed, or `BUBO_ARG_CTX_SIZE=-5`."""
    typed = (getattr(args, "typed_flags", None) or {}).get(dest)
    if typed is not None:
        return f"{typed} {value}"
    env = "BUBO_ARG_" + long[2:].upper().replace("-", "_")
    if env in os.environ:
        return f"{env}={os.environ[env]}"
    return f"{long} {value}"



def build_parser() -> ArgParser:
    parser = ArgParser(prog="bubo", description="bubo: a local LLM inference server for GGUF models")
    parser.add_argument("--version", action="version", version=f"bubo {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgParser)

    p = sub.add_parser("serve", help="start the HTTP server (OpenAI, Anthropic, llama-server and Ollama APIs)")
    p.add_flag("-m", "--model", default=SERVE["model"], action=_ModelsAction,
               help=f"catalog name or GGUF path (default {SERVE['model']}); give -m several times to serve "
                    "several models")
    p.set_defaults(models=[])
    p.add_flag("--models-dir", default=None, help="serve every .gguf file in this folder (router mode)")
    p.add_flag("--models-preset", default=None,
               help="INI file of per-model settings: [*] for every model, [name] for one; keys are flag names")
    p.add_flag("--models-max", type=int, default=SERVE["models_max"],
               help=f"models loaded at once (0: no limit; default {SERVE['models_max']}); loading one more first "
                    "unloads the least recently used idle one")
    p.add_flag("--no-models-autoload", action="store_true",
               help="load models only at start or through POST /models/load, not on their first request")
    p.add_flag("--sleep-idle-seconds", type=float, default=None,
               help="a model idle this long releases its memory and reloads on its next request")
    p.add_flag("--host", default=SERVE["host"],
               help="address to listen on (keep loopback unless remote clients must connect)")
    p.add_flag("--port", type=int, default=SERVE["port"], help="port (0: any free port, logged)")
    p.add_flag("--no-webui", action="store_true", help="no chat page at / (browsers get a short page about the server)")
    p.add_flag("--ui-config", default=None,
               help='the chat page\'s defaults for new conversations, JSON or a JSON file: {"temperature": 0.7, '
                    '"system": "...", "max_tokens": 512, ...}')
    p.add_flag("--embedding", "--embeddings", action="store_true",
               help="serve an embedding model (bert, e.g. all-minilm:l6-v2) for /v1/embeddings; a text-generation "
                    "model is refused (an embedding model is served for embeddings with or without the flag)")
    p.add_flag("--pooling", choices=POOLINGS, default=None,
               help="how an embedding model pools its token rows (default: the model file's pooling_type)")
    p.add_flag("--ollama", action="store_true",
               help="also listen on Ollama's port 11434, for clients that assume it (every route answers on both)")
    p.add_flag("--served-model-name", default=None, help="the model id clients use (default: the model's name)")
    p.add_flag("-a", "--alias", default=None, help="more accepted model names, comma-separated")
    p.add_flag("-c", "--ctx-size", type=int, default=None,
               help="context size in tokens (default: the trained context, capped by memory)")
    p.add_flag("-t", "--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_flag("-tb", "--threads-batch", type=int, default=None,
               help="CPU threads for prompt processing, any step of several tokens (default: as -t); a one-token "
                    "step uses -t")
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
    p.add_flag("-to", "--timeout", type=float, default=SERVE["timeout"],
               help="the longest a request's body may take to arrive, seconds (a body must also keep to "
                    "64 KiB/s after the first --header-timeout seconds)")
    p.add_flag("--header-timeout", type=float, default=SERVE["header_timeout"],
               help="seconds from a request's first byte to the end of its headers (then 408 and closed)")
    p.add_flag("--keepalive-timeout", type=float, default=SERVE["keepalive_timeout"],
               help="seconds a connection may wait for its next request before it is closed")
    p.add_flag("--drain-timeout", type=float, default=SERVE["drain_timeout"],
               help="on SIGTERM or SIGINT, how long requests in flight may go on before they are ended with an "
                    "error event (a second signal ends them at once)")
    p.add_flag("--prepare-timeout", type=float, default=SERVE["prepare_timeout"],
               help="seconds of work a request may cost before it is generated (reading its JSON, converting a "
                    "schema, rendering the template, tokenizing); past it, 400 too_costly and the work is dropped")
    p.add_flag("--write-timeout", type=float, default=SERVE["write_timeout"],
               help="seconds a client may leave an answer unread (its socket full) before its connection is "
                    "closed and its generation ended")
    p.add_flag("--host-allow", default=None,
               help="more host names clients may reach this server by (the Host header), comma-separated "
                    "(.example.com: it and every name under it; *: any); loopback names and IP addresses are "
                    "always allowed, and any name when the server has an API key")
    p.add_flag("--slot-save-path", default=None, metavar="DIR",
               help="the folder POST /slots/{id}?action=save writes slot files to, and action=restore reads them "
                    "from (without it, slot actions are off)")
    p.add_flag("--responses-max", type=int, default=SERVE["responses_max"], metavar="N",
               help="stored responses (POST /v1/responses with store, the default) kept at most, in "
                    "$BUBO_HOME/responses.sqlite3; past it the least recently used go (0: store none)")
    p.add_flag("--lora", action="append", default=[], metavar="FILE",
               help="a LoRA adapter (llama.cpp's GGUF, or bubo convert-lora's) applied at scale 1; repeat for several")
    p.add_flag("--lora-scaled", action="append", nargs=2, default=[], metavar=("FILE", "SCALE"),
               help="a LoRA adapter applied at SCALE; repeat for several")
    p.add_flag("--lora-init-without-apply", action="store_true",
               help="load the adapters at scale 0: POST /lora-adapters (or a request's lora field) applies them")
    p.add_flag("--sign-key", default=None, metavar="FILE",
               help="sign the receipts of requests that ask for one (\"receipt\": true) with this Ed25519 "
                    "private key (made by bubo receipt-key; needs pip install 'bubo[receipts]')")
    p.add_flag("--allow-copy", action="store_true",
               help="let POST /api/copy copy a model's file where it cannot make a hard link (another "
                    "filesystem), within the disk space a pull would check")
    p.add_flag("--max-connections", type=int, default=None,
               help="open connections at most (default 4096, kept 256 below the open-file limit); past it "
                    "the connection waiting longest for a request is closed, or the newcomer gets 503")
    p.add_flag("--api-key", default=None, help="require this key (several: comma-separated)")
    p.add_flag("--api-key-file", default=None,
               help="file of keys, one per line (# comments); a line 'NAME KEY' names the key's caller (the "
                    "log, /metrics and /slots show it; each caller sees only its own stored responses, contexts "
                    "and slot files). Read again on SIGHUP")
    p.add_flag("--caller-max-slots", type=int, default=None, metavar="N",
               help="generations one caller (a named key; the unnamed keys together) may run at once; past it "
                    "429 with Retry-After")
    p.add_flag("--no-mcp", action="store_true", help="turn off the Model Context Protocol endpoint, /mcp")
    p.add_flag("--chat-template-file", default=None, help="a Jinja chat template to use instead of the model's own")
    p.add_flag("--chat-template", default=None, metavar="NAME",
               help="one of llama.cpp's built-in chat templates by name instead of the model's own: chatml, llama3, "
                    "gemma, mistral-v7, phi3, ... (a wrong name lists them all)")
    p.add_flag("--reasoning-format", choices=REASONING_FORMATS, default=SERVE["reasoning_format"],
               help="a thinking model's reasoning: in reasoning_content (deepseek; auto, the default, likewise), or "
                    "left in the answer's content as the model wrote it, <think> tags and all (none); a request's "
                    "own reasoning_format wins")
    p.add_flag("--cache-reuse", type=int, default=SERVE["cache_reuse"], metavar="N",
               help="accepted for llama-server's sake: bubo reuses the longest cached prefix of a prompt in any "
                    "slot; chunks after the first difference are computed again (not shifted)")
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
    p.add_flag("-lv", "--log-verbosity", "--verbosity", type=int, default=None, metavar="N",
               help="llama.cpp's log threshold: 0 or 1 errors only, 2 warnings too, 3 the usual lines (the "
                    "default), 4 or more debug lines as -v")
    p.add_flag("--log-format", choices=LOG_FORMATS, default=SERVE["log_format"],
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

    p = sub.add_parser("convert-lora", help="convert a PEFT LoRA checkpoint to a GGUF adapter (serve --lora)")
    p.add_argument("src", metavar="PEFT_DIR", help="the checkpoint's directory: adapter_config.json, "
                   "adapter_model.safetensors")
    p.add_argument("out", metavar="OUT.gguf", help="the GGUF file to write (replaced only once complete)")
    p.add_flag("--base", required=True, metavar="MODEL",
               help="the base model the adapter was trained on: a catalog name or a GGUF path (its tensor names "
                    "and shapes)")
    p.add_flag("--type", dest="out_type", choices=("f32", "f16"), default="f32", help="the tensors' type (default f32)")

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

    p = sub.add_parser("verify-receipt",
                       help="rerun an answer's receipt here and say whether it is the same, bit for bit")
    p.add_argument("file", metavar="FILE", help="the receipt (JSON), or a response that carries one")
    p.add_flag("-m", "--model", default=None,
               help="the model file to rerun with (default: the receipt's path, else its catalog name)")
    p.add_flag("--public-key", default=None, metavar="FILE",
               help="require a signature by this key (a .pub file that bubo receipt-key made)")
    p.add_flag("-t", "--threads", type=int, default=None,
               help="CPU threads (default: all; answers do not depend on it)")

    p = sub.add_parser("receipt-key", help="make an Ed25519 key pair to sign receipts with (serve --sign-key)")
    p.add_argument("file", metavar="FILE", help="the private key's file; the public key goes to FILE.pub")

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



def add_cache_type_flags(p: ArgParser) -> None:
    p.add_flag("-ctk", "--cache-type-k", default=None, metavar="TYPE",
               help=f"the KV cache's K rows stored as {', '.join(KV_TYPES_K)} (default f16; q8_0 takes about half "
                    "the memory)")
    p.add_flag("-ctv", "--cache-type-v", default=None, metavar="TYPE",
               help=f"the V rows, likewise: {', '.join(KV_TYPES)}")


def check_cache_flags(args: argparse.Namespace) -> None:
    """ValueError naming -ctk/-ctv as given for a type the KV cache does not store."""
    for dest, long in (("cache_type_k", "--cache-type-k"), ("cache_type_v", "--cache-type-v")):
        value = getattr(args, dest, None)
        if value is not None:
            check_cache_type(value, long, k=dest == "cache_type_k", given=given_as(args, dest, long, value))


def add_sampling_flags(p: ArgParser, *, server: bool) -> None:
    """llama.cpp's sampling flags. On `serve` they are the defaults of requests that do not set
    the field (as llama-server's are); on `run`, the answer's settings."""
    who = "default for requests that do not set it" if server else "default: llama.cpp's"
    for f in sampling.flagged():  # each SamplingParams field's flag, under the field's name
        names = [f.metadata["short"], f.metadata["flag"]] if f.metadata["short"] else [f.metadata["flag"]]
        p.add_flag(*names, dest=f.name, type=int if f.type == "int" else float, default=None,
                   help=f"{f.metadata['doc']} ({who}: {f.default})")
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
    (("--control-vector", "--control-vector-scaled"), True,
     "control vectors are not supported (LoRA adapters are: --lora)"),
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


def add_habit_flags(p: ArgParser) -> None:
    p.set_defaults(habit_notes=[])
    for table, refused in ((HABIT_NOTES, False), (HABIT_REFUSED, True)):
        for flags, takes_value, note in table:
            # -fa takes an optional on/off/auto (llama-server's newer form) or nothing
            nargs = 1 if takes_value else "?"
            p.add_argument(*flags, action=_HabitAction, note=note, refused=refused, nargs=nargs,
                           dest="habit_" + flags[-1].lstrip("-").replace("-", "_"), help=argparse.SUPPRESS)


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("bubo")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"



def csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]

