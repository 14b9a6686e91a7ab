"""Drafted tokens for speculative decoding: guesses at what a sequence says next, which one
forward pass checks together (bubo.engine.scheduler runs the sequence's pending token and its
draft as one chunk, samples every row exactly as plain decoding would, keeps the drafted tokens
while they equal the sampled ones and rolls the KV cache back past the first miss). A draft never
changes the answer, only how many forward passes it takes.

NgramDrafter is prompt-lookup decoding: the last few tokens of the sequence are looked up in
its own earlier tokens (prompt and answer), and what followed them there is the draft. It pays
where an answer repeats its prompt (an edit of a text, code that quotes its input, a summary
that copies phrases) and costs nothing else: a sequence without a match drafts nothing. Past a
replaced word it goes on copying; where the answer lays the prompt's fields out anew (a list
turned into a table), FieldLayout drafts the prompt's next fields in the answer's own layout.

DraftModel drafts with a second, smaller model that shares the target's vocabulary (qwen2.5-coder
0.5b for its 1.5b): it keeps one KV sequence per slot that follows the target's (the prompt
chunks as the target reads them, then each checked token), and drafts greedily, a token per
forward pass of the small model for every drafting slot at once, until its top token's
probability falls under p_min (llama-server's --draft-p-min) or the draft is long enough. Its
cache keeps what it drafted: the tokens the target kept need no second pass, the rest are
forgotten at the next draft.

How long a draft is, is weighed every step (choose_lengths): each sequence's record says how
likely its next drafted token is kept (Pacing.alpha), and Costs says what a forward pass of n
rows costs on this machine (learned from the passes run: on a CPU a pass of 4 rows may cost
little more than one and a pass of 5 much more, as the kernels' tiles go) and what a pass of the
draft model costs. The lengths chosen are those that give the most tokens per second expected;
none when drafting does not beat the plain step, so that a sequence whose drafts do not pay
runs as plain decoding does (and tries again later, as its record fades)."""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import statistics
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bubo._model import LORA_MATS
from bubo._model import REQUANT_TYPES as REQUANT_TYPES  # the types a draft can be requantized to

if TYPE_CHECKING:
    from bubo._model import KVCache
    from bubo.runtime import Runtime

log = logging.getLogger("bubo.engine")

NGRAM_SIZES = (4, 3, 2)  # the lengths of the tail looked up, longest first
FOLLOW = 1  # prompt lookup's record key for a draft that goes on copying past a changed token
RESYNC = 5  # ... and for one found again just past where a draft was refused
RESYNC_WINDOW = 8  # how far past the refused source token (and for how many steps) it is looked for
FIELDS = 6  # ... and for the prompt's next fields laid out as the answer laid out its earlier ones (FieldLayout)
LAYOUT_ITEMS = 8  # the most items (separators and fields) of the answer's tail matched to find where its layout repeats
LAYOUT_KEPT = 8  # the latest occurrences kept of each: the period is the nearest one under which a key repeats
FIELD_MATCH = 3  # the most of the answer's last fields matched to the prompt's to find where the copy stands
FIELD_CANDIDATES = 32  # the latest places in the prompt a field is looked at (a common one occurs often)
FIELD_LONGEST = 64  # an answer's field longer than this is prose, not a value (the n-gram lookup's work)
MODEL_PRIOR = 0.7  # a draft model sharing the vocabulary is expected to agree on most tokens at first
PRIOR_WEIGHT = 2.0  # how many drafts the prior (the scheduler's record) is worth to a sequence
DRAFT_OUT_VOCAB = 16384  # a draft model guesses among the first tokens of its vocabulary only
DECAY = 0.7  # how much of a sequence's record each draft keeps
RECORD_DECAY = 0.95  # ... and the scheduler's record over every sequence
IDLE_DECAY = 0.9  # ... and each step without one (the record fades: drafting is tried again)
COST_WINDOW = 9  # a pass's cost: the median of its last runs
COST_SURE = 3  # runs before a cost is taken as known
ROW_SURE = 2  # prompt chunks seen before row_s (from them and from the counts run) is used (a first may be slow)
ROW_COST_ROWS = 16  # a pass with at least this many rows without logits (a prompt's chunk) bounds a row's arithmetic
EXPLORE_SLOPE = 0.1  # a row count not run yet: each row past the largest run costs this much of one
PROBE_EVERY = 32  # a sequence that has not drafted for this many steps drafts PROBE_LENGTH tokens anyway
PROBE_LENGTH = 2  # (what a pass costs and what drafts are kept is only learned by drafting)
MIN_GAIN = 1.03  # drafting must beat the plain step by this factor (the estimates are noisy)
MAX_DRAFT_PER_REQUEST = 64  # the most drafted tokens a request may ask for (speculative.n_max, draft_max)
P_MIN = 0.0  # a draft model stops where its top token is less likely than this (0: never, as llama-server)
# a draft model's matrices are rewritten in this type at load where they are wider (None: as in the
# file): its weights only guess what the target checks, so fewer bytes per pass buy speed and no
# answer changes (qwen2.5-coder 0.5b: 251 MB read per pass become 201 MB, its drafts kept as often)
REQUANT = "q4_0"


@dataclasses.dataclass(frozen=True)
class DraftConfig:
    """How sequences draft. n_max: most drafted tokens per pass (llama-server's --draft-max);
    n_min: fewer found than this and nothing is drafted (--draft-min); ngram: prompt-lookup
    drafting on; model: a draft model (a catalog name or a GGUF path; --model-draft) that drafts
    instead of prompt lookup; p_min: the draft model's least top-token probability to go on
    drafting (--draft-p-min); requant: the type the draft model's wider matrices are rewritten in
    at load (--draft-requant; None: the file's)."""

    n_max: int = 16
    n_min: int = 0
    ngram: bool = True
    model: str | None = None
    p_min: float = P_MIN
    requant: str | None = REQUANT

    def __post_init__(self) -> None:
        if self.n_max < 1:
            raise ValueError(f"draft max must be at least 1, got {self.n_max}")
        if not 0 <= self.n_min <= self.n_max:
            raise ValueError(f"draft min must be 0..draft max ({self.n_max}), got {self.n_min}")
        if not 0.0 <= self.p_min <= 1.0:
            raise ValueError(f"draft p-min must be 0..1, got {self.p_min}")
        if self.requant is not None and self.requant not in REQUANT_TYPES:
            raise ValueError(f"draft requant must be one of {', '.join(REQUANT_TYPES)} or none, got {self.requant!r}")


