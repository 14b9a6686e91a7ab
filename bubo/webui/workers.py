"""The chat page's Markdown, rendered in worker processes under a time budget.

Highlighting runs Pygments' regular expressions, and some lexers backtrack without bound inside
one call that holds the GIL (render.py's docstring): no thread can stop it, a process can be
killed. Each render goes to an idle worker (`python render.py --serve`, started on first use, at
most WORKERS at once; a render waits for one to be free). A worker that has not answered within
BUDGET_S is killed and the text is rendered again without highlighting, by a fresh worker and
within the same budget; if that too runs out, the answer is the text itself, escaped. So one
answer costs the server at most two budgets of one worker, and the event loop nothing.

    html, how = renderer().render(text)      # how: "highlighted", "plain_code" or "text"
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

import gevent
import gevent.lock
import gevent.queue
import gevent.subprocess

from bubo.webui import render as md

log = logging.getLogger("bubo.webui")

WORKERS = 2
BUDGET_S = 2.0  # seconds one rendering may take (highlighted, then again plain)
START_S = 30.0  # seconds a worker process may take to start
HIGHLIGHTED, PLAIN_CODE, TEXT = "highlighted", "plain_code", "text"


class _Worker:
    def __init__(self) -> None:
        self.proc: Any = gevent.subprocess.Popen(
            [sys.executable, md.__file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        try:
            with gevent.Timeout(START_S):  # its start (Python, markdown-it, Pygments) is no rendering's time
                ready = self.proc.stdout.readline()
        except BaseException:
            self.kill()
            raise
        if ready != b"ready\n":
            self.kill()
            raise OSError("the render worker did not start")

    def ask(self, text: str, highlight: bool) -> dict[str, Any]:
        import json

        data = json.dumps({"text": text, "highlight": highlight}).encode("utf-8")
        self.proc.stdin.write(b"%d\n" % len(data) + data)
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise OSError("the render worker ended")
        out: dict[str, Any] = json.loads(self.proc.stdout.read(int(line)))
        return out

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        gevent.spawn(self.proc.wait)  # reaped in the background


class Renderer:
    """The worker processes of one hub (see the module docstring)."""

    def __init__(self, workers: int = WORKERS, budget_s: float = BUDGET_S):
        self.budget_s = budget_s
        self._idle: gevent.queue.LifoQueue = gevent.queue.LifoQueue()
        self._slots = gevent.lock.BoundedSemaphore(workers)
        self.n_killed = 0

    def render(self, text: str) -> tuple[str, str]:
        """(HTML, how it was made: HIGHLIGHTED, PLAIN_CODE or TEXT)."""
        for highlight, how in ((True, HIGHLIGHTED), (False, PLAIN_CODE)):
            html = self._one(text, highlight)
            if html is not None:
                return html, how
        return md.plain(text), TEXT

    def _one(self, text: str, highlight: bool) -> str | None:
        with self._slots:
            try:
                worker = self._idle.get_nowait()
            except gevent.queue.Empty:
                try:
                    worker = _Worker()
                except (gevent.Timeout, OSError) as e:
                    log.warning("a Markdown render worker could not start: %s", e)
                    return None
            try:
                with gevent.Timeout(self.budget_s):
                    out = worker.ask(text, highlight)
            except (gevent.Timeout, OSError, ValueError) as e:
                what = "took longer than" if isinstance(e, gevent.Timeout) else f"failed ({e}) within"
                log.warning("rendering %d characters of Markdown%s %s %g s: the worker was stopped",
                            len(text), " with highlighting" if highlight else "", what, self.budget_s)
                worker.kill()
                self.n_killed += 1
                return None
            except BaseException:  # the request's greenlet killed mid-answer: the worker's state is unknown
                worker.kill()
                raise
            self._idle.put(worker)
        if "html" not in out:
            log.warning("rendering Markdown failed: %s", out.get("error"))
            return None
        return str(out["html"])

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().kill()
            except gevent.queue.Empty:
                return


_renderers: dict[int, Renderer] = {}


def renderer() -> Renderer:
    """The renderer of this thread's hub (the server's)."""
    key = gevent.get_hub().thread_ident
    r = _renderers.get(key)
    if r is None:
        r = _renderers[key] = Renderer()
    return r
