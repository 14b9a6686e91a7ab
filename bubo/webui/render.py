"""Markdown to HTML for the chat page (POST /webui/render): CommonMark plus tables and
strikethrough, code blocks highlighted by Pygments (CSS classes; the page carries the style).

Raw HTML in the text is escaped, never passed through, and links are checked (markdown-it refuses
javascript:, vbscript:, file: and data: other than images), so a model's answer or a user's
message cannot put script or markup into the page.

Some Pygments lexers backtrack without bound (a 319-character mcfunction fence took 12 s), inside
one regular-expression call that holds the GIL: no thread can be interrupted there. So the server
renders in worker processes (bubo/webui/workers.py) that it kills past a time budget; this file is
also that worker (`python render.py --serve`: length-prefixed JSON requests on stdin, answers on
stdout). It imports nothing of bubo's, so the worker starts without the engine."""

from __future__ import annotations

import functools
import html
import json
import sys
from typing import Any

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

MAX_TEXT = 256 * 1024  # characters one render takes (an answer longer than that shows as text)
CSS_SCOPE = ".hl"


def _code_block(code: str, lang: str, highlighted: bool) -> str:
    name = (lang or "").strip().split()[0] if lang and lang.strip() else ""
    try:
        lexer = get_lexer_by_name(name) if name and highlighted else None
    except ClassNotFound:
        lexer = None
    cls = f' class="language-{html.escape(name, quote=True)}"' if name else ""
    if lexer is None:
        return f'<pre class="hl"><code{cls}>{html.escape(code)}</code></pre>'
    body = highlight(code, lexer, HtmlFormatter(nowrap=True))
    return f'<pre class="hl"><code{cls} data-highlighted="pygments">{body}</code></pre>'


def _highlight(code: str, lang: str, _attrs: str) -> str:
    return _code_block(code, lang, True)


def _no_highlight(code: str, lang: str, _attrs: str) -> str:
    return _code_block(code, lang, False)


@functools.lru_cache(maxsize=2)
def _md(highlighted: bool = True) -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False,
                                   "highlight": _highlight if highlighted else _no_highlight})
    md.enable(["table", "strikethrough"])
    md.add_render_rule("link_open", _link_open)
    return md


def _link_open(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    """Links open in a new tab, without giving it this page (rel noopener)."""
    tokens[idx].attrSet("target", "_blank")
    tokens[idx].attrSet("rel", "noopener noreferrer")
    return str(self.renderToken(tokens, idx, options, env))


def render(text: str, highlighted: bool = True) -> str:
    """The HTML of a Markdown text (code blocks highlighted, or escaped as they are)."""
    return str(_md(highlighted).render(text))


def plain(text: str) -> str:
    """The text as it is, escaped: what the page shows when no rendering could be had in time."""
    return f'<pre class="plain">{html.escape(text)}</pre>'


def serve() -> None:
    """The worker's loop: first a line "ready" (its imports are done: a rendering's budget starts
    after them), then for each request (a line with the byte length of a JSON object {"text",
    "highlight"}, then the object) the answer the same way, {"html"} or {"error"}. Ends at end of
    input."""
    rd, wr = sys.stdin.buffer, sys.stdout.buffer
    _md(True), _md(False)
    wr.write(b"ready\n")
    wr.flush()
    while True:
        line = rd.readline()
        if not line:
            return
        req = json.loads(rd.read(int(line)))
        try:
            out: dict[str, Any] = {"html": render(req["text"], bool(req.get("highlight", True)))}
        except Exception as e:  # noqa: BLE001 - a renderer's failure is this request's answer
            out = {"error": f"{type(e).__name__}: {e}"}
        data = json.dumps(out).encode("utf-8")
        wr.write(b"%d\n" % len(data) + data)
        wr.flush()



@functools.lru_cache(maxsize=1)
def code_css() -> str:
    """Pygments' classes for highlighted code, scoped to the page's code blocks."""
    return str(HtmlFormatter(style="default").get_style_defs(CSS_SCOPE))


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