DEFAULT_DRAFT = DraftConfig()  # what the server and the library draft with unless told


class Pacing:
    """One sequence's record of how its drafts fared: alpha(prior), the estimated chance that its
    next drafted token is kept (decayed counts of tokens kept and of drafts cut short by a
    refusal, on top of a prior worth PRIOR_WEIGHT drafts: the scheduler's record over every
    sequence so far, so that a new sequence starts where its drafter usually is; the counts
    fade, so that a sequence that stopped drafting tries again later), and its counts for the
    usage figures."""

    def __init__(self, config: DraftConfig):
        self.config = config
        self._kept = 0.0
        self._refused = 0.0
        self.since = 0  # steps since its last draft (a long run of them: drafting is tried anyway)
        self.n_drafted = 0
        self.n_accepted = 0

    def alpha(self, prior: float = 0.5) -> float:
        return (self._kept + PRIOR_WEIGHT * prior) / (self._kept + self._refused + PRIOR_WEIGHT)

    def idle(self) -> None:
        """A step without a draft: the record fades a little towards the prior."""
        self._kept *= IDLE_DECAY
        self._refused *= IDLE_DECAY
        self.since += 1

    def taken(self, n_drafted: int, n_accepted: int) -> None:
        """How the last draft fared (n_drafted 0: the drafter was asked and had nothing)."""
        self.since = 0
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        self._kept = self._kept * DECAY + n_accepted
        self._refused = self._refused * DECAY + (n_accepted < n_drafted or n_drafted == 0)


class Costs:
    """What a forward pass costs, learned from the passes run: seconds for a pass of n rows of the
    target (by n) and for one pass of the draft model. A row count not run yet is estimated
    optimistically (a tenth of a one-row pass per row past the nearest count run below it, or
    between its neighbours if that is less), so that a draft of that length is tried and then
    known; but not under n rows' arithmetic (row_s each: a pass of many rows costs what its rows
    compute, one of few what its weights take to read), so that a CPU whose rows cost a third of
    a pass past the first few is not asked to try every longer draft to learn it. What a row with
    logits computes is bounded from above by the passes run: a prompt's chunk (its time over its
    rows, a row with logits counted row_factor times a prompt row: logits_row_factor) and each
    count run (its time over its rows); row_s is the least of those bounds, once ROW_SURE chunks
    have been seen (a first chunk may be slow: memory touched for the first time). A count is
    known once it has run COST_SURE times (until then the optimistic guess wins where it is less:
    one slow pass on a shared machine must not rule a length out). Each figure is the median of
    the last COST_WINDOW passes. prior: the chance a drafted token is kept before any draft was
    checked."""

    def __init__(self, prior: float = 0.5, row_factor: float = 1.0) -> None:
        self._runs: dict[int, collections.deque[float]] = {}
        self._t: dict[int, float] = {}
        self._draft_runs: collections.deque[float] = collections.deque(maxlen=COST_WINDOW)
        self.draft_s: float | None = None
        self._row_runs: collections.deque[float] = collections.deque(maxlen=COST_WINDOW)
        self.row_factor = row_factor
        self._prior = prior
        self._kept = 0.0  # every sequence's drafts: tokens kept and drafts refused (decayed)
        self._refused = 0.0

    @property
    def alpha(self) -> float:
        """The chance a drafted token is kept, over every sequence's recent drafts (the prior,
        worth two drafts, before any)."""
        return (self._kept + 2.0 * self._prior) / (self._kept + self._refused + 2.0)

    def idle(self) -> None:
        """A step where some sequence did not draft: the record fades towards even, as a
        sequence's does (else a record gone low would keep every sequence from drafting)."""
        self._kept *= IDLE_DECAY
        self._refused *= IDLE_DECAY

    def record(self, n_drafted: int, n_accepted: int) -> None:
        self._kept = self._kept * RECORD_DECAY + n_accepted
        self._refused = self._refused * RECORD_DECAY + (n_accepted < n_drafted or n_drafted == 0)

    def observe(self, n_rows: int, seconds: float) -> None:
        runs = self._runs.setdefault(n_rows, collections.deque(maxlen=COST_WINDOW))
        runs.append(seconds)
        self._t[n_rows] = statistics.median(runs)

    def observe_rows(self, n_rows: int, n_logits: int, seconds: float) -> None:
        """A pass whose rows do not all give logits (a prompt's chunk, perhaps beside other
        sequences' rows, n_logits of its rows giving logits): a pass costs at least its rows'
        arithmetic, so it bounds what a row with logits computes from above, each such row
        weighing row_factor prompt rows. The last COST_WINDOW bounds are kept; row_s takes their
        least."""
        self._row_runs.append(seconds * self.row_factor / (n_rows - n_logits + n_logits * self.row_factor))

    @property
    def row_s(self) -> float | None:
        """What a row with logits computes at most: the least of the bounds (see the class's
        text); None before ROW_SURE chunks."""
        if len(self._row_runs) < ROW_SURE:
            return None
        return min([*self._row_runs, *(t / n for n, t in self._t.items())])

    def observe_draft(self, seconds: float) -> None:
        self._draft_runs.append(seconds)
        self.draft_s = statistics.median(self._draft_runs)

    def target(self, n: int) -> float | None:
        t = self._t
        if not t:
            return None
        if n in t and len(self._runs[n]) >= COST_SURE:
            return t[n]
        guess = self._guess(n)
        return min(t[n], guess) if n in t else guess

    def _guess(self, n: int) -> float:
        t = {k: v for k, v in self._t.items() if k != n}
        if not t:
            return self._t[n]
        below = [k for k in t if k < n]
        above = [k for k in t if k > n]
        if not below:
            return t[min(above)]
        lo = max(below)
        guess = t[lo] + (n - lo) * EXPLORE_SLOPE * t[min(t)]  # optimistic: a count not run is tried once
        row = self.row_s
        if row is not None:
            guess = max(guess, n * row)  # ... but not below its rows' arithmetic
        if above:
            hi = min(above)
            guess = min(guess, t[lo] + (t[hi] - t[lo]) * (n - lo) / (hi - lo))
        return guess


