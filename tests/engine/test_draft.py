"""Speculative decoding with prompt-lookup drafts (bubo.engine.draft) never changes an answer:
greedy answers are the plain greedy tokens, seeded ones the same tokens and log-probabilities,
with and without a JSON Schema grammar, on the three catalog models; drafting on in some slots
and off in others keeps every answer as it is alone (batch invariance); a request cancelled
while drafts are checked frees its slot and blocks; the counters say how many drafted tokens
were checked and kept."""

from __future__ import annotations

import random

import gevent
import pytest

import bubo
from bubo._grammar import Grammar
from bubo.chat.schema import schema_to_gbnf
from bubo.engine import FinishEvent, GenerationRequest, TokenEvent
from bubo.engine import scheduler as scheduler_module
from bubo.engine.draft import (
    FIELDS,
    FOLLOW,
    RESYNC,
    Costs,
    DraftConfig,
    FieldLayout,
    NgramDrafter,
    Pacing,
    choose_lengths,
    logits_row_factor,
)
from bubo.runtime import Runtime
from bubo.sampling import SamplingParams

from engines import THREADS, start_engine

GREEDY = SamplingParams(temperature=0)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, repeat_penalty=1.1, presence_penalty=0.2, seed=4242)

POEM = """The owl sat still upon the bough,
and watched the river run below;
the moon was bright, the night was cold,
the wind was soft, the hour was old."""
CODE = """def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)
"""
PROMPTS = [  # answers that repeat their prompt (drafts pay) and ones that do not
    "Copy this poem exactly, then write one more line:\n\n" + POEM,
    "Rewrite this function with the variable `total` renamed to `acc`:\n\n" + CODE,
    "Repeat the list, adding a fourth item: apples, pears, plums.",
    "Why is the sky blue?",
    "Write a haiku about owls.",
]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "lines"],
          "properties": {"name": {"type": "string"}, "lines": {"type": "array", "items": {"type": "string"}}}}


# --- the drafter alone -----------------------------------------------------------------------


def test_ngram_drafter_proposes_what_followed_the_tail_before():
    d = NgramDrafter(DraftConfig(n_max=8))
    toks = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]
    assert d.propose(toks, 8) == [8, 9, 1, 2, 5, 6, 7]  # the tail 5 6 7 was followed by 8 9 1 2 ...
    assert d.propose([1, 2, 3, 4], 8) == []  # no earlier occurrence
    assert d.propose(toks, 1) == [8]  # the limit holds
    d2 = NgramDrafter(DraftConfig(n_max=4, n_min=4))
    assert d2.propose([1, 2, 9, 1, 2], 8) == []  # fewer than n_min found


def test_ngram_drafter_goes_on_copying_past_a_changed_token():
    d = NgramDrafter(DraftConfig(n_max=8))
    prompt = [1, 2, 3, 40, 5, 6, 7, 8, 9, 99]
    seq = prompt + [1, 2]
    assert d.propose(seq, 8) == [3, 40, 5, 6, 7, 8, 9, 99] and d.matched == 2
    seq += [3, 41]  # the copy kept 3, then the answer says 41 where the prompt said 40
    fresh = NgramDrafter(DraftConfig(n_max=8))
    fresh.propose(seq[:-2], 8)
    assert fresh.propose(seq, 4) == []  # a copy found by 2 tokens and not yet kept: not gone on with
    d.taken(8, 1)
    assert d.propose(seq, 4) == [5, 6, 7, 8] and d.matched == FOLLOW  # ... one partly kept is
    d.taken(4, 4)
    seq += [5, 6, 7, 8, 50, 51]  # kept, then two tokens for one (9): the copy goes astray ...
    assert d.propose(seq, 4) == [1, 2, 3, 41] and d.matched == FOLLOW  # (six tokens on from 5)
    d.taken(4, 0)  # ... its draft refused from the first token
    seq += [77]
    assert d.propose(seq, 4) == []  # a tail found nowhere, and no copy going on: nothing
    assert d.propose([1, 2, 3], 4) == []  # never from another (shorter) sequence's record


