"""The high-level Python API: load a model by catalog name or path, tokenize, generate, chat.

    m = bubo.Model("smollm2:135m")
    for piece in m.generate("The capital of France is", max_tokens=16, temperature=0):
        print(piece, end="")

A Model owns one native model, one KV cache (a single sequence) and the tokenizer. Successive
calls reuse the cached prefix they share with the previous prompt. A Model is not meant to be
shared between threads; the HTTP server's engine (a later issue) does batching across requests.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from bubo import store
from bubo._tokenizer import Tokenizer
from bubo.chat import ChatTemplate
from bubo.gguf import GGUFFile

# prompt tokens per decode call: large enough for the matrix-matrix kernels to pay off, small
# enough that the activations stay modest
PREFILL_CHUNK = 512


# --- stop strings --------------------------------------------------------------------------


class StopMatcher:
    """Cuts a text stream at the first stop string, even one spread over several pieces.

    feed() returns the text that is safe to show: it holds back the longest tail of what it has
    seen that could still become a stop string. A stop string "completes" at the position of its
    last character; the first one to complete wins (the longest one on a tie), wherever the
    piece boundaries fall, and nothing from its first character on is ever returned."""

    def __init__(self, stop: Iterable[str] = ()):
        self.stop = sorted({s for s in stop if s}, key=len, reverse=True)
        self._held = ""
        self.stopped: str | None = None  # the stop string that ended the stream

    def feed(self, text: str) -> str:
        if self.stopped is not None:
            return ""
        buf = self._held + text
        best: tuple[int, int, str] | None = None  # (end, -len, stop)
        for s in self.stop:
            i = buf.find(s)
            if i >= 0 and (best is None or (i + len(s), -len(s)) < best[:2]):
                best = (i + len(s), -len(s), s)
        if best is not None:
            self.stopped = best[2]
            self._held = ""
            return buf[: best[0] + best[1]]
        hold = self._partial_len(buf)
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        """The stream ended without a stop string: the held-back tail is plain text."""
        out, self._held = ("" if self.stopped is not None else self._held), ""
        return out

    def _partial_len(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best


# --- results -------------------------------------------------------------------------------


@dataclass
class Completion:
    """A finished generation."""

    text: str
    tokens: list[int]  # the generated token ids (including the EOG token, if one ended it)
    finish_reason: str  # "stop" (EOG token or stop string) or "length" (max_tokens or context)
    prompt_tokens: int
    stop: str | None = None  # the stop string that ended it, if one did
    logprobs: list[float] = field(default_factory=list)  # of each generated token


class TextStream(Iterator[str]):
    """What generate() returns: an iterator of text pieces; once it is exhausted, completion()
    tells how the generation ended."""

    def __init__(self, run: _Run, pieces: Iterator[str]):
        self._run = run
        self._pieces = pieces
        self._text: list[str] = []
        self._done = False

    def __next__(self) -> str:
        try:
            piece = next(self._pieces)
        except StopIteration:
            self._done = True
            raise
        self._text.append(piece)
        return piece

    def close(self) -> None:
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()

    def completion(self) -> Completion:
        if not self._done:
            raise RuntimeError("the generation has not finished: read the stream to its end first")
        return self._run.result("".join(self._text))


class _Detok(Protocol):
    def feed(self, id: int) -> str: ...
    def flush(self) -> str: ...


def _text_stream(tokens: Iterable[int], detok: _Detok, matcher: StopMatcher) -> Iterator[str]:
    """Turn a token stream into text pieces: whole UTF-8 characters (the Detokenizer), cut at
    the first stop string (the StopMatcher). Stops pulling tokens once a stop string is seen."""
    for tok in tokens:
        out = matcher.feed(detok.feed(tok))
        if out:
            yield out
        if matcher.stopped is not None:
            return
    out = matcher.feed(detok.flush())
    out += matcher.flush()
    if out:
        yield out


# --- the model -----------------------------------------------------------------------------


class Model:
    """A GGUF model ready to generate: `Model("smollm2:135m")` or `Model("/path/to/x.gguf")`.

    A catalog name that is not stored yet is pulled first. n_ctx is the KV cache size in tokens
    (capped at the model's training context); n_threads defaults to every CPU."""

    def __init__(self, name_or_path: str | os.PathLike[str], *, n_ctx: int = 4096,
                 n_threads: int | None = None, chat_template: str | None = None):
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        if n_threads is not None and n_threads <= 0:
            raise ValueError(f"n_threads must be positive (or None for every CPU), got {n_threads}")
        self.path = store.resolve(name_or_path)
        self.name = str(name_or_path)
        from bubo._model import KVCache
        from bubo._model import Model as NativeModel

        with GGUFFile(self.path) as f:
            self.metadata = f.metadata
        self._native = NativeModel(str(self.path), n_threads or 0)
        self.hparams: dict[str, Any] = dict(self._native.hparams)
        self.tokenizer = Tokenizer(self.path)
        n_ctx_train = int(self.hparams.get("n_ctx_train") or 0)
        self.n_ctx = min(n_ctx, n_ctx_train) if n_ctx_train > 0 else n_ctx
        # swa_full=False: sliding-window layers (gemma3) keep only their window's blocks
        self._kv = KVCache(self._native, self.n_ctx, swa_full=False)
        self._kv_tokens: list[int] = []  # what sequence 0 of the cache holds
        self._active: object | None = None  # the generation that owns the cache now
        self._chat_template_source = chat_template
        self._chat_template: ChatTemplate | None = None
        self._pieces: list[bytes] | None = None

    def __repr__(self) -> str:
        return f"bubo.Model({self.name!r}, n_ctx={self.n_ctx})"

    @property
    def n_vocab(self) -> int:
        return self._native.n_vocab

    # --- text ----------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(self._check_ids(list(ids)), skip_special=skip_special)

    def _check_ids(self, ids: Sequence[int]) -> Sequence[int]:
        n = self.n_vocab
        for i, t in enumerate(ids):
            if not isinstance(t, (int, np.integer)) or not 0 <= t < n:
                raise ValueError(
                    f"token id {t!r} at index {i} is out of range: this model's ids are 0..{n - 1}; "
                    "pass ids from this model's tokenize()"
                )
        return ids

    # --- generation ----------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int | None = 256,
                 stop: str | Iterable[str] = (), seed: int | None = None,
                 temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None,
                 add_special: bool = True, parse_special: bool = False,
                 **sampling: Any) -> TextStream:
        """Stream the continuation of `prompt` (text, or token ids used as they are) as text
        pieces. Stops at an end-of-generation token, at a stop string (which is not yielded,
        nor anything after it) or after max_tokens (None: until the context is full).

        Sampling parameters left as None take bubo.sampling.SamplingParams' defaults (those of
        llama.cpp); other SamplingParams fields can be passed by name. temperature <= 0 is greedy."""
        run = self._start(prompt, max_tokens, stop, seed, temperature, top_k, top_p, min_p,
                          add_special, parse_special, sampling)
        return TextStream(run, _text_stream(run.tokens(), self.tokenizer.detokenizer(), run.matcher))

    def complete(self, prompt: str | Sequence[int], **kwargs: Any) -> Completion:
        """generate(), collected: the text with why it ended."""
        stream = self.generate(prompt, **kwargs)
        for _ in stream:
            pass
        return stream.completion()

    def chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
             **kwargs: Any) -> Completion:
        """Answer `messages` ([{"role": "user", "content": "..."}, ...]) with the model's chat
        template; kwargs as for generate()."""
        return self.complete(self.chat_prompt(messages, tools=tools), parse_special=True, **kwargs)

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], *,
                    tools: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> TextStream:
        """chat(), streamed as text pieces."""
        return self.generate(self.chat_prompt(messages, tools=tools), parse_special=True, **kwargs)

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]], *,
                    tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
                    **template_kwargs: Any) -> str:
        """The rendered chat template. Tokenize it with parse_special=True. template_kwargs are
        extra template variables (enable_thinking, ...: a request's chat_template_kwargs)."""
        text = self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                         **template_kwargs)
        # templates often write the BOS text themselves; the tokenizer adds BOS too (llama.cpp
        # drops the template's copy the same way)
        tok = self.tokenizer
        bos = self.chat_template.bos_token
        if tok.add_bos and bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    @property
    def chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            tok = self.tokenizer

            def text_of(i: int | None) -> str:
                return tok.token_text(i).decode("utf-8", "replace") if i is not None else ""

            bos, eos = text_of(tok.bos_id), text_of(tok.eos_id)
            if self._chat_template_source is not None:
                self._chat_template = ChatTemplate(self._chat_template_source, bos, eos, self.name)
            else:
                self._chat_template = ChatTemplate.from_metadata(self.metadata, bos, eos, self.name)
        return self._chat_template

    # --- internals -----------------------------------------------------------------------

    def _vocab_pieces(self) -> list[bytes]:
        if self._pieces is None:
            from bubo.sampling import vocab_pieces

            self._pieces = vocab_pieces(self.tokenizer)
        return self._pieces

    def _start(self, prompt: str | Sequence[int], max_tokens: int | None, stop: str | Iterable[str],
               seed: int | None, temperature: float | None, top_k: int | None, top_p: float | None,
               min_p: float | None, add_special: bool, parse_special: bool,
               sampling: dict[str, Any]) -> _Run:
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
            raise ValueError(f"max_tokens must be a positive integer (or None for no limit), got {max_tokens!r}")
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special, parse_special=parse_special)
        else:
            ids = [int(t) for t in self._check_ids(list(prompt))]
        if not ids:
            raise ValueError("the prompt is empty: give some text or token ids")
        if len(ids) >= self.n_ctx:
            raise ValueError(
                f"the prompt is {len(ids)} tokens but the context holds {self.n_ctx} (and needs room "
                "for at least one generated token): shorten the prompt or create the Model with a "
                f"larger n_ctx (this model was trained with {self.hparams.get('n_ctx_train')})"
            )
        stops = [stop] if isinstance(stop, str) else list(stop)
        params = _sampling_params(seed=seed, temperature=temperature, top_k=top_k, top_p=top_p,
                                  min_p=min_p, **sampling)
        return _Run(self, ids, max_tokens, StopMatcher(stops), params)


