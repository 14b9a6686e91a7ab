"""`bubo run`'s conversation: one streamed answer, or an interactive chat as `ollama run` has it.

A Session holds the loaded Model, the conversation (user and assistant messages, the system
message apart) and the sampling options the user set. answer() streams one reply to stdout; the
interactive loop (repl) reads lines with readline and keeps the conversation across turns:

    >>> Why is the sky blue?         a message; the reply streams below it
    >>> \"\"\"                         a multi-line message, up to a line ending in \"\"\"
    >>> /set temperature 0.7         and the other commands /? lists

Ctrl-C while a reply streams stops it: the part already shown stays in the conversation (the
model said it, and the next turn may refer to it; a reply stopped before its first word is
dropped with the message that asked for it). Ctrl-C at the prompt clears the line, Ctrl-D or
/bye leaves.

With a chat template the conversation is rendered by it; without one (a base model), or with
--raw, the conversation is one running text that the model continues: each message is added
to it as typed, on a new line, and each reply continues it.

When the conversation outgrows the context, its oldest messages are dropped (said on stderr)
so that the newest message keeps room for its answer, as Ollama truncates a conversation to
num_ctx.

bubo show's model card (ModelCard) lives here too: /show prints the same parts.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from bubo import sampling

if TYPE_CHECKING:
    from bubo.llm import Model, TextStream

PROMPT = ">>> "
ALT_PROMPT = "... "
MULTILINE = '"""'
EXIT_HINT = "Use Ctrl + d or /bye to exit."
HISTORY_LENGTH = 1000

# the options a session sets (/set parameter, --temp ...): every SamplingParams field with a flag,
# under its name (Ollama's), and num_predict; their help is the field's doc
OPTIONS: dict[str, type] = {f.name: int if f.type == "int" else float for f in sampling.flagged()}
OPTIONS["num_predict"] = int
OPTION_ALIASES = {"temp": "temperature", "n_predict": "num_predict", "n": "num_predict",
                  "max_tokens": "num_predict"}
OPTION_HELP = {f.name: f.metadata["doc"] for f in sampling.flagged()}
OPTION_HELP["num_predict"] = "most tokens in an answer (-1: until the model stops or the context is full)"
DEFAULT_NUM_PREDICT = -1


def option_defaults() -> dict[str, Any]:
    """What each option is when the user sets none: bubo.sampling's defaults (llama.cpp's)."""
    from bubo.sampling import SamplingParams

    d = SamplingParams()
    out: dict[str, Any] = {k: getattr(d, k) for k in OPTIONS if k != "num_predict"}
    out["num_predict"] = DEFAULT_NUM_PREDICT
    return out


def check_option(name: str, value: Any) -> None:
    """ValueError when `value` is not a valid value of option `name`; the message says why
    without naming the option (the caller names it as the user wrote it: --top-p, /set top_p)."""
    if name == "num_predict":
        if value == 0 or value < -1:
            raise ValueError("give a positive number of tokens, or -1 for no limit")
        return
    from bubo.sampling import SamplingParams

    try:
        SamplingParams(**{name: value})
    except ValueError as e:
        msg = str(e)
        msg = msg.removeprefix(f"{name} ").replace(f", got {value!r}", "")
        raise ValueError(msg) from None


def parse_option(name: str, text: str) -> tuple[str, int | float]:
    """(the option's name, its value) from `/set name text`; ValueError saying what is wrong."""
    key = OPTION_ALIASES.get(name, name)
    kind = OPTIONS.get(key)
    if kind is None:
        if key in ("num_ctx", "ctx_size"):
            raise ValueError("the context is set when the model loads: run again with -c N")
        raise ValueError(f"unknown parameter; the parameters are {', '.join(OPTIONS)}")
    try:
        value: int | float = kind(text)
    except ValueError:
        raise ValueError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    check_option(key, value)
    return key, value


# --- the model card (bubo show, /show) ----------------------------------------------------------