def test_ngram_drafter_resumes_its_copy_past_a_replaced_word():
    """A misspelled word of two tokens (11 21) corrected to one (30): the copy goes on at the
    source's next word (12: tokens 10-19 begin words, 20-29 go on one), not one token on (21);
    where the answer takes two tokens (30 31) and the copy is refused, the answer's next token
    found just past the refused place (12) resumes it."""
    starts = set(range(10, 20))
    prompt = [1, 2, 3, 10, 11, 21, 12, 13, 14, 15, 16, 17, 99]
    for word_starts, want in ((starts, [12, 13, 14, 15]), (None, [21, 12, 13, 14])):
        d = NgramDrafter(DraftConfig(n_max=8), word_starts)
        seq = prompt + [1, 2]
        assert d.propose(seq, 8) == [3, 10, 11, 21, 12, 13, 14, 15] and d.matched == 2
        d.taken(8, 2)  # 3 and 10 kept; the answer says 30 where the prompt said 11 21
        seq += [3, 10, 30]
        assert d.propose(seq, 4) == want and d.matched == FOLLOW
    d.taken(4, 0)  # the answer's word goes on (31): refused from its first token
    seq += [31]
    assert d.propose(seq, 4) == []  # 30 31 is found nowhere, and the copy went astray
    d.idle()
    seq += [12]
    assert d.propose(seq, 4) == [13, 14, 15, 16] and d.matched == RESYNC  # 12, just past where it was refused
    d.taken(4, 4)
    seq += [13, 14, 15, 16, 88]  # 88 for 17: the copy goes on ...
    assert d.propose(seq, 1) == [99] and d.matched == FOLLOW
    d.taken(1, 0)  # ... and is refused (66 for 99)
    seq += [66, 60, 61, 62, 63, 64, 65, 67, 68, 99]
    assert d.propose(seq, 4) == [] and d.matched == 0  # too long since: 99 resumes nothing


def test_ngram_drafter_drafts_a_renamed_token_as_the_answer_writes_it():
    """A variable renamed (40 written as 41): once the copy is refused at it and kept right after
    it, later copies draft 41 at each of 40's places, until the answer keeps a 40."""
    prompt = [1, 2, 3, 40, 5, 6, 40, 7, 8, 40, 9, 40, 10, 99]
    d = NgramDrafter(DraftConfig(n_max=8))
    seq = prompt + [1, 2]
    assert d.propose(seq, 8) == [3, 40, 5, 6, 40, 7, 8, 40]
    d.taken(8, 1)  # 3 kept, 41 written for 40
    seq += [3, 41]
    assert d.propose(seq, 8) == [5, 6, 40, 7, 8, 40, 9, 40] and d.matched == FOLLOW  # not yet known as renamed
    d.taken(8, 2)  # the copy kept right after 41: one token for one; 41 for 40 again
    seq += [5, 6, 41]
    assert d.propose(seq, 8) == [7, 8, 41, 9, 41, 10, 99, 1] and d.matched == FOLLOW  # drafted as renamed
    d.taken(8, 2)  # ... but here the answer keeps 40: the rename is forgotten
    seq += [7, 8, 40]
    assert d.propose(seq, 8) == [9, 40, 10, 99, 1, 2, 3, 41] and d.matched == 3
    fresh = NgramDrafter(DraftConfig(n_max=8))
    fresh.propose(prompt + [1, 2], 8)
    fresh.taken(8, 1)
    fresh.propose(prompt + [1, 2, 3, 41], 8)
    fresh.taken(8, 0)  # the copy refused from its first token: 41 may stand for more than 40
    assert fresh.propose(prompt + [1, 2, 3, 41, 77, 5, 6], 8)[:3] == [40, 7, 8]  # nothing learned


# A list turned into a table: separators 100 ", ", 101 ": ", 102 "; ", 103 " | ", 106 "| ",
# 107 " |\n"; fields apples (1 2), pears (3), plums (4 5), quantities 11-13, prices 21-23
SEPS = {100, 101, 102, 103, 106, 107}
LIST = [60, 61, 101, 1, 2, 101, 11, 100, 21, 102, 3, 101, 12, 100, 22, 102, 4, 5, 101, 13, 100, 23]
TABLE = [106, 1, 2, 103, 11, 103, 21, 107, 106, 3, 103, 12, 103, 22, 107, 106, 4, 5, 103, 13, 103, 23, 107]


