"""Markdown to HTML for the chat page (POST /webui/render): CommonMark plus tables and
strikethrough, code blocks highlighted by Pygments (CSS classes; the page carries the style).

Raw HTML in the text is escaped, never passed through, and links are checked (markdown-it refuses
javascript:, vbscript:, file: and data: other than images), so a model's answer or a user's
message cannot put script or markup into the page."""

from __future__ import annotations

import functools
import html
from typing import Any

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

MAX_TEXT = 256 * 1024  # characters one render takes (an answer longer than that shows as text)
CSS_SCOPE = ".hl"


def _highlight(code: str, lang: str, _attrs: str) -> str:
    name = (lang or "").strip().split()[0] if lang and lang.strip() else ""
    try:
        lexer = get_lexer_by_name(name) if name else None
    except ClassNotFound:
        lexer = None
    cls = f' class="language-{html.escape(name, quote=True)}"' if name else ""
    if lexer is None:
        return f'<pre class="hl"><code{cls}>{html.escape(code)}</code></pre>'
    body = highlight(code, lexer, HtmlFormatter(nowrap=True))
    return f'<pre class="hl"><code{cls} data-highlighted="pygments">{body}</code></pre>'


@functools.lru_cache(maxsize=1)
def _md() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False,
                                   "highlight": _highlight})
    md.enable(["table", "strikethrough"])
    md.add_render_rule("link_open", _link_open)
    return md


def _link_open(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    """Links open in a new tab, without giving it this page (rel noopener)."""
    tokens[idx].attrSet("target", "_blank")
    tokens[idx].attrSet("rel", "noopener noreferrer")
    return str(self.renderToken(tokens, idx, options, env))


def render(text: str) -> str:
    """The HTML of a Markdown text."""
    return str(_md().render(text))


@functools.lru_cache(maxsize=1)
def code_css() -> str:
    """Pygments' classes for highlighted code, scoped to the page's code blocks."""
    return str(HtmlFormatter(style="default").get_style_defs(CSS_SCOPE))
