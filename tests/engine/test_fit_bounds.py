"""bubo.engine.fit's bounds: a grammar state whose shortest completion is astronomically long is
judged from its length alone (Matcher.shortest is never called), one too long to weigh token by
token is left to the grammar, and a plan's costs are computed once and advanced with it."""

from __future__ import annotations

import pytest

from bubo._grammar import Grammar, Matcher, Vocab
from bubo.chat.schema import schema_to_gbnf
from bubo.engine import fit as fit_mod
from bubo.engine.fit import MAX_STEER_BYTES, Fit, PieceIndex

PIECES = [bytes([b]) for b in range(256)] + [b"[[", b"]]", b"],[", b"[[[0", b"0,0,0,0"]
EOG = [len(PIECES)]


def matcher(schema: dict) -> Matcher:
    return Matcher(Grammar(schema_to_gbnf(schema)), Vocab(PIECES + [b""]))


class NeverWritten:
    """A matcher whose shortest completion may be measured but not written out."""

    def __init__(self, m: Matcher):
        self.shortest_len = m.shortest_len

    def shortest(self) -> bytes:
        raise AssertionError("the completion was written out")


def nested(*sizes: int) -> dict:
    schema: dict = {"type": "integer"}
    for n in reversed(sizes):
        schema = {"type": "array", "minItems": n, "items": schema}
    return schema


def test_an_astronomical_completion_is_judged_from_its_length():
    m = matcher(nested(1000, 1000, 1000))
    assert m.shortest_len > 10**9
    fit = Fit(PieceIndex(PIECES), EOG)
    assert fit.fits(NeverWritten(m), 4) is False  # cannot fit: 7 bytes a token at most
    assert fit.fits(NeverWritten(m), 10**12) is True  # could, but too long to weigh: the grammar decides
    assert fit.candidates(NeverWritten(m), 4) == [] and fit.plan is None  # not followed either


def test_a_completion_that_could_fit_is_weighed_and_followed():
    m = matcher(nested(40))  # "[0,0,...,0]": 81 bytes
    index = PieceIndex(PIECES)
    fit = Fit(index, EOG)
    n = m.shortest_len
    assert n == 81
    cost = index.costs(m.shortest())[0]
    assert cost is not None and cost < n  # "0,0,0,0" pieces spell it in fewer tokens than bytes
    assert fit.fits(m, cost + 1) and not fit.fits(m, cost)
    cands = fit.candidates(m, cost + 1)
    assert cands and fit.plan == m.shortest() and fit.plan_cost == index.costs(fit.plan)
    piece = PIECES[cands[0]]
    fit.took(piece)
    assert fit.plan_cost == index.costs(fit.plan)  # advanced, the same as recomputed


def test_past_max_steer_bytes_the_grammar_alone_decides(monkeypatch: pytest.MonkeyPatch):
    m = matcher(nested(40))
    monkeypatch.setattr(fit_mod, "MAX_STEER_BYTES", 80)
    fit = Fit(PieceIndex(PIECES), EOG)
    assert fit.fits(NeverWritten(m), 70) is True
    assert fit.candidates(NeverWritten(m), 70) == []
    assert MAX_STEER_BYTES > 80