def logits_row_factor(native: Any) -> float:
    """What a row that gives logits multiplies against a prompt's row that does not: the layers'
    matrices (bubo._model.Model.matrix_shape) and the output's over the layers' alone, counted in
    multiply-adds (qwen2.5-coder 1.5b: 1.18, smollm2 135m: 1.27, gemma3 270m: 2.67; attention and
    the types' different speeds left out); 1.0 for a model that does not say."""
    try:
        layer = sum(rows * cols for rows, cols in (native.matrix_shape(0, m) for m in range(len(LORA_MATS))))
        layers = int(native.hparams["n_layer"]) * layer
        out = int(native.out_vocab) * int(native.hparams["n_embd"])
    except (AttributeError, KeyError, TypeError, ValueError):
        return 1.0
    return (layers + out) / layers if layers > 0 else 1.0


def choose_lengths(alphas: list[float], caps: list[int], step_s: Callable[[int], float], draft_s: float) -> list[int]:
    """How many tokens each generating sequence drafts this step: the lengths that maximise the
    tokens the step is expected to give per second. alphas: each sequence's chance that a
    drafted token is kept (a draft of k is expected to give 1 + a + ... + a^k tokens); caps: the
    most each may draft; step_s(m): seconds for the step with m drafted rows more than it has
    without drafts; draft_s: seconds per pass of a draft model (0: drafts cost nothing, prompt
    lookup), which drafts as many passes as the longest draft. Rows go one at a time to the
    sequence whose next drafted token is likeliest kept; every total is weighed (a pass's cost
    rises in steps with the kernels' tiles, so the best total may lie past a worse one). All
    zeros unless drafting beats the plain step by MIN_GAIN."""
    n = len(alphas)
    k = [0] * n
    expected = float(n)
    plain = expected / step_s(0)
    best, best_k = plain * MIN_GAIN, list(k)
    k_max = 0
    for m in range(1, sum(caps) + 1):
        j = max((i for i in range(n) if k[i] < caps[i]), key=lambda i: alphas[i] ** (k[i] + 1))
        k[j] += 1
        expected += alphas[j] ** k[j]
        k_max = max(k_max, k[j])
        rate = expected / (step_s(m) + draft_s * k_max)
        if rate > best:
            best, best_k = rate, list(k)
    return best_k