def test_field_layout_drafts_the_prompts_next_fields_in_the_answers_layout():
    d = NgramDrafter(DraftConfig(n_max=16), separators=SEPS, n_prompt=len(LIST))
    # the first row: no layout to follow yet; after a separator, the prompt's next field
    assert d.propose(LIST + TABLE[:4], 16) == [11] and d.matched == FIELDS
    # the second row's first field written: the first row's layout, with the prompt's fields
    assert d.propose(LIST + TABLE[:11], 16) == [12, 103, 22, 107, 106, 4, 5, 103] and d.matched == FIELDS
    assert d.propose(LIST + TABLE[:11], 3) == [12, 103, 22]  # the limit holds
    # a field still being written (plums: 4 of 4 5): its rest, then the layout
    assert d.propose(LIST + TABLE[:17], 16)[:6] == [5, 103, 13, 103, 23, 107] and d.matched == FIELDS
    # a field the prompt does not have: nothing
    other = NgramDrafter(DraftConfig(n_max=16), separators=SEPS, n_prompt=len(LIST))
    assert other.propose(LIST + TABLE[:8] + [106, 30, 103], 16) == []
    verbatim = NgramDrafter(DraftConfig(n_max=16), separators=SEPS, n_prompt=len(LIST))
    assert verbatim.propose(LIST + LIST[3:7], 4) == [100, 21, 102, 3] and verbatim.matched == 4
    plain = NgramDrafter(DraftConfig(n_max=16))
    assert plain.propose(LIST + TABLE[:11], 16) == []  # without separators, no n-gram of the tail is found
    early = NgramDrafter(DraftConfig(n_max=16), separators=SEPS, n_prompt=len(LIST))
    assert early.propose(LIST[:10], 16) == []  # asked before the prompt is whole: it is not indexed yet
    assert early.propose(LIST + TABLE[:11], 16) == [12, 103, 22, 107, 106, 4, 5, 103]


def test_field_layout_pads_each_value_to_its_columns_width():
    """A table whose quantities are padded with spaces (110-113: 1-4 of them) to one width: after
    "3 kg" and 2 spaces, "10 kg" is drafted with 1 and "100 kg" with none; without the tokens'
    texts, the template's 2 spaces."""
    texts = {1: b"app", 2: b"les", 3: b"pears", 4: b"pl", 5: b"ums", 11: b"3 kg", 12: b"10 kg", 13: b"100 kg",
             21: b"4 EUR", 22: b"3 EUR", 23: b"2 EUR", 60: b"List", 61: b" of", 100: b", ", 101: b": ",
             102: b"; ", 103: b" | ", 106: b"| ", 107: b" |\n", 110: b" ", 111: b"  ", 112: b"   ", 113: b"    "}
    pieces = [texts.get(i, b"x") for i in range(120)]
    seps, spaces = SEPS | {110, 111, 112, 113}, {1: 110, 2: 111, 3: 112, 4: 113}
    row1 = [106, 1, 2, 103, 11, 111, 103, 21, 107]
    seq = LIST + row1 + [106, 3, 103]
    assert FieldLayout(seps, len(LIST), pieces, spaces).propose(seq, 8) == [12, 110, 103, 22, 107, 106, 4, 5]
    assert FieldLayout(seps, len(LIST)).propose(seq, 8) == [12, 111, 103, 22, 107, 106, 4, 5]
    seq += [12, 110, 103, 22, 107, 106, 4, 5, 103]
    assert FieldLayout(seps, len(LIST), pieces, spaces).propose(seq, 4) == [13, 103, 23, 107]
    # a decimal point goes on its number's field: "1.5 kg" (15 16 17) is one value, as wide as "3 kg" and 2 spaces
    pieces[15], pieces[16], pieces[17] = b"1", b".", b"5 kg"
    decimal = LIST[:12] + [15, 16, 17] + LIST[13:]
    seq = decimal + row1 + [106, 3, 103]
    assert FieldLayout(seps | {16}, len(decimal), pieces, spaces).propose(seq, 8) == [15, 16, 17, 103, 22, 107, 106, 4]
    # ... but a "." that ends a number is a separator, in the prompt and in the answer: "1. apples"
    fl = FieldLayout(seps | {16}, 6, pieces, spaces)
    fl.propose([15, 16, 1, 2, 101, 11, 106, 15, 16, 1, 2], 4)
    assert fl._fields == [(15,), (1, 2), (11,)] and fl._items == [106, -1, 16, -1]
    fl = FieldLayout(seps | {16}, 6, pieces, spaces)
    fl.propose([15, 16, 17, 101, 11, 106, 15, 16], 4)
    assert fl._fields == [(15, 16, 17), (11,)] and fl._answer == [[15, 16]]  # the number may go on
    # records of a key (70 "qty") padded, then a value: the key's padding is the template's
    pieces[70], pieces[108] = b"qty", b"\n"
    listed = [60, 61, 101, 11, 100, 12, 100, 13]
    seq = listed + [70, 111, 101, 11, 108, 70, 111, 101, 12, 108, 70]
    plain = FieldLayout(seps | {108}, len(listed)).propose(seq, 5)
    assert plain[:3] == [111, 101, 13]
    assert FieldLayout(seps | {108}, len(listed), pieces, spaces).propose(seq, 5) == plain


