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

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bubo._tokenizer import Tokenizer
from bubo.chat import ChatTemplate
from bubo.engine.types import InvalidRequestError
from bubo.gguf import GGUFFile

if TYPE_CHECKING:
    from bubo._grammar import Vocab
    from bubo._model import Model as NativeModel


class Runtime:
    """One GGUF model in memory. path: the file (resolve catalog names with bubo.store first);
    n_threads None or 0: every CPU; chat_template: Jinja source that replaces the file's own."""

    def __init__(self, path: str | os.PathLike[str], *, n_threads: int | None = None,
                 chat_template: str | None = None, name: str | None = None):
        from bubo._model import Model as NativeModel

        self.path = str(path)
        self.name = name or self.path
        with GGUFFile(self.path) as f:
            self.metadata: dict[str, Any] = f.metadata
        self.native: NativeModel = NativeModel(self.path, n_threads or 0)
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
        self._eog: list[int] | None = None

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
        """The compiled template (NoChatTemplateError for a model without one)."""
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

    # --- derived from the vocabulary once --------------------------------------------------

    def vocab_pieces(self) -> list[bytes]:
        """Every token's text as DRY matches sequence breakers against it."""
        if self._pieces is None:
            from bubo.sampling import vocab_pieces

            self._pieces = vocab_pieces(self.tokenizer)
        return self._pieces

    def grammar_vocab(self) -> Vocab:
        """The vocabulary's byte trie for grammar masks, built at the first grammar request."""
        if self._vocab is None:
            from bubo._grammar import Vocab

            self._vocab = Vocab.from_tokenizer(self.tokenizer)
        return self._vocab

    def eog_ids(self) -> list[int]:
        """The end-of-generation token ids."""
        if self._eog is None:
            tok = self.tokenizer
            self._eog = [t for t in range(self.n_vocab) if tok.is_eog(t)]
        return self._eog