class FieldLayout:
    """Drafts for an answer that lays the prompt's fields out anew (a list turned into a table, into
    JSON objects or YAML): the values come in the prompt's order, but between them the answer
    writes its own separators (and keys), so no n-gram of its tail occurs in the prompt. Tokens
    are separators (their text is only punctuation and white space: ", ", " |", ":\n") or parts
    of fields (maximal runs of other tokens: "3", " kg"; "pe", "ars"; given the tokens' texts, a "."
    between digits goes on its number's field: "1.5 kg", but "1. apples" is two).

    The layout: the answer's last items (each separator itself, each field as "a field"; up to
    LAYOUT_ITEMS) are looked up where they last occurred earlier in the answer; what followed
    there is the template, one period back (see below). A field that the answer wrote the same one period
    earlier, and that the prompt does not have, is the answer's own (a JSON object's key, a
    label: known from the third record on, and not where the prompt has it as a field of its
    own); the others are values, and so is any field longer than FIELD_LONGEST. Where the copy
    stands: the answer's latest value (perhaps still being written) is found among the prompt's
    fields, the one whose preceding fields also match the answer's preceding values (up to
    FIELD_MATCH; at least 2 tokens matched in all). The draft is the rest of the current field (a
    value's from the prompt, a key's as written before), then the template with each key as
    written and each value replaced by the prompt's next one: after "| pears | " a table row's
    template "3 kg    | 4.50 EUR |\n| " gives "2 kg    | 3.80 EUR |\n| "; after '"fruit":
    "plums", "' an object's 'quantity": "2 kg"}' gives 'quantity": "1 kg"}'. With no template
    yet (the first row), it is the rest of the current value, or the prompt's next field after a
    separator. Of the layout's last items' latest occurrences (LAYOUT_KEPT), the nearest under
    which the answer's latest key repeats sets the period: in objects of "key": "value" pairs
    alike, the tail occurs a pair back too, but the period is an object."""

    def __init__(self, separators: Collection[int], source_end: int, pieces: Sequence[bytes] | None = None,
                 spaces: Mapping[int, int] | None = None):
        self.separators = separators
        # with every token's text (pieces) and the tokens that are runs of spaces (spaces: width
        # -> token): a run that pads a value to its column's width (a Markdown table's
        # "| 3 kg     |") is drafted to the same width after another value
        self._pieces = pieces
        self._pad_token: Mapping[int, int] = spaces if pieces is not None and spaces else {}
        self.source_end = max(0, source_end)  # tokens[:source_end] are the prompt whose fields are copied
        self._fields: list[tuple[int, ...]] | None = None  # the prompt's fields, in order
        self._by_field: dict[tuple[int, ...], list[int]] = {}  # field -> its indices in _fields
        self._by_first: dict[int, list[int]] = {}  # first token -> the indices of the fields it begins
        self._items: list[int] = []  # the answer's layout: a separator's token id, or -1 for a field
        self._answer: list[list[int]] = []  # the answer's fields (the last one may still grow)
        self._field_at: list[int] = []  # per item: its index in _answer (-1: a separator)
        self._seen = self.source_end  # tokens[source_end:_seen] are in _items
        self._layout: dict[tuple[int, ...], list[int]] = {}  # items n-gram -> the item after each latest occurrence
        self._indexed = 0  # _items[:_indexed] end n-grams in _layout
        self._point: int | None = None  # the answer's last token: a "." on its number's field, if a digit follows

    def _index_source(self, tokens: list[int]) -> None:
        fields: list[tuple[int, ...]] = []
        run: list[int] = []
        source = tokens[:self.source_end]
        for i, t in enumerate(source):
            if t in self.separators and not (self._decimal_point(run, t) and i + 1 < len(source)
                                             and self._starts_digit(source[i + 1])):
                if run:
                    fields.append(tuple(run))
                    run = []
            else:
                run.append(t)
        if run:
            fields.append(tuple(run))
        for i, f in enumerate(fields):
            self._by_field.setdefault(f, []).append(i)
            self._by_first.setdefault(f[0], []).append(i)
        self._fields = fields

    def _update(self, tokens: list[int]) -> None:
        for t in tokens[self._seen:]:
            if self._point is not None and not self._starts_digit(t):  # it ended a number: a separator
                self._answer[-1].pop()
                self._items.append(self._point)
                self._field_at.append(-1)
            self._point = None
            if t in self.separators and not (self._items and self._items[-1] == -1
                                             and self._decimal_point(self._answer[-1], t)):
                self._items.append(t)
                self._field_at.append(-1)
            elif self._items and self._items[-1] == -1:
                if t in self.separators:
                    self._point = t  # a "." after a digit: the number's if a digit follows
                self._answer[-1].append(t)
            else:
                self._items.append(-1)
                self._field_at.append(len(self._answer))
                self._answer.append([t])
        self._seen = max(self._seen, len(tokens))
        # index the n-grams ending before the last item: the tail must not find itself
        items = self._items
        for j in range(self._indexed, len(items) - 1):
            for m in range(2, LAYOUT_ITEMS + 1):
                if j + 1 >= m:
                    after = self._layout.setdefault(tuple(items[j + 1 - m:j + 1]), [])
                    after.append(j + 1)
                    if len(after) > LAYOUT_KEPT:
                        del after[0]
        self._indexed = max(self._indexed, len(items) - 1)

    def _own(self, field: list[int]) -> bool:
        """A field the prompt does not have (and no longer than FIELD_LONGEST): the answer's own
        text, a key or a label, where it repeats."""
        return len(field) <= FIELD_LONGEST and tuple(field) not in self._by_field

    def _repeats(self, j: int, period: int | None, whole: bool = True) -> bool:
        """Item j is a field of the answer's own (a key, a label), not one of the prompt's values:
        the answer wrote the same field one period before (of at most FIELD_LONGEST tokens), and
        the prompt has no such field. whole False: the field is still being written, and is a
        strict beginning of that one."""
        if period is None or j < period:
            return False
        a, b = self._field_at[j], self._field_at[j - period]
        if a < 0 or b < 0:
            return False
        mine, before = self._answer[a], self._answer[b]
        if not self._own(before):
            return False
        return mine == before if whole else len(mine) < len(before) and before[:len(mine)] == mine

    def _where(self, values: list[list[int]], open_last: bool) -> int | None:
        """The index of the prompt's field that the answer's latest value (values[0], perhaps still
        being written: open_last) copies, found where the values before it (values[1:]) precede
        it too (None: not found)."""
        assert self._fields is not None
        fields, last = self._fields, values[0]
        if len(last) > FIELD_LONGEST:
            return None
        if open_last:
            n = len(last)
            found = [i for i in self._by_first.get(last[0], [])[-FIELD_CANDIDATES:]
                     if len(fields[i]) >= n and list(fields[i][:n]) == last]
        else:
            found = self._by_field.get(tuple(last), [])[-FIELD_CANDIDATES:]
        best, where = 0, None
        for i in found:
            score, j = len(last), 1
            while j < len(values) and i - j >= 0 and len(fields[i - j]) == len(values[j]) and \
                    list(fields[i - j]) == values[j]:
                score += len(fields[i - j])
                j += 1
            if score >= best:  # the later place where it ties
                best, where = score, i
        return where if best >= 2 else None

    def _template(self, items: list[int]) -> int | None:
        """Where the template starts: after an earlier occurrence of the answer's last items (the
        longest found), the nearest one under which the answer's latest key repeats (the latest
        field of the tail the prompt does not have); else the latest."""
        for m in range(min(LAYOUT_ITEMS, len(items) - 1), 1, -1):
            after = self._layout.get(tuple(items[-m:]))
            if after is not None:
                break
        else:
            return None
        last = len(items) - 1
        probe = next((j for j in range(last - 1, max(last - 4 * LAYOUT_ITEMS, -1), -1)
                      if items[j] == -1 and self._own(self._answer[self._field_at[j]])), None)
        if probe is not None:
            for at in reversed(after):
                j = probe - (len(items) - at)
                if j >= 0 and self._field_at[j] >= 0 and \
                        self._answer[self._field_at[j]] == self._answer[self._field_at[probe]]:
                    return at
        return after[-1]

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """The rest of the current field and the prompt's next fields in the answer's layout (at
        most `limit` tokens; [] where the answer's last value is not the prompt's)."""
        if len(tokens) <= self.source_end:
            return []  # no answer yet (and the prompt is indexed once it is whole)
        if self._fields is None:
            self._index_source(tokens)
        assert self._fields is not None
        self._update(tokens)
        if not self._answer:
            return []
        fields, items = self._fields, self._items
        at = self._template(items)
        period = len(items) - at if at is not None else None
        last = len(items) - 1
        open_field = items[last] == -1
        n = len(self._answer[-1])
        draft: list[int] = []
        key = open_field and period is not None and self._repeats(last, period, whole=False)
        if key:  # a key being written: its rest as the answer wrote it one period before
            assert period is not None
            draft = self._answer[self._field_at[last - period]][n:n + limit]
        # where the copy stands: the answer's latest values (its fields less those it repeats)
        values: list[list[int]] = []
        open_value = False
        j = last
        while j >= 0 and len(values) < FIELD_MATCH and last - j < 4 * LAYOUT_ITEMS:
            if items[j] == -1 and not (j == last and key) and not self._repeats(j, period):
                open_value = open_value or (j == last and open_field)
                values.append(self._answer[self._field_at[j]])
            j -= 1
        i = self._where(values, open_value) if values else None
        if i is None:
            return []
        nxt = i + 1
        if open_value:
            draft = list(fields[i][n:n + limit])
        if at is None:  # no layout to follow yet: the field, or the next one after a separator
            if not open_field and nxt < len(fields):
                draft = list(fields[nxt][:limit])
            return draft
        value = fields[i] if open_value else None  # the value the next item follows
        for j in range(at, len(items)):
            if len(draft) >= limit:
                break
            if items[j] != -1:
                draft += self._padded(items, j, value)
                value = None
            elif (j == last and key) or self._repeats(j, period):  # a key (perhaps the one being written)
                assert period is not None
                draft += self._answer[self._field_at[j - period]][:limit - len(draft)]  # as written before
                value = None
            elif nxt < len(fields):
                draft += fields[nxt][:limit - len(draft)]
                value = fields[nxt]
                nxt += 1
            else:
                break
        return draft[:limit]

    def _decimal_point(self, run: Sequence[int], t: int) -> bool:
        """Whether t is a "." right after a digit, which goes on the field run where a digit
        follows it ("1.5 kg" is one value, not "1" and "5 kg"; "1. apples" stays two); known only
        with the tokens' texts."""
        return self._pieces is not None and bool(run) and self._pieces[t] == b"." \
            and self._pieces[run[-1]][-1:].isdigit()

    def _starts_digit(self, t: int) -> bool:
        return self._pieces is not None and self._pieces[t][:1].isdigit()

    def _width(self, field: Sequence[int]) -> int:
        """A field's width in characters (UTF-8 continuation bytes not counted)."""
        assert self._pieces is not None
        return sum(1 for t in field for b in self._pieces[t] if b & 0xC0 != 0x80)

    def _padded(self, items: list[int], j: int, value: Sequence[int] | None) -> list[int]:
        """The template's separator items[j] after value (the prompt's field just drafted, or None):
        a run of spaces right after a value pads it to the template value's width (none where
        value is as wide or wider, the template's own where no token has the spaces wanted)."""
        sep = items[j]
        if not self._pad_token or value is None or j == 0 or items[j - 1] != -1:
            return [sep]
        assert self._pieces is not None
        piece = self._pieces[sep]
        if not piece or piece.strip(b" "):
            return [sep]  # not a run of spaces
        width = self._width(self._answer[self._field_at[j - 1]]) + len(piece) - self._width(value)
        if width <= 0:
            return []
        tok = self._pad_token.get(width)
        return [tok] if tok is not None else [sep]