def test_field_layout_finds_a_repeated_field_by_the_fields_before_it():
    """A value that occurs three times in the prompt (2): the place whose preceding fields match
    the answer's is the one copied, not the latest."""
    prompt = [5, 101, 6, 100, 2, 102, 3, 101, 7, 100, 2, 102, 1, 101, 2, 100, 50, 102, 4, 101, 8, 100, 9]
    answer = [106, 5, 103, 6, 103, 2, 107, 106, 3, 103, 7, 103, 2]
    d = NgramDrafter(DraftConfig(n_max=16), separators=SEPS, n_prompt=len(prompt))
    assert d.propose(prompt + answer, 16)[:6] == [107, 106, 1, 103, 2, 103]  # after 3 7 2, not after 1 2
    # at least two tokens must match: one field of one token alone is not enough to go on
    lone = NgramDrafter(DraftConfig(n_max=16), separators=SEPS, n_prompt=len(prompt))
    assert lone.propose(prompt + [106, 8], 16) == []


def test_field_layout_writes_the_answers_own_keys_as_it_wrote_them():
    """The list as JSON objects: keys 70 (fruit) and 71 72 (quantity) are the answer's own, written
    in every record and found nowhere in the prompt; between them, the prompt's values. Separators
    110 '{"', 111 '": "', 112 '",\n"', 113 '"}\n'."""
    prompt = [60, 61, 101, 1, 2, 101, 11, 102, 3, 101, 12, 102, 4, 5, 101, 13, 102, 6, 101, 14]
    records = [[110, 70, 111, *fruit, 112, 71, 72, 111, qty, 113]
               for fruit, qty in (([1, 2], 11), ([3], 12), ([4, 5], 13), ([6], 14))]
    answer = [t for r in records for t in r]
    third = len(records[0]) + len(records[1])
    d = NgramDrafter(DraftConfig(n_max=16), separators=SEPS | {110, 111, 112, 113}, n_prompt=len(prompt))
    # at the third record: its keys as the second wrote them, the prompt's next values between them
    assert d.propose(prompt + answer[:third + 1], 16)[:11] == [70, 111, 4, 5, 112, 71, 72, 111, 13, 113, 110]
    assert d.matched == FIELDS
    # a key half written (71 of 71 72): its rest, then the layout, where one record on it is whole
    assert d.propose(prompt + answer[:third + 7], 16) == [72, 111, 13, 113, 110, 70, 111, 6, 112, 71, 72]


def test_field_layout_finds_the_records_period_among_pairs_alike():
    """Objects of five "key": "value" pairs with the same separators: the layout's last items
    occur a pair back, two, ... and an object back; the period is the one under which the keys
    repeat (a pair back, each key would be taken for a value and replaced by the prompt's)."""
    values = [[1 + 10 * r + c] for r in range(4) for c in range(5)]  # 4 records of 5 one-token values
    prompt = [60, 101] + [t for v in values for t in (*v, 100)]
    answer = []
    for r in range(4):
        answer.append(110)
        for c in range(5):
            answer += [70 + c, 111, *values[5 * r + c], 112 if c < 4 else 113]
    seps = SEPS | {110, 111, 112, 113}
    d = NgramDrafter(DraftConfig(n_max=16), separators=seps, n_prompt=len(prompt))
    third = 2 * 21 + 1 + 3 * 4  # two records, then the third's opening and three pairs
    assert d.propose(prompt + answer[:third], 16)[:8] == [73, 111, 24, 112, 74, 111, 25, 113]
    assert d.matched == FIELDS