@dataclass(frozen=True)
class ModelCard:
    """What `bubo show` prints, read from the GGUF metadata (the model is not loaded)."""

    name: str
    path: Path
    size: int
    architecture: str
    parameters: int
    context_length: int | None
    embedding_length: int | None
    quantization: str
    template: str | None
    license: str | None

    @classmethod
    def read(cls, path: str | os.PathLike[str], name: str) -> ModelCard:
        from bubo import GGUFFile
        from bubo.store import FILE_TYPE_NAMES

        with GGUFFile(path) as f:
            md = f.metadata
            params = sum(math.prod(t.shape) for t in f.tensors)
        arch = str(md.get("general.architecture", "?"))
        ft = md.get("general.file_type")
        quant = FILE_TYPE_NAMES.get(ft, f"type {ft}") if isinstance(ft, int) else "?"
        template = md.get("tokenizer.chat_template")
        lic = [str(md[k]) for k in ("general.license", "general.license.name", "general.license.link") if md.get(k)]

        def num(key: str) -> int | None:
            v = md.get(f"{arch}.{key}")
            return int(v) if isinstance(v, int) else None

        from bubo.store import catalog_license

        return cls(name, Path(path), os.path.getsize(path), arch, params, num("context_length"),
                   num("embedding_length"), quant, template if isinstance(template, str) and template else None,
                   "\n".join(dict.fromkeys(lic)) or catalog_license(name) or catalog_license(str(path)))

    def info(self) -> str:
        p = self.parameters
        rows = [
            ("architecture", self.architecture),
            ("parameters", f"{p / 1e9:.1f}B" if p >= 1e9 else f"{p / 1e6:.1f}M"),
            ("context length", str(self.context_length or "?")),
            ("embedding length", str(self.embedding_length or "?")),
            ("quantization", self.quantization),
            ("file", f"{self.path} ({self.size / 1e6:.0f} MB)"),
        ]
        return _section("Model", [f"{k:<20}{v}" for k, v in rows])

    def capabilities(self) -> str:
        if self.architecture == "bert":
            return _section("Capabilities", ["embedding"])
        return _section("Capabilities", ["completion", "chat"] if self.template else ["completion"])

    def template_summary(self) -> str:
        if self.template is None:
            return _section("Template", ["none: a base model (bubo run completes the text as it is)"])
        first = self.template.strip().splitlines()[0]
        more = f"... ({len(self.template)} characters: --template prints it)"
        return _section("Template", [(first[:90] + " " if len(first) > 90 else first + " ") + more])

    def license_summary(self) -> str:
        return _section("License", (self.license or "none given in the file").splitlines())

    def full(self) -> str:
        return "\n".join([self.info(), self.capabilities(), parameters_text({}), self.template_summary(),
                          self.license_summary()])


def _section(title: str, lines: list[str]) -> str:
    return "\n".join([f"  {title}", *(f"    {row}" for line in lines for row in line.splitlines() or [""]), ""])


def parameters_text(user: Mapping[str, Any], *, header: bool = True) -> str:
    """The sampling defaults, and what the session set (Ollama's /show parameters); header
    False: just the `name value` lines (bubo show --parameters)."""
    lines = [f"{k:<20}{v}" for k, v in option_defaults().items()]
    if not header:
        return "\n".join(lines)
    out = _section("Parameters", lines)
    if user:
        out += "\n" + _section("Set for this session", [f"{k:<20}{v}" for k, v in user.items()])
    return out


# --- one conversation -----------------------------------------------------------------------


@dataclass
class Stats:
    """One answer's timings, printed by --verbose as Ollama prints them.

    The library's Completion does not carry the engine's timings (a `timings` attribute, once it
    has one, is used instead), so these are measured here around the stream, as a client
    measures them: the prompt from the call to the first piece of text (computing the prompt and
    sampling the first token), the generation from there to the end, over the tokens after the
    first. The prompt's count is then the whole prompt: in a chat's later turns most of it comes
    from the cache (the conversation so far), and its rate counts those tokens too."""

    total_s: float  # the load's time too, when load_s is told: load + prompt + generation <= total
    load_s: float | None
    prompt_n: int
    prompt_s: float
    eval_n: int
    eval_s: float
    cached_n: int | None = None  # prompt tokens taken from the cache, when the library tells
    eval_timed_n: int | None = None  # the tokens eval_s covers (None: all eval_n)

    def text(self) -> str:
        def dur(s: float) -> str:
            return f"{s * 1000:.2f}ms" if s < 1 else f"{s:.3f}s"

        def rate(n: int, s: float) -> str:
            return f"{n / s:.2f} tokens/s" if s > 0 and n > 0 else "-"

        rows = [("total duration", dur(self.total_s))]
        if self.load_s is not None:
            rows.append(("load duration", dur(self.load_s)))
        cached = f" ({self.cached_n} more from the cache)" if self.cached_n else ""
        rows += [
            ("prompt eval count", f"{self.prompt_n} token(s){cached}"),
            ("prompt eval duration", dur(self.prompt_s)),
            ("prompt eval rate", rate(self.prompt_n, self.prompt_s)),
            ("eval count", f"{self.eval_n} token(s)"),
            ("eval duration", dur(self.eval_s)),
            ("eval rate", rate(self.eval_n if self.eval_timed_n is None else self.eval_timed_n, self.eval_s)),
        ]
        return "\n".join(f"{k + ':':<22}{v}" for k, v in rows)


