"""Answers that end within their budget: a grammar-constrained generation steered to a short
ending when the tokens left get close to what its grammar needs to finish.

The grammar matcher knows, for its state, the fewest bytes that finish the text and one such
completion (Matcher.shortest). Before a sampled token is taken, Fit checks that the text after
it is complete (while nothing was steered), or can still be finished within the tokens left,
one of them kept for the end-of-generation token; a token that cannot is set aside and the
sampler asked again. When it keeps choosing such tokens the answer follows a shortest
completion to its end: the model chooses among the tokens that spell the completion's next
bytes (those after which the rest still fits), so the answer ends, parses and is still the
model's where it had a choice. The check runs at every step, so a token that opens something
long (a key whose value must be long) is refused while there is still room to refuse it.

No peer does this; a request that ran out of tokens inside its JSON gets text that does not
parse. FinishEvent.steered tells the routes, which say so in their responses.

Bounds. A grammar's shortest completion can be astronomically long (arrays of 1000 arrays of
1000 ...), so no completion is written out before its length shows it could fit: a token spells
at most max_len bytes, so a completion of more than (left - 1) x max_len bytes cannot, and is
refused from its length alone. One that could but is longer than MAX_STEER_BYTES is not weighed
token by token (that costs a pass over its bytes per vocabulary length): such a state is left to
the grammar alone, as without a budget, and the answer may end at its limit unfinished, as any
peer's would. A plan's costs are computed once and advanced as it is spelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bubo._grammar import Matcher

# the longest completion weighed token by token (see Bounds above)
MAX_STEER_BYTES = 16384


class PieceIndex:
    """The vocabulary as text pieces: which byte strings are one token, for counting the fewest
    tokens that spell a text. pieces[i]: token i's bytes as the grammar sees them (b"" for
    control tokens, which no grammar allows)."""

    def __init__(self, pieces: Sequence[bytes]):
        ids: dict[bytes, int] = {}
        for i, p in enumerate(pieces):
            if p and p not in ids:
                ids[p] = i
        self.ids = ids
        self.lengths = sorted({len(p) for p in ids})
        self.max_len = self.lengths[-1] if self.lengths else 0
        # every byte is a token: a text of n bytes takes at most n tokens
        self.every_byte = all(bytes([b]) in ids for b in range(256))

    def costs(self, text: bytes) -> list[int | None]:
        """costs[i]: the fewest tokens that spell text[i:] (None: no tokens do)."""
        n = len(text)
        cost: list[int | None] = [None] * (n + 1)
        cost[n] = 0
        ids = self.ids
        for i in range(n - 1, -1, -1):
            best: int | None = None
            for k in self.lengths:
                if i + k > n:
                    break
                rest = cost[i + k]
                if rest is not None and (best is None or rest + 1 < best) and text[i:i + k] in ids:
                    best = rest + 1
            cost[i] = best
        return cost


class Fit:
    """One generation's steering state. eog: the end-of-generation token ids."""

    def __init__(self, index: PieceIndex, eog: Sequence[int]):
        self.index = index
        self.eog = list(eog)
        self.plan: bytes | None = None  # the completion followed once steering began
        self.plan_cost: list[int | None] = []  # index.costs(plan), advanced with it
        self.steered = False  # a sampled token was refused, or the plan followed

    def _weighable(self, n: int, left: int) -> bool | None:
        """Whether a completion of n bytes can be weighed for `left` tokens: False when its
        length alone shows it cannot fit (nor be followed to its end), None when it is too long
        to weigh (MAX_STEER_BYTES), True when it is to be weighed."""
        if n > max(left - 1, 0) * self.index.max_len:
            return False
        return True if n <= MAX_STEER_BYTES else None

    def fits(self, after: Matcher, left: int) -> bool:
        """Can the text in state `after` be finished in `left` tokens? A complete text fits as
        it is while nothing was steered (the budget may end it there, as it would end an
        answer without a grammar: free text after a closed think block, say); an unfinished one,
        or any text once the answer was steered, needs its shortest completion and the
        end-of-generation token after it, so that a steered answer ends as the model's own
        answers do (not with whitespace up to the limit)."""
        n = after.shortest_len
        if n is None:
            return False
        if n == 0 and not self.steered:
            return True
        if n + 1 <= left and self.index.every_byte:
            return True
        weighable = self._weighable(n, left)
        if weighable is None:  # too long to weigh: the grammar alone decides
            return True
        if not weighable:
            return False
        text = after.shortest()
        cost = self.index.costs(text)[0] if text is not None else None
        return cost is not None and cost + 1 <= left

    def candidates(self, grammar: Matcher, left: int) -> list[int]:
        """The tokens that follow the plan (started here from the grammar's shortest completion)
        and leave its rest room in left - 1 tokens: its end-of-generation tokens once it is
        spelled out. When none leaves room (the budget was already short), the longest token
        that follows it, so the answer gets as near its end as it can."""
        if self.plan is None:
            n = grammar.shortest_len
            # nothing finishes the text, or its shortest completion is too long to follow
            if n is None or n > MAX_STEER_BYTES:
                return []
            self.plan = grammar.shortest()
            if self.plan is None:
                return []
            self.plan_cost = self.index.costs(self.plan)
        plan = self.plan
        if not plan:
            return self.eog
        cost = self.plan_cost
        ids = self.index.ids
        out, longest = [], None
        for k in self.index.lengths:
            if k > len(plan):
                break
            t = ids.get(plan[:k])
            if t is None:
                continue
            longest = t
            c = cost[k]
            if c is not None and c + 1 <= left - 1:
                out.append(t)
        return out or ([longest] if longest is not None else [])

    def took(self, piece: bytes) -> None:
        """A token of the plan was taken: the plan goes on after it."""
        assert self.plan is not None and self.plan.startswith(piece)
        self.plan = self.plan[len(piece):]
        self.plan_cost = self.plan_cost[len(piece):]