class NgramDrafter(Pacing):
    """Prompt-lookup drafts for one sequence (see the module docstring). The index maps each
    n-gram of the sequence to where it last ended, updated as tokens are appended.

    Where the tail is found nowhere, the copy goes on past a changed token: an edit's answer
    copies its prompt with a word replaced here and there (a renamed variable, a corrected
    spelling), and right after the replacement no n-gram of the tail occurs in the prompt. The
    drafter remembers where its last draft was copied from and where it was refused:
    - the token the answer just wrote is looked for a few tokens past the refused one (RESYNC):
      where the replacement has ended and the copy resumes ("prepared there" for "prepaired
      there"), what follows it there is the draft;
    - else the copy goes on (FOLLOW), at the next word of the source: word_starts, the tokens
      that begin a word (a space, a newline or punctuation first), says where the refused source
      word ends ("prep|aired there": at " there"), since a corrected word seldom has its
      misspelling's token count; each token since then stands for one source token. Without
      word_starts, the refused token alone is skipped.
    A token the answer wrote as another, one for one (the copy refused there and kept right after
    it: a renamed variable), is remembered as renamed: later copies draft it as the answer wrote
    it (" value" as " amount" at each of its places), until a draft refused at a renamed token
    says the answer kept the source's there.
    Such a copy goes on until a draft of it is refused from its first token. Only a copy found by
    a tail of 3 tokens or more, or one whose drafts were partly kept, goes on so (a 2-token tail,
    "of the", is found everywhere in free text). Where no 4-gram of the tail is found, and before
    the shorter ones, FieldLayout drafts the prompt's next fields in the answer's own layout (given
    separators; n_prompt: where the answer begins). FOLLOW, RESYNC and FIELDS keep their own
    records."""

    def __init__(self, config: DraftConfig, word_starts: Collection[int] | None = None,
                 separators: Collection[int] | None = None, n_prompt: int | None = None,
                 pieces: Sequence[bytes] | None = None, spaces: Mapping[int, int] | None = None):
        super().__init__(config)
        self.pieces, self.spaces = pieces, spaces  # FieldLayout's, to pad values to their column's width
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # tokens[:_indexed] are indexed (each n-gram ending before it)
        # a record per match length: a draft found by a 4-gram is kept far more often than one
        # found by a 2-gram, and its length is chosen by its own record
        self._by_n = {n: Pacing(config) for n in (*NGRAM_SIZES, FOLLOW, RESYNC, FIELDS)}
        self.word_starts = word_starts
        self.separators = separators
        self.n_prompt = n_prompt  # where the answer begins (None: the first propose's sequence, less its last token)
        self._field_layout: FieldLayout | None = None  # made at the first propose, given separators
        self.matched = 0  # the match length of the last draft offered (FOLLOW, RESYNC: a copy going on; 0: none)
        self._copy: tuple[int, int] | None = None  # (source index, sequence length) of the last copy
        self._sure = False  # the last copy is one to go on with: found by 3 tokens or more, or partly kept
        self._offered: tuple[int, int] | None = None  # (source index, sequence length) of the draft on offer
        # (source index of the first refused token, sequence length after that step) of the last
        # draft refused before its end
        self._refused_at: tuple[int, int] | None = None
        self._renamed: dict[int, int] = {}  # a source token -> the token the answer writes for it
        self._rename: tuple[int, int] | None = None  # (source, answer) token: kept if the copy after it is
        self._offered_renamed: dict[int, int] = {}  # the draft on offer: its renamed places -> source tokens

    def alpha(self, prior: float = 0.5) -> float:
        rec = self._by_n.get(self.matched)
        return rec.alpha(prior) if rec is not None else super().alpha(prior)

    def idle(self) -> None:
        super().idle()
        for rec in self._by_n.values():
            rec.idle()
        self._forget_offer()

    def _forget_offer(self) -> None:
        """The draft on offer is spent (checked, or not drafted): its place and renames go."""
        self._offered = None
        self._rename = None
        self._offered_renamed = {}

    def taken(self, n_drafted: int, n_accepted: int) -> None:
        super().taken(n_drafted, n_accepted)
        rec = self._by_n.get(self.matched)
        if rec is not None:
            rec.taken(n_drafted, n_accepted)
        if n_accepted > 0:
            self._sure = True
            if self._rename is not None and self._rename[0] != self._rename[1]:
                self._renamed[self._rename[0]] = self._rename[1]  # the copy goes on past it: one for one
        elif self.matched == FOLLOW:
            self._copy = None  # the copy went astray: only a new match starts another
        if n_accepted < n_drafted and n_accepted in self._offered_renamed:
            self._renamed.pop(self._offered_renamed[n_accepted], None)  # the answer kept the source's there
        if self._offered is not None and 0 < n_drafted:
            at, then = self._offered
            self._refused_at = (at + n_accepted, then + n_accepted + 1) if n_accepted < n_drafted else None
        self._forget_offer()

    def _update(self, tokens: list[int]) -> None:
        # index n-grams that end at positions < len(tokens) - 1: the sequence's tail itself must
        # not match itself
        end = len(tokens) - 1
        for i in range(self._indexed, end):
            for n in NGRAM_SIZES:
                if i + 1 >= n:
                    self._index[tuple(tokens[i + 1 - n:i + 1])] = i + 1
        self._indexed = max(self._indexed, end)

    def _offer(self, tokens: list[int], at: int, k: int, matched: int) -> list[int]:
        """tokens[at:at + k] as the draft, found by `matched`, its renamed tokens as the answer
        writes them; [] if it is too short."""
        draft = tokens[at:at + k]
        if len(draft) < max(1, self.config.n_min):
            return []
        self.matched = matched
        self._offered = (at, len(tokens))
        if self._renamed:  # in a copy of the prompt (the answer's own text has its names as written)
            end = len(draft) if self.n_prompt is None else max(0, min(len(draft), self.n_prompt - at))
            self._offered_renamed = {j: t for j, t in enumerate(draft[:end]) if t in self._renamed}
            draft = [self._renamed.get(t, t) if j in self._offered_renamed else t for j, t in enumerate(draft)]
        return draft

    def _field_draft(self, tokens: list[int], k: int) -> list[int]:
        if self._field_layout is None:
            return []
        draft = self._field_layout.propose(tokens, k)
        if len(draft) < max(1, self.config.n_min):
            return []
        self.matched = FIELDS
        self._copy = None  # a copy of the prompt's tokens is not going on
        return draft

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """What followed the tail of tokens where it last occurred before (at most `limit`
        tokens; [] for no match): the longest draft on offer, which the scheduler cuts."""
        k = limit
        self.matched = 0
        self._forget_offer()
        if self._field_layout is None and self.separators is not None:
            start = self.n_prompt if self.n_prompt is not None else len(tokens) - 1
            self._field_layout = FieldLayout(self.separators, start, self.pieces, self.spaces)
        if k < max(1, self.config.n_min):
            return []
        self._update(tokens)
        for n in NGRAM_SIZES:
            if n == NGRAM_SIZES[1] and (draft := self._field_draft(tokens, k)):
                return draft  # the longest tail found nowhere: the prompt's fields in the answer's layout?
            if len(tokens) < n:
                continue
            at = self._index.get(tuple(tokens[-n:]))
            if at is not None and (draft := self._offer(tokens, at, k, n)):
                self._copy, self._sure = (at, len(tokens)), n >= 3
                return draft
        refused = self._refused_at
        if refused is not None and len(tokens) - refused[1] <= RESYNC_WINDOW:
            src = refused[0]
            window = tokens[src:min(src + RESYNC_WINDOW, len(tokens) - 1)]
            if tokens[-1] in window:  # the copy resumes just past the replacement
                at = src + window.index(tokens[-1]) + 1
                if draft := self._offer(tokens, at, k, RESYNC):
                    self._copy, self._sure = (at, len(tokens)), True
                    return draft
        if self._copy is not None and self._sure:  # nothing found: go on copying where the last copy came from
            src, then = self._copy
            step = len(tokens) - then  # tokens since, each standing for one source token
            at = src + step
            if refused is not None and refused[1] == len(tokens) and self.word_starts is not None:
                # the step right after a refusal: on from the word after the refused source word
                at = refused[0] + 1
                while at < len(tokens) - 1 and tokens[at] not in self.word_starts:
                    at += 1
            if 0 < step <= self.config.n_max + 1 and at < len(tokens) and \
                    (draft := self._offer(tokens, at, k, FOLLOW)):
                self._copy = (at, len(tokens))
                if refused is not None and refused[1] == len(tokens) and at == refused[0] + 1:
                    self._rename = (tokens[refused[0]], tokens[-1])  # one token for one, if the copy is kept
                return draft
        self._copy = None
        return []


