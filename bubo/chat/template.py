"""Chat templates as Hugging Face transformers renders them.

The template comes from the model file (GGUF `tokenizer.chat_template`) and is untrusted code:
it runs in Jinja2's ImmutableSandboxedEnvironment, with the environment options, globals and
filters that `transformers` gives templates (trim_blocks, lstrip_blocks, loop controls,
raise_exception, strftime_now, a `tojson` that keeps non-ASCII text, `{% generation %}`), so
that a template written for transformers renders the same text here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from bubo import deadline
from bubo.errors import BuboError


class ChatTemplateError(BuboError, ValueError):
    """A chat template failed to compile or to render (including its own raise_exception)."""


class NoChatTemplateError(ChatTemplateError):
    """The model has no chat template (a base model, or an embedding model: encoder)."""

    def __init__(self, message: str, encoder: bool = False):
        super().__init__(message)
        self.encoder = encoder


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' tojson: json.dumps semantics, not Jinja's HTML-safe one (which escapes <, >, &, ')
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for transformers' training
    masks; for rendering it is transparent."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with the request's deadline checked at every call and attribute or item
    lookup (a template's loops over a long request stop once its preparation is abandoned)."""

    # positional-only, as Jinja's own: a template may pass self=, context=, obj= to a callable
    def call(env, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        deadline.check()
        return super().call(context, obj, *args, **kwargs)

    def getitem(env, obj: Any, argument: Any, /) -> Any:
        deadline.check()
        return super().getitem(obj, argument)

    def getattr(env, obj: Any, attribute: str, /) -> Any:
        deadline.check()
        return super().getattr(obj, attribute)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _Environment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template with the model's special-token texts."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "model"):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template of {name} does not compile: {e}") from None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], bos_token: str = "", eos_token: str = "",
                      name: str = "model") -> ChatTemplate:
        source = metadata.get("tokenizer.chat_template")
        if not isinstance(source, str) or not source:
            raise NoChatTemplateError(
                f"{name} has no chat template (no tokenizer.chat_template in its GGUF metadata; "
                "it is probably a base model): generate from a raw prompt instead, or pass a "
                "template with chat_template=..."
            )
        return cls(source, bos_token, eos_token, name)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **extra: Any) -> str:
        """The prompt text for `messages` (dicts with role and content, as in the OpenAI API)."""
        if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not all(
            isinstance(m, Mapping) for m in messages
        ):
            raise ChatTemplateError("messages must be a list of dicts like {'role': 'user', 'content': '...'}")
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except Exception as e:  # noqa: BLE001 - the template is untrusted code: any failure is its error
            raise ChatTemplateError(f"chat template error: {type(e).__name__}: {e}") from None