def _sampling_params(**kwargs: Any) -> Any:
    from bubo.sampling import SamplingParams

    given = {k: v for k, v in kwargs.items() if v is not None}
    try:
        return SamplingParams(**given)
    except TypeError as e:
        raise TypeError(f"unknown sampling parameter: {e}") from None


class _Run:
    """One generation: prefill, then sample-decode until EOG, a stop string, max_tokens or a
    full context. Owns the model's cache while active; starting another run ends this one."""

    def __init__(self, model: Model, prompt: list[int], max_tokens: int | None,
                 matcher: StopMatcher, params: Any):
        from bubo._sampler import Sampler

        self.model = model
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.matcher = matcher
        native = params.to_native(n_ctx=model.n_ctx)
        # DRY's sequence breakers are text: the sampler needs every token's text to match them
        pieces = model._vocab_pieces() if native.get("dry_multiplier", 0) > 0 and native.get("dry_sequence_breakers") else None
        self.sampler = Sampler(model.n_vocab, native, pieces)
        self.generated: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason = "length"
        self.n_cached = 0  # prompt tokens the cache already held (set by _prefill)

    def result(self, text: str) -> Completion:
        reason = "stop" if self.matcher.stopped is not None else self.finish_reason
        return Completion(text, self.generated, reason, len(self.prompt), self.matcher.stopped, self.logprobs)

    def _decode(self, tokens: list[int], start: int, want_logits: bool) -> np.ndarray | None:
        m = self.model
        n = len(tokens)
        rows = np.zeros(n, dtype=bool)
        rows[-1] = want_logits
        try:
            out = m._native.decode(
                m._kv, np.asarray(tokens, dtype=np.int32), np.arange(start, start + n, dtype=np.int32),
                np.zeros(n, dtype=np.int32), rows,
            )
        except BaseException:
            # what the cache holds is unknown now: start the next prompt from scratch
            m._kv.truncate(0, 0)
            m._kv_tokens.clear()
            raise
        m._kv_tokens.extend(tokens)
        return out[0] if want_logits else None

    def _prefill(self, interrupt: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Decode the prompt, reusing what the cache already holds of it (n_cached tokens).

        interrupt, asked before each chunk, can stop a long prompt early (None returned): the
        server's engine uses it to free its slot when the client goes away."""
        m = self.model
        reuse = 0
        for a, b in zip(m._kv_tokens, self.prompt):
            if a != b:
                break
            reuse += 1
        reuse = min(reuse, len(self.prompt) - 1)  # the last prompt token must run for its logits
        try:
            m._kv.truncate(0, reuse)
        except ValueError:
            # a sliding-window layer has already released the blocks that the shared prefix's
            # next token would attend to: start the prompt over (llama-server does the same)
            reuse = 0
            m._kv.truncate(0, 0)
        del m._kv_tokens[reuse:]
        self.n_cached = reuse
        # Chunks of PREFILL_CHUNK, logits from the last prompt token. Every row gets the same bits
        # whatever its chunk (the kernels are batch-invariant), so a prompt served partly from
        # the cache gives the same logits as the first time.
        n = len(self.prompt)
        logits = None
        for i in range(reuse, n, PREFILL_CHUNK):
            if interrupt is not None and interrupt():
                return None
            end = min(i + PREFILL_CHUNK, n)
            logits = self._decode(self.prompt[i:end], i, end == n)
        assert logits is not None
        return logits

    def tokens(self) -> Iterator[int]:
        m = self.model
        me = object()
        m._active = me
        logits = self._prefill()
        assert logits is not None
        tok = m.tokenizer
        while True:
            if self.max_tokens is not None and len(self.generated) >= self.max_tokens:
                return
            token, logprob, _top = self.sampler.sample(logits)
            self.sampler.accept(token)
            self.generated.append(token)
            self.logprobs.append(logprob)
            if tok.is_eog(token):
                self.finish_reason = "stop"
                return
            yield token
            if m._active is not me:
                raise RuntimeError(
                    "another generation started on this Model while this one was being read; "
                    "finish or close one generator before starting the next"
                )
            if len(m._kv_tokens) >= m.n_ctx:
                return  # the context is full: finish_reason stays "length"
            logits = self._decode([token], len(m._kv_tokens), True)