class Session:
    """One model's conversation. chat: render it with the model's chat template (False: one
    running text, continued). options: the /set options the user gave (the rest default)."""

    def __init__(self, model: Model, name: str, *, chat: bool, system: str | None = None,
                 options: Mapping[str, Any] | None = None, verbose: bool = False, load_s: float | None = None,
                 out: TextIO | None = None, err: TextIO | None = None):
        self.model = model
        self.name = name
        self.chat = chat
        self.system = system
        self.options: dict[str, Any] = dict(options or {})
        self.verbose = verbose
        self.messages: list[dict[str, str]] = []  # user and assistant turns, in order
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self._load_s = load_s  # reported with the first answer's stats

    # --- prompts ----------------------------------------------------------------------------

    def _chat_messages(self, history: list[dict[str, str]], text: str) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, *history, {"role": "user", "content": text}]

    @staticmethod
    def _running_text(history: list[dict[str, str]], text: str) -> str:
        """The raw conversation: messages on a new line each, replies continuing them."""
        out = ""
        for m in [*history, {"role": "user", "content": text}]:
            if m["role"] == "user" and out and not out.endswith("\n"):
                out += "\n"
            out += m["content"]
        return out

    def _prompt_tokens(self, history: list[dict[str, str]], text: str) -> int:
        m = self.model
        if self.chat:
            rendered = m.chat_prompt(self._chat_messages(history, text))
            return len(m.tokenize(rendered, add_special=True, parse_special=True))
        return len(m.tokenize(self._running_text(history, text)))

    def _max_tokens(self) -> int | None:
        n = int(self.options.get("num_predict", DEFAULT_NUM_PREDICT))
        return None if n < 0 else n

    def _fit(self, text: str) -> None:
        """Drop the oldest messages until the prompt leaves room for an answer (a quarter of
        the context, or num_predict if less); the newest message alone too long is an error."""
        n_ctx = self.model.n_ctx
        max_tokens = self._max_tokens()
        room = min(n_ctx // 4, max_tokens) if max_tokens is not None else n_ctx // 4
        n = self._prompt_tokens(self.messages, text)
        if n >= n_ctx:
            alone = self._prompt_tokens([], text) if self.messages else n
            if alone >= n_ctx:
                train = self.model.hparams.get("n_ctx_train")
                more = f" (this model was trained with {train}: -c 0 gives it all)" if train else ""
                raise ValueError(f"the prompt is {alone} tokens but the context holds {n_ctx}: "
                                 f"give a larger -c{more}")
        dropped = 0
        while n + room > n_ctx and dropped < len(self.messages):
            dropped += 1
            while dropped < len(self.messages) and self.messages[dropped]["role"] != "user":
                dropped += 1
            n = self._prompt_tokens(self.messages[dropped:], text)
        if dropped:
            self.messages = self.messages[dropped:]
            print(f"(the conversation outgrew the {n_ctx}-token context: dropped its {dropped} oldest "
                  f"message{'s' if dropped > 1 else ''})", file=self.err, flush=True)

    def _generate_kwargs(self) -> dict[str, Any]:
        kw = {k: v for k, v in self.options.items() if k != "num_predict"}
        kw["max_tokens"] = self._max_tokens()
        return kw

    def _stream(self, text: str) -> TextStream:
        if self.chat:
            return self.model.chat_stream(self._chat_messages(self.messages, text), **self._generate_kwargs())
        return self.model.generate(self._running_text(self.messages, text), **self._generate_kwargs())

    # --- answering ----------------------------------------------------------------------------

    def answer(self, text: str, *, end: str = "\n") -> bool:
        """Stream the reply to `text` to out and add both to the conversation. False when Ctrl-C
        stopped it (the part shown is kept; nothing shown: the message is dropped too)."""
        self._fit(text)
        t0 = time.perf_counter()
        t_first: float | None = None
        pieces: list[str] = []
        stream: TextStream | None = None
        interrupted = False
        try:
            stream = self._stream(text)
            for piece in stream:
                if t_first is None:
                    t_first = time.perf_counter()
                pieces.append(piece)
                self.out.write(piece)
                self.out.flush()
        except KeyboardInterrupt:
            interrupted = True
            if stream is not None:
                stream.close()
        t_end = time.perf_counter()
        reply = "".join(pieces)
        if reply or not interrupted:
            self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        self.out.write(end)
        self.out.flush()
        if self.verbose and not interrupted and stream is not None:
            self._print_stats(stream, t0, t_first if t_first is not None else t_end, t_end)
        self._load_s = None  # the load is told with the session's first answer only
        return not interrupted

    def _print_stats(self, stream: TextStream, t0: float, t_first: float, t_end: float) -> None:
        c = stream.completion()
        timings = getattr(c, "timings", None)  # the engine's own, if the library gives them
        total = t_end - t0 + (self._load_s or 0.0)  # as Ollama's: the load is part of the total
        if timings is not None:
            stats = Stats(total, self._load_s, timings.prompt_n, timings.prompt_s, timings.predicted_n,
                          timings.predicted_s, timings.cached_n)
        else:
            # the first token comes with the prompt: the generation's time covers the others
            stats = Stats(total, self._load_s, c.prompt_tokens, t_first - t0, len(c.tokens), t_end - t_first,
                          eval_timed_n=max(len(c.tokens) - 1, 0))
        print(stats.text(), file=self.err, flush=True)

    # --- the interactive loop -----------------------------------------------------------------

    def repl(self) -> int:
        """Chat until /bye or Ctrl-D; returns the exit status (0)."""
        try:
            import readline
        except ImportError:  # a Python built without it: plain input(), no line editing
            readline = None  # type: ignore[assignment]
        history = _history_file() if readline is not None else None
        if history is not None:
            try:
                readline.read_history_file(history)
            except OSError:
                pass
            readline.set_history_length(HISTORY_LENGTH)
        if not self.chat:
            print(self._raw_note(), file=self.err)
        print("Send a message (/? for help)", file=self.err, flush=True)
        try:
            return self._loop(readline)
        finally:
            if history is not None:
                try:
                    history.parent.mkdir(parents=True, exist_ok=True)
                    readline.write_history_file(history)
                except OSError:
                    pass

    def _raw_note(self) -> str:
        if self.model.runtime.chat_template_source is None:
            return (f"{self.name} has no chat template (a base model): the model continues what you "
                    "type as plain text")
        return "raw mode (--raw): the model continues what you type as plain text, without its chat template"

    def _loop(self, readline: Any) -> int:
        buf: list[str] = []
        mode: str | None = None  # "prompt" or "system" while a \"\"\" block is open
        while True:
            try:
                line = input(ALT_PROMPT if mode else PROMPT)
            except EOFError:
                self.out.write("\n")
                return 0
            except KeyboardInterrupt:
                typed = readline.get_line_buffer() if readline is not None else ""
                self.out.write("\n")
                if not typed:
                    self.out.write(EXIT_HINT + "\n")
                self.out.flush()
                buf, mode = [], None
                continue
            try:
                text: str | None = None
                if mode is not None:
                    done = line.endswith(MULTILINE)
                    buf.append(line[: -len(MULTILINE)] if done else line)
                    if not done:
                        continue
                    block, kind = "\n".join(buf).strip("\n"), mode
                    buf, mode = [], None
                    if kind == "system":
                        self._set_system(block)
                        continue
                    text = block
                elif line.startswith(MULTILINE):
                    rest = line[len(MULTILINE):]
                    if len(rest) >= len(MULTILINE) and rest.endswith(MULTILINE):
                        text = rest[: -len(MULTILINE)]
                    else:
                        buf, mode = [rest], "prompt"
                        continue
                elif line.startswith("/"):
                    verdict = self.command(line)
                    if verdict == "exit":
                        return 0
                    if verdict == "system":  # /set system \"\"\"... opened a block
                        buf, mode = [line.split(MULTILINE, 1)[1]], "system"
                    continue
                else:
                    text = line
                if text is None or not text.strip():
                    continue
                try:
                    self.answer(text, end="\n\n")
                except Exception as e:  # noqa: BLE001 - the session goes on after a failed turn
                    if os.environ.get("BUBO_DEBUG"):
                        raise
                    print(f"error: {str(e) or type(e).__name__}", file=self.err, flush=True)
            except KeyboardInterrupt:
                self.out.write("\n")
                self.out.flush()
                buf, mode = [], None

    # --- commands -------------------------------------------------------------------------------

    def command(self, line: str) -> str | None:
        """Run a /command. Returns "exit" for /bye, "system" when `/set system \"\"\"` opened a
        multi-line block, else None."""
        args = line.split()
        cmd = args[0]
        p = self._say
        if cmd in ("/bye", "/exit"):
            return "exit"
        if cmd in ("/?", "/help"):
            topic = args[1].lstrip("/") if len(args) > 1 else ""
            p({"set": USAGE_SET, "show": USAGE_SHOW, "shortcuts": USAGE_SHORTCUTS,
               "shortcut": USAGE_SHORTCUTS}.get(topic, USAGE))
        elif cmd == "/clear":
            self.messages = []
            p("Cleared session context")
        elif cmd == "/set":
            return self._cmd_set(line, args)
        elif cmd == "/system":
            text = line[len("/system"):].strip()
            if not text:
                p("Usage:\n  /system <text>    set the system message (/set system \"\"\" for several lines)")
            else:
                self._set_system(text)
        elif cmd == "/show":
            self._cmd_show(args[1] if len(args) > 1 else None)
        elif cmd == "/save":
            if len(args) != 2:
                p("Usage:\n  /save <file>    save the conversation as JSON (/load <file> takes it back)")
            else:
                self._save(args[1])
        elif cmd == "/load":
            if len(args) != 2:
                p("Usage:\n  /load <file>    go on with a conversation /save wrote")
            else:
                self._load(args[1])
        else:
            p(f"Unknown command '{cmd}'. Type /? for help")
        return None

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _set_system(self, text: str) -> None:
        if not self.chat:
            self._say("A system message needs a chat template; in raw mode put it in your message")
            return
        self.system = text or None
        self._say("Set system message.")

    def _cmd_set(self, line: str, args: list[str]) -> str | None:
        p = self._say
        if len(args) < 2:
            p(USAGE_SET)
            return None
        what = args[1]
        if what == "system":
            text = line.split(None, 2)[2] if len(args) > 2 else ""
            if not text:
                p(USAGE_SET)
                return None
            if text.startswith(MULTILINE):
                body = text[len(MULTILINE):]
                if not (len(body) >= len(MULTILINE) and body.endswith(MULTILINE)):
                    return "system"
                text = body[: -len(MULTILINE)]
            self._set_system(text)
        elif what == "verbose":
            self.verbose = True
            p("Set 'verbose' mode.")
        elif what == "quiet":
            self.verbose = False
            p("Set 'quiet' mode.")
        else:
            rest = args[2:]
            explicit = what == "parameter"  # Ollama's form: /set parameter <name> <value>
            if explicit:
                if len(rest) < 2:
                    p(USAGE_PARAMETERS)
                    return None
                what, rest = rest[0], rest[1:]
            known = OPTION_ALIASES.get(what, what) in OPTIONS or what in ("num_ctx", "ctx_size")
            if not known and not explicit:
                p(f"Unknown command '/set {what}'. Type /? set for help")
                return None
            if len(rest) != 1:
                p(f"Usage:\n  /set {what} <value>")
                return None
            try:
                key, value = parse_option(what, rest[0])
            except ValueError as e:
                p(f"Couldn't set parameter '{what}': {e}")
                return None
            self.options[key] = value
            p(f"Set parameter '{key}' to '{rest[0]}'")
        return None

    def _cmd_show(self, what: str | None) -> None:
        p = self._say
        if what is None:
            p(parameters_text(self.options))
            p(self._system_text())
            return
        if what in ("parameters", "params"):
            p(parameters_text(self.options))
        elif what == "system":
            p(self._system_text())
        elif what in ("info", "template", "license", "modelfile"):
            card = ModelCard.read(self.model.path, self.name)
            if what == "info":
                p(card.info() + "\n" + card.capabilities())
            elif what == "template":
                p(card.template or "No chat template: this is a base model.")
            elif what == "license":
                p(card.license or "No license was specified for this model.")
            else:
                p(card.full())
        else:
            p(f"Unknown command '/show {what}'. Type /? for help")

    def _system_text(self) -> str:
        return _section("System", [self.system] if self.system else ["(none)"])

    def to_json(self) -> dict[str, Any]:
        return {"model": self.name, "chat": self.chat, "system": self.system, "options": dict(self.options),
                "messages": [dict(m) for m in self.messages]}

    def _save(self, path: str) -> None:
        target = Path(path).expanduser()
        try:
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            os.replace(tmp, target)
        except OSError as e:
            self._say(f"error: couldn't save to {target}: {e.strerror or e}")
            return
        self._say(f"Saved the conversation ({len(self.messages)} messages) to {target}")

    def _load(self, path: str) -> None:
        target = Path(path).expanduser()
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
            messages, system, options = _read_saved(data)
        except OSError as e:
            self._say(f"error: couldn't load {target}: {e.strerror or e}")
            return
        except ValueError as e:
            self._say(f"error: couldn't load {target}: {e}")
            return
        if system and not self.chat:
            self._say(f"error: couldn't load {target}: it has a system message, and {self.name} runs without "
                      "a chat template here")
            return
        self.messages, self.system, self.options = messages, system, options
        other = data.get("model")
        note = f" (saved with {other})" if isinstance(other, str) and other != self.name else ""
        self._say(f"Loaded the conversation ({len(messages)} messages) from {target}{note}")


def _read_saved(data: Any) -> tuple[list[dict[str, str]], str | None, dict[str, Any]]:
    """A /save file's messages, system message and options, checked (ValueError saying what is wrong)."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ValueError("not a conversation /save wrote (no \"messages\" list)")
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise ValueError("\"system\" must be text")
    messages: list[dict[str, str]] = []
    for i, m in enumerate(data["messages"]):
        if (not isinstance(m, dict) or m.get("role") not in ("user", "assistant")
                or not isinstance(m.get("content"), str)):
            raise ValueError(f"message {i} is not {{\"role\": \"user\" or \"assistant\", \"content\": text}}")
        messages.append({"role": m["role"], "content": m["content"]})
    options: dict[str, Any] = {}
    raw = data.get("options") or {}
    if not isinstance(raw, dict):
        raise ValueError("\"options\" must be an object")
    for k, v in raw.items():
        if k not in OPTIONS or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"option {k!r}: not one of {', '.join(OPTIONS)} with a number")
        try:
            check_option(k, OPTIONS[k](v))
        except ValueError as e:
            raise ValueError(f"option {k!r}: {e}") from None
        options[k] = OPTIONS[k](v)
    return messages, system or None, options


def _history_file() -> Path | None:
    """Where the typed lines are kept across sessions ($BUBO_HOME/history; BUBO_NOHISTORY=1: nowhere)."""
    if os.environ.get("BUBO_NOHISTORY", "").lower() in ("1", "true", "yes", "on"):
        return None
    from bubo import store

    return store.home() / "history"


USAGE = """Available Commands:
  /set            Set session variables (/? set)
  /show           Show model information and the parameters (/? show)
  /system <text>  Set the system message
  /save <file>    Save the conversation as JSON
  /load <file>    Go on with a saved conversation
  /clear          Clear session context (the system message stays)
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message.
"""

USAGE_SET = """Available Commands:
  /set parameter <name> <value>   Set a parameter (or /set <name> <value>)
  /set system <string>            Set system message
  /set verbose                    Show timings after each answer
  /set quiet                      Do not show timings

""" + "Parameters:\n" + "\n".join(f"  {k:<19}{OPTION_HELP[k]}" for k in OPTIONS) + "\n"

USAGE_PARAMETERS = "Available Parameters:\n" + "\n".join(
    f"  /set parameter {k} <{'int' if t is int else 'float'}>".ljust(44) + OPTION_HELP[k] for k, t in OPTIONS.items()
) + "\n"

USAGE_SHOW = """Available Commands:
  /show              The parameters and the system message
  /show info         Show details for this model
  /show license      Show model license
  /show parameters   Show the parameters (defaults, and what /set changed)
  /show system       Show system message
  /show template     Show the chat template
"""

USAGE_SHORTCUTS = """Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
   Alt + b            Move back (left) one word
   Alt + f            Move forward (right) one word
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor
  Up / Down           Earlier and later lines you typed

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit (/bye)
"""
