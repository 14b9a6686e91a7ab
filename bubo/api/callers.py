"""Callers: who sent a request. A key of --api-key-file's `NAME KEY` lines names its caller
(bubo.api.auth); --api-key's keys, the file's unnamed lines and a server without keys have no
name (the unnamed caller, "-" in /metrics).

A caller's name is in its requests' log lines (caller=NAME), in /metrics (bubo:caller_* series,
each with a caller label), and in /slots (each slot's last caller). What a caller stores (stored
responses, contexts, slot files) is its own: another caller is told it does not exist (404), as for
an id never made. --caller-max-slots N lets a caller run N generations at once (the unnamed caller
counts as one); its next one gets 429 with Retry-After, so that one caller cannot hold every slot
while the others wait."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import current_app, has_request_context, request

from bubo.api.errors import ApiError

ENVIRON = "bubo.caller"
HOLDS = "bubo.caller_holds"
INNER = "bubo.inner"  # a route run inside another request (an MCP tool call): counted as part of that one
UNNAMED = "-"  # the unnamed caller's label value (a name starts with a letter or digit)
RETRY_AFTER_SECONDS = 1  # a generation ends within seconds: a client that waits that long may try again


def caller() -> str | None:
    """The request's caller's name; None for the unnamed caller, or outside a request."""
    if not has_request_context():
        return None
    name: str | None = request.environ.get(ENVIRON)
    return name


def identify(key: str | None, names: dict[str, str]) -> None:
    """The request's caller, from the key it was let in by (bubo.api.auth.check_api_key)."""
    name = names.get(key) if key is not None else None
    request.environ[ENVIRON] = name
    if name is not None:
        request.environ.setdefault("bubo.log", {})["caller"] = name


def not_found_unless_mine(owner: str | None, what: str) -> None:
    """404 when owner is not the request's caller: `what` is the sentence a missing one gets."""
    if owner != caller():
        raise ApiError(404, "not_found", what)


@dataclass
class Counts:
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    running: int = 0


class Hold:
    """One request's generations, counted as one against its caller's --caller-max-slots while
    any of them runs: each stream takes a share (share()) and gives it back (release(), once per
    share; the response's close gives back what is left)."""

    def __init__(self, release: Callable[[], None]):
        self._release: Callable[[], None] | None = release
        self.shares = 1

    def share(self) -> Hold:
        self.shares += 1
        return self

    @property
    def live(self) -> bool:
        return self._release is not None

    def release(self) -> None:
        if self._release is None:
            return
        self.shares -= 1
        if self.shares <= 0:
            fn, self._release = self._release, None
            fn()

    def release_all(self) -> None:
        self.shares = 0
        self.release()


class Callers:
    """The server's per-caller counts (/metrics) and generations in flight (--caller-max-slots).
    Only the event loop's greenlets touch it."""

    def __init__(self, max_slots: int | None = None):
        self.max_slots = max_slots
        self.counts: dict[str, Counts] = {}

    def _of(self, name: str | None) -> Counts:
        return self.counts.setdefault(name or UNNAMED, Counts())

    def take(self, name: str | None) -> Hold:
        """A generation of name's begins: 429 when it runs max_slots already."""
        c = self._of(name)
        if self.max_slots is not None and c.running >= self.max_slots:
            who = f"the caller {name}" if name else "this key"
            raise ApiError(429, "too_many_requests",
                           f"{who} runs {c.running} generations already, the most --caller-max-slots "
                           f"allows: try again when one has ended", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        c.running += 1

        def release() -> None:
            c.running -= 1
        return Hold(release)

    def finished(self, name: str | None, record: dict[str, Any]) -> None:
        """A request of name's has been answered: record is its log fields (token counts)."""
        c = self._of(name)
        c.requests += 1
        c.prompt_tokens += int(record.get("prompt_tokens") or 0)
        c.generated_tokens += int(record.get("generated_tokens") or 0)

    def prometheus(self) -> str:
        """The bubo:caller_* series, one sample per caller seen."""
        from bubo.api.llamacpp.shapes import labels

        series = (("requests_total", "counter", "Requests answered, by caller.", "requests"),
                  ("prompt_tokens_total", "counter", "Prompt tokens of the caller's generations.", "prompt_tokens"),
                  ("tokens_predicted_total", "counter", "Tokens generated for the caller.", "generated_tokens"),
                  ("requests_processing", "gauge", "The caller's generations running now.", "running"))
        lines: list[str] = []
        for name, kind, help_, attr in series:
            full = "bubo:caller_" + name
            lines += [f"# HELP {full} {help_}", f"# TYPE {full} {kind}"]
            lines += [f"{full}{labels({'caller': who})} {getattr(c, attr)}" for who, c in sorted(self.counts.items())]
        return "\n".join(lines) + "\n"


def of_app() -> Callers:
    found: Callers = current_app.config["BUBO_CALLERS"]
    return found


def take() -> Hold | None:
    """In a request: a generation of its caller's begins (429 past --caller-max-slots, unless the
    request runs one already: a request's generations at once count as one, as the decision API's
    questions do). What a request holds is given back when its response closes, if its streams
    did not give it back first."""
    if not has_request_context():
        return None
    held: Hold | None = request.environ.get(HOLDS)
    if held is not None and held.live:
        return held.share()
    hold = of_app().take(caller())
    request.environ[HOLDS] = hold
    return hold


def release_all(environ: dict[str, Any]) -> None:
    held: Hold | None = environ.get(HOLDS)
    if held is not None:
        held.release_all()