# --- a draft model ------------------------------------------------------------------------------


class DraftModelError(ValueError):
    """A draft model that cannot draft for this target (named with the difference)."""


def check_vocabulary(target: Runtime, draft: Runtime) -> None:
    """DraftModelError unless draft's token ids mean what target's do (same tokenizer model and
    pre-tokenizer, the same token texts at every id, the same BOS and EOS)."""
    where = f"the draft model {draft.name} and the target {target.name}"
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id"):
        a, b = target.metadata.get(key), draft.metadata.get(key)
        if a != b:
            raise DraftModelError(f"{where} differ in {key}: {b!r} against {a!r}; a draft model must share the "
                                  "target's vocabulary")
    ta, tb = target.metadata.get("tokenizer.ggml.tokens") or [], draft.metadata.get("tokenizer.ggml.tokens") or []
    if ta != tb:
        n = min(len(ta), len(tb))
        i = next((i for i in range(n) if ta[i] != tb[i]), n)
        what = (f"token {i} is {tb[i]!r} against {ta[i]!r}" if i < n else
                f"the draft's vocabulary has {len(tb)} tokens against {len(ta)}")
        raise DraftModelError(f"{where} have different vocabularies: {what}; a draft model must share the "
                              "target's vocabulary")


class DraftModel:
    """A draft model and its KV cache: one sequence per slot of the scheduler it drafts for (see
    the module docstring). Only the scheduler's thread calls it. A failure here (the cache
    full, memory refused) costs the drafts of that step, never an answer."""

    def __init__(self, runtime: Runtime, kv: KVCache, n_step: int, n_vocab: int, p_min: float = P_MIN):
        self.runtime = runtime
        self.kv = kv
        self.n_step = n_step
        # the guesses come from the vocabulary's first DRAFT_OUT_VOCAB tokens: a BPE vocabulary
        # is in merge order, the common pieces first, and the output product is a large share of
        # a small model's weights (a third of qwen2.5-coder 0.5b's); a rarer token is not drafted
        runtime.native.out_vocab = min(n_vocab, runtime.n_vocab, DRAFT_OUT_VOCAB)
        self.n_vocab = runtime.native.out_vocab
        self.p_min = p_min
        self.held: dict[int, list[int]] = {}  # per sequence: the tokens its cache holds
        self.valid: dict[int, int] = {}  # per sequence: how many of held are known to be the task's
        self.registered: dict[int, int] = {}  # per sequence: tokens handed to the prefix cache
        self.costs = Costs()  # what its passes cost (draft_s), for choose_lengths

    @classmethod
    def load(cls, config: DraftConfig, target: Runtime, n_ctx: int, n_seq: int, n_step: int) -> DraftModel:
        """Load config.model for target (on the target's threads). FileNotFoundError or
        UnknownModelError for a model that is not there, DraftModelError for one larger than the
        target or with another vocabulary."""
        from bubo import store
        from bubo._model import KVCache
        from bubo.runtime import Runtime

        assert config.model is not None
        path = store.resolve(config.model)
        size, target_size = os.path.getsize(path), os.path.getsize(target.path)
        if size > target_size:
            raise DraftModelError(
                f"the draft model {config.model} ({size / 2**20:.0f} MiB) is larger than the target {target.name} "
                f"({target_size / 2**20:.0f} MiB): a draft model must be smaller than the model it drafts for")
        runtime = Runtime(path, n_threads=int(target.hparams["n_threads"]), name=config.model, requant=config.requant,
                          n_threads_batch=int(target.hparams["n_threads_batch"]))  # one pool: the same threads
        check_vocabulary(target, runtime)
        runtime.native.share_pool(target.native)  # one set of workers, warm for both models
        kv = KVCache(runtime.native, n_ctx, n_seq_max=n_seq, swa_full=True)
        return cls(runtime, kv, n_step, target.n_vocab, config.p_min)

    @property
    def weights_bytes(self) -> int:
        return os.path.getsize(self.runtime.path)

    # --- sequences ----------------------------------------------------------------------------

    def start(self, seq: int, tokens: list[int]) -> None:
        """A new task in seq: what the sequence holds is compared with tokens once; an empty one
        first takes the cached blocks that begin tokens."""
        if not self.held.get(seq):
            self.kv.free(seq)
            n = self.kv.prefix_attach(seq, np.asarray(tokens[:-1], dtype=np.int32)) if len(tokens) > 1 else 0
            self.held[seq] = list(tokens[:n])
            self.valid[seq] = self.registered[seq] = n
        else:
            self.valid[seq] = 0

    def forget(self, seq: int) -> None:
        """Empty seq (its task left, or was preempted)."""
        self.kv.free(seq)
        self.held[seq] = []
        self.valid[seq] = 0
        self.registered[seq] = 0

    def _sync(self, seq: int, tokens: list[int], upto: int) -> list[int]:
        """Roll seq back to where it agrees with tokens[:upto] (keeping at most upto - 1 of them
        when a row's logits are wanted: the caller decodes the rest); the tokens to decode."""
        held = self.held.setdefault(seq, [])
        n = min(self.valid.get(seq, 0), upto, len(held))
        while n < len(held) and n < upto and held[n] == tokens[n]:
            n += 1
        if n < len(held):
            self.kv.truncate(seq, n)
            del held[n:]
        self.valid[seq] = n
        self.registered[seq] = min(self.registered.get(seq, 0), n)
        return tokens[n:upto]

    def _decode(self, work: list[tuple[int, list[int], bool]]) -> dict[int, np.ndarray]:
        """Decode each (seq, tokens, want the last row's logits) in chunks of at most n_step rows;
        the wanted rows by sequence. Appends to held and registers full blocks."""
        toks: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        want: list[bool] = []
        for seq, rows, w in work:
            start = len(self.held[seq])
            toks += rows
            pos += range(start, start + len(rows))
            seqs += [seq] * len(rows)
            want += [False] * (len(rows) - 1) + [w]
            self.held[seq] += rows
        out: dict[int, np.ndarray] = {}
        for a in range(0, len(toks), self.n_step):
            b = min(a + self.n_step, len(toks))
            logits = self.runtime.native.decode(self.kv, np.asarray(toks[a:b], dtype=np.int32),
                                                np.asarray(pos[a:b], dtype=np.int32),
                                                np.asarray(seqs[a:b], dtype=np.int32), np.asarray(want[a:b]))
            r = 0
            for i in range(a, b):
                if want[i]:
                    out[seqs[i]] = logits[r]
                    r += 1
        return out

    def _failed(self, seqs: list[int], e: Exception) -> None:
        log.warning("the draft model could not run (%s: %s): no drafts this step", type(e).__name__, e)
        for seq in seqs:
            self.forget(seq)

    def follow(self, jobs: list[tuple[int, list[int], int]]) -> None:
        """Each (seq, tokens, upto): seq comes to hold tokens[:upto] (the prompt the target has
        read so far), no logits wanted."""
        work = [(seq, rows, False) for seq, tokens, upto in jobs if (rows := self._sync(seq, tokens, upto))]
        try:
            self._decode(work)
        except (MemoryError, ValueError) as e:
            self._failed([seq for seq, _, _ in work], e)
            return
        for seq, _, _ in jobs:
            self.valid[seq] = len(self.held[seq])
            self._register(seq)

    def _register(self, seq: int) -> None:
        """Index seq's full blocks of checked tokens for later prompts (as the target's are)."""
        n = self.valid[seq] // self.kv.block_size * self.kv.block_size
        if n > self.registered.get(seq, 0):
            self.kv.prefix_register(seq, np.asarray(self.held[seq][:n], dtype=np.int32))
            self.registered[seq] = n

    def _pick(self, row: np.ndarray) -> tuple[int, float]:
        """The draft's greedy token and its probability."""
        row = row[:self.n_vocab]
        tok = int(np.argmax(row))
        p = 1.0 / float(np.exp(row - row[tok]).sum())
        return tok, p

    def propose(self, jobs: list[tuple[int, list[int], int]],
                step_s: Callable[[int], float] | None = None) -> dict[int, list[int]]:
        """Each (seq, tokens, k): up to k tokens drafted after tokens, greedily, a forward pass of
        the draft model per token for every sequence at once. A draft ends early where its top
        token's probability is under p_min, and with step_s (seconds for the target's step with m
        drafted rows more), where going on cannot pay: the chance that the target keeps the
        first j drafted tokens is taken as the product of their probabilities, and the draft is
        cut to the length that gives the most tokens per second expected. Returns the drafts by
        sequence."""
        drafts: dict[int, list[int]] = {seq: [] for seq, _, _ in jobs}
        if not jobs:
            return drafts
        limit = {seq: k for seq, _, k in jobs}
        chance = {seq: 1.0 for seq in drafts}  # that the target keeps the whole draft so far
        gain = {seq: [1.0] for seq in drafts}  # tokens expected from the draft cut at j, by j
        pass_s = self.costs.draft_s or 0.0
        try:
            # the catch-up: every checked token the draft's sequence lacks (at least the last one)
            work = [(seq, self._sync(seq, tokens, len(tokens) - 1) + tokens[-1:], True) for seq, tokens, _ in jobs]
            rows = self._decode(work)
            for seq, tokens, _ in jobs:
                self.valid[seq] = len(tokens)
                self._register(seq)
            while rows:
                t0 = time.perf_counter()
                nxt: list[tuple[int, list[int], bool]] = []
                for seq, row in rows.items():
                    tok, p = self._pick(row)
                    if p < self.p_min:
                        continue
                    drafts[seq].append(tok)
                    chance[seq] *= p
                    gain[seq].append(gain[seq][-1] + chance[seq])
                    j = len(drafts[seq])
                    if j < limit[seq] and (step_s is None or self._worth_more(gain[seq], step_s, pass_s)):
                        nxt.append((seq, [tok], True))
                rows = self._decode(nxt) if nxt else {}
                if nxt:
                    self.costs.observe_draft(time.perf_counter() - t0)
        except (MemoryError, ValueError) as e:
            self._failed(list(drafts), e)
            return {seq: [] for seq in drafts}
        if step_s is not None:
            for seq, d in drafts.items():  # the passes are spent: cut where the check pays best
                n = len(d)
                best = max(range(1, n + 1), key=lambda j: gain[seq][j] / (step_s(j) + n * pass_s), default=0)
                del d[best:]  # (one token at least: its pass is paid, and its check says how drafts fare)
        return drafts

    @staticmethod
    def _worth_more(gain: list[float], step_s: Callable[[int], float], pass_s: float) -> bool:
        """Whether one more drafted token could raise the tokens per second expected of a draft
        with these gains (gain[j]: tokens expected from the draft cut at j), even if the target
        were sure to keep it."""
        j = len(gain) - 1
        best = max(gain[i] / (step_s(i) + j * pass_s) for i in range(j + 1))
        more = (gain[j] + (gain[j] - gain[j - 1])) / (step_s(j + 1) + (j + 1) * pass_s)
        return more > best
