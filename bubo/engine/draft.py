"""Drafted tokens for speculative decoding: guesses at what a sequence says next, which one
forward pass checks together (bubo.engine.scheduler runs the sequence's pending token and its
draft as one chunk, samples every row exactly as plain decoding would, keeps the drafted tokens
while they equal the sampled ones and rolls the KV cache back past the first miss). A draft never
changes the answer, only how many forward passes it takes.

NgramDrafter is prompt-lookup decoding: the last few tokens of the sequence are looked up in
its own earlier tokens (prompt and answer), and what followed them there is the draft. It pays
where an answer repeats its prompt (an edit of a text, code that quotes its input, a summary
that copies phrases) and costs nothing else: a sequence without a match drafts nothing.

Each sequence keeps its own draft length: it doubles after a draft taken whole, halves after one
refused from its first token, and after several refusals in a row the sequence stops drafting
for a while (longer each time), so that a sequence where drafts do not pay runs as plain
decoding does."""

from __future__ import annotations

import dataclasses

NGRAM_SIZES = (4, 3, 2)  # the lengths of the tail looked up, longest first
PAUSE_AFTER_MISSES = 3  # refused drafts in a row before a sequence pauses drafting
PAUSE_MAX_STEPS = 64


@dataclasses.dataclass(frozen=True)
class DraftConfig:
    """How sequences draft. n_max: most drafted tokens per pass (llama-server's --draft-max);
    n_min: fewer found than this and nothing is drafted (--draft-min); ngram: prompt-lookup
    drafting on."""

    n_max: int = 16
    n_min: int = 0
    ngram: bool = True

    def __post_init__(self) -> None:
        if self.n_max < 1:
            raise ValueError(f"draft max must be at least 1, got {self.n_max}")
        if not 0 <= self.n_min <= self.n_max:
            raise ValueError(f"draft min must be 0..draft max ({self.n_max}), got {self.n_min}")


DEFAULT_DRAFT = DraftConfig()  # what the server and the library draft with unless told


class NgramDrafter:
    """Prompt-lookup drafts for one sequence (see the module docstring). The index maps each
    n-gram of the sequence to where it last ended, updated as tokens are appended."""

    def __init__(self, config: DraftConfig):
        self.config = config
        self.k = min(4, config.n_max)  # the draft length now (adapts)
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # tokens[:_indexed] are indexed (each n-gram ending before it)
        self._misses = 0
        self._pause = 0  # passes left without drafting
        self.n_drafted = 0
        self.n_accepted = 0

    def _update(self, tokens: list[int]) -> None:
        # index n-grams that end at positions < len(tokens) - 1: the sequence's tail itself must
        # not match itself
        end = len(tokens) - 1
        for i in range(self._indexed, end):
            for n in NGRAM_SIZES:
                if i + 1 >= n:
                    self._index[tuple(tokens[i + 1 - n:i + 1])] = i + 1
        self._indexed = max(self._indexed, end)

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """The draft to check after tokens (at most `limit` tokens; [] for none)."""
        if self._pause > 0:
            self._pause -= 1
            return []
        k = min(self.k, limit)
        if k < max(1, self.config.n_min):
            return []
        self._update(tokens)
        for n in NGRAM_SIZES:
            if len(tokens) < n:
                continue
            at = self._index.get(tuple(tokens[-n:]))
            if at is not None:
                draft = tokens[at:at + k]
                if len(draft) >= max(1, self.config.n_min):
                    return draft
        return []

    def taken(self, n_drafted: int, n_accepted: int) -> None:
        """How the last draft fared: adapt the draft length and pause after repeated misses."""
        if n_drafted == 0:
            return
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        if n_accepted == n_drafted:
            self.k = min(self.k * 2, self.config.n_max)
            self._misses = 0
        elif n_accepted == 0:
            self.k = max(self.k // 2, 1)
            self._misses += 1
            if self._misses >= PAUSE_AFTER_MISSES:
                self._pause = min(2 ** (self._misses - PAUSE_AFTER_MISSES + 2), PAUSE_MAX_STEPS)
        else:
            self.k = max(min(n_accepted + 1, self.config.n_max), 1)
            self._misses = 0
