"""A loaded model: the native forward pass, its tokenizer, metadata and chat template.

    rt = Runtime("/path/to/model.gguf", n_threads=2)
    ids = rt.tokenizer.encode(rt.chat_prompt([{"role": "user", "content": "Hi"}]), parse_special=True)

The server's engine and the library's bubo.Model both run on a Runtime: the engine with a KV
cache of several sequences and its scheduler thread, the library with one sequence driven in the
caller's thread (bubo/llm.py). The runtime itself holds no generation state; what it caches is
derived from the vocabulary once (token texts for DRY, the byte trie for grammar masks, the
end-of-generation ids). Only one thread may decode on a runtime at a time: the native model's
scratch buffers are its own.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bubo._tokenizer import TOKEN_ATTR_UNKNOWN, Tokenizer
from bubo.chat import ChatTemplate
from bubo.engine.types import InvalidRequestError
from bubo.gguf import GGUFFile

if TYPE_CHECKING:
    from bubo._grammar import Vocab
    from bubo._model import Model as NativeModel
    from bubo.engine.fit import PieceIndex


log = logging.getLogger("bubo.runtime")


@dataclass
class ChatText:
    """A rendered chat prompt; spans: (start, end) characters of it that stay plain text."""

    text: str
    spans: list[tuple[int, int]]


def _holds(pattern: re.Pattern[str], *values: Any) -> bool:
    """Whether any string in values (dict keys included, any depth) matches pattern."""
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if pattern.search(v):
                return True
        elif isinstance(v, Mapping):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


def _replace(value: Any, pattern: re.Pattern[str], repl: Callable[[re.Match[str]], str]) -> Any:
    """value with every match of pattern in its strings (dict keys included) replaced."""
    if isinstance(value, str):
        return pattern.sub(repl, value)
    if isinstance(value, Mapping):
        return {_replace(k, pattern, repl): _replace(v, pattern, repl) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replace(v, pattern, repl) for v in value]
    return value


@dataclass
class LoadedAdapter:
    """A LoRA adapter of a runtime: its id (its slot), file, name and global scale (what a request
    that names no adapters of its own uses; the server's routes and Model.set_lora set it)."""

    id: int
    path: str
    name: str
    scale: float
    ranks: list[int]


class Runtime:
    """One GGUF model in memory. path: the file (resolve catalog names with bubo.store first);
    n_threads None or 0: every CPU; n_threads_batch: the threads of a step of several tokens, a
    prompt's (None or 0: n_threads; llama.cpp's -tb); chat_template: Jinja source that replaces the file's own;
    requant: rewrite the wider matrices in this type at load (a draft model's; see bubo._model.Model)."""

    def __init__(self, path: str | os.PathLike[str], *, n_threads: int | None = None,
                 chat_template: str | None = None, name: str | None = None, requant: str | None = None,
                 n_threads_batch: int | None = None):
        from bubo._model import Model as NativeModel

        self.path = str(path)
        self.name = name or self.path
        with GGUFFile(self.path) as f:
            self.metadata: dict[str, Any] = f.metadata
        self.native: NativeModel = NativeModel(self.path, n_threads or 0, requant=requant,
                                               n_threads_batch=n_threads_batch or 0)
        self.hparams: dict[str, Any] = dict(self.native.hparams)
        self.tokenizer = Tokenizer(self.path)
        own = self.metadata.get("tokenizer.chat_template")
        # the template's source: the override, else the file's (None for a base model)
        self.chat_template_source: str | None = chat_template if chat_template is not None else (
            own if isinstance(own, str) and own else None)
        self._template_override = chat_template
        self._template: ChatTemplate | None = None
        self._pieces: list[bytes] | None = None
        self._vocab: Vocab | None = None
        self._grammar_pieces: list[bytes] | None = None
        self._word_starts: frozenset[int] | None = None
        self._separators: frozenset[int] | None = None
        self._space_runs: dict[int, int] | None = None
        self._piece_index: PieceIndex | None = None
        self._shows_tools: bool | None = None
        self._eog: list[int] | None = None
        self._controls: re.Pattern[str] | bool | None = None
        self.adapters: list[LoadedAdapter] = []  # LoRA adapters, by id (load_adapters)

    def load_adapters(self, given: Sequence[tuple[str, float]]) -> None:
        """LoRA adapters (path, scale), each read, checked against this model and put in a slot of
        the native model: their ids are their order. bubo.lora.AdapterError for one that cannot
        be used (naming the file and the first tensor that does not fit), ValueError for too many."""
        from bubo import lora
        from bubo._model import MAX_LORA

        if len(given) > MAX_LORA:
            raise ValueError(f"{len(given)} LoRA adapters: a model takes at most {MAX_LORA}")
        loaded = []
        for path, scale in given:
            if not math.isfinite(scale) or abs(scale) > lora.MAX_SCALE:
                raise lora.AdapterError(f"{path}: the scale {scale} is not a finite number of at most 1e6")
            adapter = lora.read_adapter(path)
            lora.check_adapter(adapter, self.native, self.metadata)
            loaded.append((adapter, scale))
        for i, (adapter, scale) in enumerate(loaded):
            lora.install(self.native, i, adapter)
            self.adapters.append(LoadedAdapter(i, adapter.path, adapter.name, float(scale), adapter.ranks))

    def lora_in_force(self, asked: Sequence[tuple[int, float]] | None = None) -> tuple[tuple[int, float], ...]:
        """A request's (adapter id, scale) pairs, scale nonzero: asked (its own), else each
        adapter's global scale."""
        pairs = asked if asked is not None else [(a.id, a.scale) for a in self.adapters]
        return tuple(sorted((i, float(s)) for i, s in pairs if s != 0))  # one order: one prefix-cache namespace

    def __repr__(self) -> str:
        return f"Runtime({self.name!r})"

    @property
    def n_vocab(self) -> int:
        return self.native.n_vocab

    @property
    def n_ctx_train(self) -> int | None:
        n = self.hparams.get("n_ctx_train")
        return int(n) if isinstance(n, int) and n > 0 else None

    # --- text ----------------------------------------------------------------------------

    def check_ids(self, ids: Sequence[int], name: str = "token id") -> None:
        """InvalidRequestError (a ValueError) for an id that is not one of this vocabulary's."""
        n = self.n_vocab
        for i, t in enumerate(ids):
            if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or not 0 <= t < n:
                raise InvalidRequestError(
                    f"{name} {t!r} at index {i} is out of range: this model's ids are 0..{n - 1}; "
                    "pass ids from this model's tokenize()")

    def token_piece(self, token: int) -> bytes:
        """The bytes of one token, special tokens rendered."""
        return self.tokenizer.token_to_piece(int(token), True)

    @property
    def chat_template(self) -> ChatTemplate:
        """The compiled template (NoChatTemplateError for a model without one, or an embedding
        model: it generates no text)."""
        if not self.hparams.get("causal", True):
            from bubo.chat import NoChatTemplateError
            from bubo.embed import EncoderOnlyError

            raise NoChatTemplateError(str(EncoderOnlyError(self.name, str(self.hparams.get("arch")))), encoder=True)
        if self._template is None:
            tok = self.tokenizer

            def text_of(i: int | None) -> str:
                return tok.token_text(i).decode("utf-8", "replace") if i is not None else ""

            bos, eos = text_of(tok.bos_id), text_of(tok.eos_id)
            if self._template_override is not None:
                self._template = ChatTemplate(self._template_override, bos, eos, self.name)
            else:
                self._template = ChatTemplate.from_metadata(self.metadata, bos, eos, self.name)
        return self._template

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]], *,
                    tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
                    **template_kwargs: Any) -> str:
        """The rendered chat template (tokenize it with parse_special=True). template_kwargs are
        extra template variables (enable_thinking, ...: a request's chat_template_kwargs)."""
        text = self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                         **template_kwargs)
        # templates often write the BOS text themselves; the tokenizer adds BOS too (llama.cpp
        # drops the template's copy the same way)
        bos = self.chat_template.bos_token
        if self.tokenizer.add_bos and bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    def chat_text(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
                  add_generation_prompt: bool = True, specials_in_content: bool = False,
                  **template_kwargs: Any) -> ChatText:
        """The rendered chat template, and the spans of it that are to stay plain text: the text
        of control tokens ("<|im_start|>") that the messages or tools themselves hold. Tokenize
        with parse_special=True and text_spans=spans: the template's own markup becomes control
        tokens, text from the request does not. specials_in_content: the request's text may
        hold control tokens (no spans: llama-server's behaviour, an opt-in)."""
        if tools and not self.template_shows_tools():
            from bubo.chat.tools import generic_tool_messages

            messages, tools = generic_tool_messages(messages, tools), None
        pattern = None if specials_in_content else self._control_pattern()
        if pattern is None or not _holds(pattern, messages, tools, template_kwargs):
            return ChatText(self.chat_prompt(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                             **template_kwargs), [])
        # each control-token text in the request stands in the template's input as a placeholder
        # that no template treats as markup, and is put back, marked plain, in its output
        nonce = "".join(secrets.choice("0123456789") for _ in range(12))
        found: dict[str, str] = {}

        def hide(m: re.Match[str]) -> str:
            return f"\ue000{nonce}:{found.setdefault(m.group(), str(len(found)))}\ue001"

        text = self.chat_prompt(_replace(messages, pattern, hide), tools=_replace(tools, pattern, hide),
                                add_generation_prompt=add_generation_prompt,
                                **_replace(dict(template_kwargs), pattern, hide))
        texts = {v: k for k, v in found.items()}
        out: list[str] = []
        spans: list[tuple[int, int]] = []
        at, n = 0, 0
        for m in re.finditer(f"\ue000{nonce}:(\\d+)\ue001", text):
            out.append(text[at:m.start()])
            n += m.start() - at
            special = texts.get(m.group(1), "")
            out.append(special)
            spans.append((n, n + len(special)))
            n += len(special)
            at = m.end()
        out.append(text[at:])
        return ChatText("".join(out), spans)

    def template_shows_tools(self) -> bool:
        """Does the chat template render the tools it is given? (Templates of models not trained
        on tool use drop them silently.) Found once, by rendering a probe tool; when it does not,
        chat_text describes the tools itself (bubo.chat.tools.generic_tool_messages), and says
        so in the log once."""
        if self._shows_tools is None:
            probe = "bubo_probe_" + "".join(secrets.choice("abcdef") for _ in range(8))
            tools = [{"type": "function", "function": {"name": probe, "description": "",
                                                       "parameters": {"type": "object", "properties": {}}}}]
            try:
                text = self.chat_prompt([{"role": "user", "content": "hi"}], tools=tools)
            except Exception:  # noqa: BLE001 - a template that fails on tools shows none
                text = ""
            self._shows_tools = probe in text
            if not self._shows_tools:
                log.info("the chat template of %s does not show tools: a request's tools are described in a "
                         "system message of bubo's (the generic tool prompt)", self.name)
        return self._shows_tools

    def control_spans(self, text: str) -> list[tuple[int, int]]:
        """The (start, end) characters of text that spell a control token."""
        pattern = self._control_pattern()
        return [m.span() for m in pattern.finditer(text)] if pattern is not None else []

    def _control_pattern(self) -> re.Pattern[str] | None:
        """A regex of every control token's text, longest first (None: the model has none)."""
        if self._controls is None:
            tok = self.tokenizer
            unknown = TOKEN_ATTR_UNKNOWN
            texts = {tok.token_text(i).decode("utf-8", "replace") for i in range(self.n_vocab)
                     if tok.is_control(i) or tok.token_attr(i) & unknown}
            texts.discard("")
            ordered = sorted(texts, key=len, reverse=True)
            self._controls = re.compile("|".join(map(re.escape, ordered))) if ordered else False
        return self._controls if isinstance(self._controls, re.Pattern) else None

    # --- derived from the vocabulary once --------------------------------------------------

    def vocab_pieces(self) -> list[bytes]:
        """Every token's text as DRY matches sequence breakers against it."""
        if self._pieces is None:
            from bubo.sampling import vocab_pieces

            self._pieces = vocab_pieces(self.tokenizer)
        return self._pieces

    def word_starts(self) -> frozenset[int]:
        """The tokens that begin a word: their text starts with a byte that is not an ASCII
        letter or digit, nor part of a multi-byte character (a space, a newline, punctuation).
        Prompt lookup's copies go on from them past a replaced word (bubo.engine.draft)."""
        if self._word_starts is None:
            self._word_starts = frozenset(i for i, p in enumerate(self.grammar_pieces())
                                          if p and p[0] < 0x80 and not chr(p[0]).isalnum())
        return self._word_starts

    def separators(self) -> frozenset[int]:
        """The tokens whose text is only ASCII punctuation and white space (", ", " |", ":\n"):
        what separates the fields that prompt lookup's FieldLayout copies (bubo.engine.draft)."""
        if self._separators is None:
            punct = bytes(b for b in range(0x80) if not chr(b).isalnum())
            self._separators = frozenset(i for i, p in enumerate(self.grammar_pieces())
                                         if p and not p.translate(None, punct))
        return self._separators

    def space_runs(self) -> dict[int, int]:
        """The token the tokenizer writes for a run of spaces, by the run's width (widths it
        writes as one token that is the run alone; not a byte token that no text encodes to):
        FieldLayout pads a table's values with them (bubo.engine.draft)."""
        if self._space_runs is None:
            runs: dict[int, int] = {}
            widths = {len(p) for p in self.grammar_pieces() if p and not p.strip(b" ")}
            for w in sorted(widths):
                ids = self.tokenizer.encode(" " * w, add_special=False)
                if len(ids) == 1 and self.grammar_pieces()[ids[0]] == b" " * w:
                    runs[w] = ids[0]
            self._space_runs = runs
        return self._space_runs

    def grammar_pieces(self) -> list[bytes]:
        """Every token's bytes as grammars see them (no bytes for control and unused tokens)."""
        if self._grammar_pieces is None:
            tok = self.tokenizer
            self._grammar_pieces = [tok.token_to_piece(i, False) for i in range(self.n_vocab)]
        return self._grammar_pieces

    def grammar_vocab(self) -> Vocab:
        """The vocabulary's byte trie for grammar masks, built at the first grammar request."""
        if self._vocab is None:
            from bubo._grammar import Vocab

            self._vocab = Vocab(self.grammar_pieces())
        return self._vocab

    def piece_index(self) -> PieceIndex:
        """Which byte strings are one token: for steering an answer to fit its budget."""
        if self._piece_index is None:
            from bubo.engine.fit import PieceIndex

            self._piece_index = PieceIndex(self.grammar_pieces())
        return self._piece_index

    def eog_ids(self) -> list[int]:
        """The end-of-generation token ids."""
        if self._eog is None:
            tok = self.tokenizer
            self._eog = [t for t in range(self.n_vocab) if tok.is_eog(t)]
        return self._eog