def test_field_layout_on_random_sequences_keeps_its_contract():
    """Random prompts and answers (lists laid out anew with random separators, copies, noise),
    proposed for at every length as they grow: every draft is at most `limit` tokens of the
    sequence's own vocabulary, and the layout built step by step drafts what one built at once
    over the same tokens drafts (its indexes follow the sequence exactly)."""
    rng = random.Random(44)
    for _ in range(150):
        vocab = list(range(rng.choice([4, 12, 60])))
        seps = set(rng.sample(vocab, rng.randint(1, len(vocab) // 2)))
        words = [t for t in vocab if t not in seps]
        fields = [[rng.choice(words) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 8))]
        prompt = [t for f in fields for t in (*f, rng.choice(list(seps)))]
        layout = [rng.choice(list(seps)) for _ in range(rng.randint(1, 3))]
        answer: list[int] = []
        while len(answer) < 60:
            r = rng.random()
            answer += rng.choice(fields) + layout if r < 0.6 else [rng.choice(vocab)]
        d = FieldLayout(seps, len(prompt))
        for n in range(len(prompt) + 1, len(prompt) + len(answer)):
            limit = rng.randint(0, 12)
            seq = (prompt + answer)[:n]
            draft = d.propose(seq, limit)
            assert len(draft) <= limit and all(isinstance(t, int) and t in vocab for t in draft)
            if n % 7 == 0:
                assert FieldLayout(seps, len(prompt)).propose(seq, limit) == draft


ITEMS = ("apples: 3 kg, 4.50 EUR; pears: 2 kg, 3.80 EUR; plums: 1 kg, 2.90 EUR; cherries: 500 g, 5.20 EUR; "
         "grapes: 1.5 kg, 4.10 EUR; lemons: 6 pieces, 2.40 EUR")
MARKDOWN_TABLE = "\n".join([
    "| fruit | quantity | price |", "|------|----------|-------|", "| apples | 3 kg     | 4.50 EUR |",
    "| pears | 2 kg     | 3.80 EUR |", "| plums | 1 kg     | 2.90 EUR |", "| cherries | 500 g   | 5.20 EUR |",
    "| grapes | 1.5 kg   | 4.10 EUR |", "| lemons | 6 pieces | 2.40 EUR |"])


def passes_to_write(drafter, prompt, answer, cap=4):
    """Forward passes that give `answer` after `prompt` with this drafter's drafts (each at most
    `cap` tokens), and how many of its tokens came from FieldLayout's drafts."""
    tokens, passes, by_fields = list(prompt) + answer[:1], 0, 0
    while len(tokens) < len(prompt) + len(answer):
        at = len(tokens) - len(prompt)
        draft = drafter.propose(tokens, min(cap, len(answer) - at))
        kept = 0
        while kept < len(draft) and draft[kept] == answer[at + kept]:
            kept += 1
        if draft:
            drafter.taken(len(draft), kept)
            by_fields += kept if drafter.matched == FIELDS else 0
        tokens += answer[at:at + kept + 1]
        passes += 1
    return passes, by_fields


YAML = "\n\n".join(f"{f}: \n  name: {f}\n  quantity: {q}\n  price: {p}" for f, q, p in (
    ("apples", "3 kg", "4.50 EUR"), ("pears", "2 kg", "3.80 EUR"), ("plums", "1 kg", "2.90 EUR"),
    ("cherries", "500 g", "5.20 EUR"), ("grapes", "1.5 kg", "4.10 EUR"), ("lemons", "6 pieces", "2.40 EUR")))


@pytest.mark.models
@pytest.mark.parametrize("ask,answer,fewer", [("a Markdown table", MARKDOWN_TABLE, 0.75),
                                              ("YAML with keys name, quantity and price", YAML, 0.9)],
                         ids=["table", "yaml"])
def test_field_layout_on_a_real_vocabulary_a_list_laid_out_anew(catalog_model, ask, answer, fewer):
    """qwen2.5-coder's tokens for a list and what its 1.5b writes of it (a Markdown table; YAML,
    whose keys are the answer's own): from the second row or mapping on, the drafts of the
    prompt's values in the answer's layout are kept, and the answer takes fewer passes than with
    n-gram drafts alone."""
    rt = Runtime(catalog_model("qwen2.5-coder:0.5b"), n_threads=1)
    prompt = rt.tokenizer.encode(f"Turn this list into {ask}:\n\n" + ITEMS + "\n\n", True, False)
    ids = rt.tokenizer.encode(answer, False, False)
    n_gram = passes_to_write(NgramDrafter(DraftConfig(), rt.word_starts()), prompt, ids)
    fields = passes_to_write(NgramDrafter(DraftConfig(), rt.word_starts(), rt.separators(), len(prompt)),
                             prompt, ids)
    assert n_gram[1] == 0 and fields[1] >= len(ids) // 4, (n_gram, fields, len(ids))
    assert fields[0] <= fewer * n_gram[0], (n_gram, fields, len(ids))


def test_pacing_learns_how_likely_a_drafted_token_is_kept_and_forgets_slowly():
    p = Pacing(DraftConfig())
    assert p.alpha(0.5) == 0.5 and p.alpha(0.9) == pytest.approx(0.9)  # the prior alone
    for _ in range(10):
        p.taken(4, 4)
    high = p.alpha(0.5)
    assert high > 0.9
    for _ in range(8):
        p.taken(4, 0)
    low = p.alpha(0.5)
    assert low < 0.4  # the recent drafts weigh most
    for _ in range(30):
        p.idle()
    assert low < p.alpha(0.5) < 0.5 + 1e-9  # back towards the prior: drafting is tried again
    assert (p.n_drafted, p.n_accepted) == (72, 40)
    p.taken(0, 0)  # asked and nothing drafted: a refusal, no count
    assert (p.n_drafted, p.n_accepted) == (72, 40)


def tile_cost(m):
    """A CPU's pass: 4 rows cost little more than 1, 5 to 8 a second tile (as measured on AVX-512)."""
    return 1.0 + 0.1 * min(m, 3) + (0.8 + 0.1 * (m - 4) if m >= 4 else 0.0)


def test_choose_lengths_weighs_the_tokens_expected_against_what_the_pass_costs():
    # free drafts (prompt lookup) that are always right: as long as allowed
    assert choose_lengths([0.99], [16], tile_cost, 0.0) == [16]
    # likely kept, but a fifth row costs a whole tile: three drafted tokens (four rows)
    assert choose_lengths([0.8], [16], tile_cost, 0.0) == [3]
    # a draft model whose pass costs 0.4 of the target's: fewer, or none when unlikely kept
    assert choose_lengths([0.8], [16], tile_cost, 0.4) == [2]
    assert choose_lengths([0.2], [16], tile_cost, 0.4) == [0]
    assert choose_lengths([0.99], [2], tile_cost, 0.0) == [2]  # the cap holds
    # several sequences share the step's rows: the likelier drafts get them
    ks = choose_lengths([0.9, 0.3], [16, 16], lambda m: 1.0 + 0.05 * m, 0.0)
    assert ks[0] > ks[1]
    assert choose_lengths([0.9, 0.9], [0, 0], tile_cost, 0.0) == [0, 0]


def test_costs_estimate_row_counts_not_run_yet():
    c = Costs()
    assert c.target(1) is None
    for _ in range(3):
        c.observe(1, 0.050)
        c.observe(4, 0.070)
    assert c.target(1) == 0.050 and c.target(4) == 0.070  # known: run three times
    # not run: optimistic, a tenth of a one-row pass per row past the count below, or the line
    # between its neighbours where that is less
    assert c.target(2) == pytest.approx(0.055)
    assert c.target(8) == pytest.approx(0.070 + 4 * 0.005)
    c.observe(3, 0.090)  # one slow pass does not rule three rows out ...
    assert c.target(3) == pytest.approx(0.060)
    c.observe(3, 0.080)
    c.observe(3, 0.085)
    assert c.target(3) == 0.085  # ... three do (the median of the recent runs)
    c.observe(4, 0.500)  # and one outlier among known runs moves nothing
    assert c.target(4) == 0.070
    # prompts' chunks: 32 rows (one giving logits) in 0.48 s or more bound a row with logits at
    # 15 ms (row_factor 1: as much as a prompt's row), so 8 rows cost at least 0.120 s (not the
    # 0.090 the tenth-of-a-pass slope says); 2 rows stay on the slope
    c.observe_rows(32, 1, 0.640)
    assert c.row_s is None and c.target(8) == pytest.approx(0.090)  # a first chunk may be slow: not yet
    c.observe_rows(32, 1, 0.480)
    assert c.row_s == pytest.approx(0.015)  # the least of the recent chunks' bounds
    assert c.target(8) == pytest.approx(8 * 0.015) and c.target(2) == pytest.approx(0.055)
    # a count run bounds it too: 5 rows in 0.06 s, 12 ms a row
    for _ in range(3):
        c.observe(5, 0.060)
    assert c.row_s == pytest.approx(0.012) and c.target(8) == pytest.approx(8 * 0.012)
    assert c.alpha == 0.5 and Costs(0.7).alpha == pytest.approx(0.7)
    c.record(4, 4)
    assert c.alpha > 0.5
    # a row with logits computes row_factor times a prompt's row: 30 prompt rows and 2 with logits
    # (1.5 each) in 0.33 s: 10 ms a prompt row, 15 ms one with logits
    c = Costs(row_factor=1.5)
    for _ in range(2):
        c.observe_rows(32, 2, 0.330)
    assert c.row_s == pytest.approx(0.015)


def test_a_row_with_logits_computes_the_output_matrix_besides_the_layers():
    import types

    shapes = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
    smollm2 = types.SimpleNamespace(hparams={"n_layer": 30, "n_embd": 576}, out_vocab=49152,
                                    matrix_shape=lambda layer, mat: shapes[mat])
    assert logits_row_factor(smollm2) == pytest.approx(1.2667, abs=1e-4)  # 28.3 M multiply-adds over 106.2 M
    smollm2.out_vocab = 16384  # a draft model's trimmed output: fewer logits
    assert logits_row_factor(smollm2) == pytest.approx(1.0889, abs=1e-4)
    assert logits_row_factor(types.SimpleNamespace(hparams={})) == 1.0  # a model that does not say


def test_draft_config_bounds():
    with pytest.raises(ValueError, match="draft max"):
        DraftConfig(n_max=0)
    with pytest.raises(ValueError, match="draft min"):
        DraftConfig(n_max=4, n_min=5)
    with pytest.raises(ValueError, match="draft p-min"):
        DraftConfig(p_min=-0.1)


# --- the library: the same answers, drafted or not -------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def drafts_at_their_cap():
    """Every draft at its cap (at most 4 tokens): the tests with models are about the checking,
    not the pacing (choose_lengths weighs what passes cost on the machine at hand: it would draft
    less, and differently from run to run, than a test can count on)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(scheduler_module, "choose_lengths", lambda alphas, caps, step_s, draft_s: [min(c, 4) for c in caps])
    yield
    mp.undo()


def answers(model, params, grammar=None, max_tokens=96):
    out = []
    for p in PROMPTS:
        c = model.chat([{"role": "user", "content": p}], max_tokens=max_tokens, grammar=grammar,
                       **{k: v for k, v in vars(params).items() if k in ("temperature", "top_p", "repeat_penalty",
                                                                         "presence_penalty", "seed")})
        out.append((c.tokens, c.logprobs, c.timings))
    return out


@pytest.mark.models
@pytest.mark.parametrize("name", ["smollm2:135m", "qwen2.5-coder:0.5b"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_drafting_never_changes_an_answer(catalog_model, name, params):
    g = schema_to_gbnf(PERSON)
    kinds = [(params, None, 96)] + ([(GREEDY, g, 64)] if params is GREEDY else [])
    plain = plain_answers(catalog_model(name), kinds)
    drafted = bubo.Model(catalog_model(name), n_ctx=2048, n_threads=THREADS, draft=DraftConfig(n_max=8))
    b = answers(drafted, params)
    for (ta, la), (tb, lb, _) in zip(plain[0], b):
        assert tb == ta
        assert lb == la  # the log-probabilities too, bit for bit
    assert sum(t.draft_n_accepted for _, _, t in b) > 20  # drafts were checked and kept: the test can fail
    if params is GREEDY:
        b = answers(drafted, params, grammar=g, max_tokens=64)
        assert plain[1] == [tuple(x[:2]) for x in b]
        assert sum(t.draft_n for _, _, t in b) > 0


def plain_answers(path, kinds):
    """(tokens, log-probabilities) of PROMPTS' answers without drafting, for each (params, grammar
    text or None, max_tokens) in kinds: every one at once, as one batch of an engine, which gives
    the same bits as one by one (tests/native/test_batch_invariance.py) in a fraction of the time."""
    n = len(kinds) * len(PROMPTS)
    e = start_engine(path, n_ctx=n * 512, n_parallel=n, draft=None)
    try:
        jobs = [[gevent.spawn(collect, e.submit(GenerationRequest(prompt_ids(e, text), params, max_tokens,
                                                                  grammar=Grammar(g) if g else None)))
                 for text in PROMPTS] for params, g, max_tokens in kinds]
        gevent.joinall([j for js in jobs for j in js], raise_error=True, timeout=600)
    finally:
        e.stop()
    for js in jobs:
        assert all(j.value[2].timings.draft_n == 0 for j in js)  # nothing drafted
    return [[tuple(j.value[:2]) for j in js] for js in jobs]


@pytest.mark.models
def test_gemma3_a_sliding_window_model_drafts_in_the_server_and_not_in_the_library(catalog_model):
    """The library's gemma3 cache keeps only the window's blocks, which a rollback could need:
    it does not draft there; the server's (swa_full) does, with the same tokens."""
    path = catalog_model("gemma3:270m")
    m = bubo.Model(path, n_ctx=1024, n_threads=THREADS)
    prompt = "Copy: " + POEM + "\n\nCopy: " + POEM.split("\n")[0]
    c = m.complete(prompt, max_tokens=48, temperature=0)
    assert c.timings.draft_n == 0
    e = start_engine(path, n_ctx=1024, n_parallel=1)
    try:
        events = list(e.submit(GenerationRequest(m.tokenize(prompt), GREEDY, 48)))
    finally:
        e.stop()
    fin = events[-1]
    assert isinstance(fin, FinishEvent) and fin.timings.draft_n_accepted > 0
    assert [ev.token for ev in events[:-1]] == c.tokens


# --- the engine: slots drafting and not, cancellation, counters ------------------------------


@pytest.fixture(scope="module")
def engine(catalog_model):
    e = start_engine(catalog_model("smollm2:135m"), n_ctx=4096, n_parallel=4, draft=DraftConfig(n_max=8))
    yield e
    e.stop()


def prompt_ids(engine, text):
    return engine.tokenizer.encode(engine.runtime.chat_prompt([{"role": "user", "content": text}]),
                                   add_special=True, parse_special=True)


def collect(stream):
    events = list(stream)
    assert isinstance(events[-1], FinishEvent), events[-1:]
    return [e.token for e in events[:-1]], [e.logprob for e in events[:-1]], events[-1]


@pytest.mark.models
def test_drafting_on_in_some_slots_and_off_in_others_keeps_every_answer(engine):
    alone = {}
    for i, text in enumerate(PROMPTS[:4]):
        req = GenerationRequest(prompt_ids(engine, text), SEEDED if i % 2 else GREEDY, 80, draft_max=0)
        alone[i] = collect(engine.submit(req))[:2]
    reqs = [GenerationRequest(prompt_ids(engine, t), SEEDED if i % 2 else GREEDY, 80, draft_max=0 if i < 2 else None)
            for i, t in enumerate(PROMPTS[:4])]
    streams = [engine.submit(r) for r in reqs]
    jobs = [gevent.spawn(collect, s) for s in streams]
    gevent.joinall(jobs, raise_error=True, timeout=300)
    for i, j in enumerate(jobs):
        toks, lps, fin = j.value
        assert (toks, lps) == alone[i], i
        if i < 2:
            assert fin.timings.draft_n == 0, i  # drafting off for this request
    assert jobs[2].value[2].timings.draft_n_accepted > 0  # the copying prompt drafted beside them
    # the prompts' chunks told the pacing what a row's arithmetic costs at most, a row with logits
    # counted as smollm2's layers and output matrix over its layers alone
    costs = engine._sched.costs
    assert costs.row_s is not None and 0 < costs.row_s < costs.target(1)
    assert costs.row_factor == pytest.approx(1.2667, abs=1e-4)


def cancel_after(engine, req, n_tokens):
    """Submit req, cancel it after n_tokens tokens (while it drafts) and wait for the engine to idle."""
    stream = engine.submit(req)
    n = 0
    for ev in stream:
        if isinstance(ev, TokenEvent):
            n += 1
            if n == n_tokens:
                stream.cancel()
                break
    with gevent.Timeout(30):
        while engine.busy:
            gevent.sleep(0.01)


@pytest.mark.models
def test_cancelling_while_drafts_are_checked_frees_everything(engine):
    before = engine.metrics().n_drafted_total
    cancel_after(engine, GenerationRequest(prompt_ids(engine, PROMPTS[0]), GREEDY, 400), 40)
    assert engine.metrics().n_drafted_total > before  # it was drafting when cancelled
    assert engine.kv.blocks_in_use() == 0
    assert all(engine.kv.seq_len(s) == 0 for s in range(4))


@pytest.mark.models
def test_counters_and_timings_report_drafts(engine):
    m0 = engine.metrics()
    toks, _, fin = collect(engine.submit(GenerationRequest(prompt_ids(engine, PROMPTS[1]), GREEDY, 80)))
    t = fin.timings
    assert 0 < t.draft_n_accepted <= t.draft_n
    m1 = engine.metrics()
    assert m1.n_drafted_total - m0.n_drafted_total == t.draft_n
    assert m1.n_drafted_accepted_total - m0.n_drafted_accepted_total == t.draft_n_accepted
    # fewer forward passes than tokens: the point of it
    assert m1.n_decode_total - m0.n_decode_total < len(toks)
