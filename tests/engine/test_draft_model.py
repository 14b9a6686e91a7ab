"""Speculative decoding with a draft model (bubo.engine.draft.DraftModel) never changes an answer:
qwen2.5-coder:1.5b drafted by qwen2.5-coder:0.5b gives the plain greedy tokens, with and without
a JSON Schema grammar, and a seeded request the same tokens and log-probabilities; in the engine,
drafting on in some slots and off in others keeps every answer as it is alone, a request
cancelled while its drafts are checked frees its slot in both caches; a draft model with another
vocabulary, a larger one and a missing file are refused when the model is made. The pair's draft
model has its weights requantized to q4_0 at load (the default); the engine's keeps the file's.

Every draft here is drawn at its cap (at most 4 tokens): these tests are about the checking, not
the pacing (bubo.engine.draft.choose_lengths, tested in test_draft.py, which weighs what passes
cost on the machine at hand: it would draft less, and differently from run to run). The engine
tests draft with smollm2:135m for itself (which the pacing would rightly never do: its passes
cost what the target's do)."""

from __future__ import annotations

import types

import gevent
import pytest

import bubo
from bubo.chat.schema import schema_to_gbnf
from bubo.engine import FinishEvent, GenerationRequest
from bubo.engine.draft import DraftConfig, DraftModelError, check_vocabulary

from .test_draft import (  # noqa: F401 (drafts_at_their_cap: the module's autouse fixture)
    GREEDY,
    PERSON,
    PROMPTS,
    SEEDED,
    answers,
    cancel_after,
    collect,
    drafts_at_their_cap,
    plain_answers,
    prompt_ids,
)
from engines import THREADS, start_engine

pytestmark = pytest.mark.slow  # a sweep or a build: the whole suite runs it, the quick tier does not

TARGET, DRAFT = "qwen2.5-coder:1.5b", "qwen2.5-coder:0.5b"


# --- refused at start ------------------------------------------------------------------------


def fake_runtime(name, tokens, pre="qwen2"):
    return types.SimpleNamespace(name=name, metadata={"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                                                      "tokenizer.ggml.tokens": tokens})


def test_the_vocabulary_check_names_the_first_difference():
    a = fake_runtime("target", ["a", "b", "c", "d"])
    check_vocabulary(a, fake_runtime("same", ["a", "b", "c", "d"]))
    with pytest.raises(DraftModelError, match="token 2 is 'x' against 'c'"):
        check_vocabulary(a, fake_runtime("draft", ["a", "b", "x", "d"]))
    with pytest.raises(DraftModelError, match="has 3 tokens against 4"):
        check_vocabulary(a, fake_runtime("draft", ["a", "b", "c"]))
    with pytest.raises(DraftModelError, match="tokenizer.ggml.pre: 'llama-bpe' against 'qwen2'"):
        check_vocabulary(a, fake_runtime("draft", ["a", "b", "c", "d"], pre="llama-bpe"))


@pytest.mark.models
def test_a_draft_model_that_cannot_draft_is_refused(catalog_model, tmp_path):
    target = catalog_model(DRAFT)
    with pytest.raises(DraftModelError, match="differ in tokenizer.ggml.pre"):
        bubo.Model(target, n_ctx=256, draft=catalog_model("smollm2:135m"))
    with pytest.raises(DraftModelError, match="is larger than the target"):
        bubo.Model(target, n_ctx=256, draft=TARGET)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bubo.Model(target, n_ctx=256, draft=str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="draft p-min"):
        DraftConfig(model=DRAFT, p_min=1.5)
    with pytest.raises(ValueError, match="draft requant must be one of"):
        DraftConfig(model=DRAFT, requant="q4_K")


# --- the real pair: the same answers ---------------------------------------------------------


PLAIN = {"greedy": (GREEDY, None, 40), "grammar": (GREEDY, schema_to_gbnf(PERSON), 32), "seeded": (SEEDED, None, 40)}


@pytest.fixture(scope="module")
def plain(catalog_model):
    """The target's answers without drafting (tokens, log-probabilities) to every request the pair
    is asked below, by kind, made at once (test_draft.plain_answers)."""
    return dict(zip(PLAIN, plain_answers(catalog_model(TARGET), list(PLAIN.values()))))


@pytest.fixture(scope="module")
def drafted(catalog_model):
    m = bubo.Model(catalog_model(TARGET), n_ctx=2048, n_threads=THREADS, draft=catalog_model(DRAFT))
    yield m
    m.close()


@pytest.mark.models
def test_greedy_answers_drafted_by_a_draft_model_are_the_plain_ones(plain, drafted):
    b = answers(drafted, GREEDY, max_tokens=PLAIN["greedy"][2])
    assert [tuple(x[:2]) for x in b] == plain["greedy"]
    assert sum(t.draft_n_accepted for _, _, t in b) > 20  # drafts were checked and kept
    assert sum(t.draft_n - t.draft_n_accepted for _, _, t in b) > 0  # ... and some refused
    b = answers(drafted, GREEDY, grammar=PLAIN["grammar"][1], max_tokens=PLAIN["grammar"][2])
    assert [tuple(x[:2]) for x in b] == plain["grammar"]
    assert sum(t.draft_n for _, _, t in b) > 0


@pytest.mark.models
def test_seeded_answers_drafted_by_a_draft_model_keep_tokens_and_logprobs(plain, drafted):
    b = answers(drafted, SEEDED, max_tokens=PLAIN["seeded"][2])
    for (ta, la), (tb, lb, _) in zip(plain["seeded"], b):
        assert tb == ta
        assert lb == la  # bit for bit
    assert sum(t.draft_n_accepted for _, _, t in b) > 0
    assert sum(t.draft_n - t.draft_n_accepted for _, _, t in b) > 0  # sampled answers refuse some greedy drafts


@pytest.mark.models
def test_per_call_draft_max(drafted):
    c = drafted.complete("def add(a, b):\n", max_tokens=24, temperature=0, draft_max=0)
    assert c.timings.draft_n == 0
    with pytest.raises(ValueError, match="draft_max must be an integer from 0"):
        drafted.complete("x", max_tokens=2, draft_max=65)


# --- the engine: slots drafting and not, cancellation ----------------------------------------


@pytest.fixture(scope="module")
def engine(catalog_model):
    path = str(catalog_model("smollm2:135m"))
    # the draft's weights as in the file here (the pair above drafts with them requantized to q4_0)
    e = start_engine(path, n_ctx=4096, n_parallel=4, draft=DraftConfig(n_max=8, model=path, p_min=0.0, requant=None))
    yield e
    e.stop()


@pytest.mark.models
def test_draft_model_on_in_some_slots_and_off_in_others_keeps_every_answer(engine):
    alone = {}
    for i, text in enumerate(PROMPTS[:4]):
        req = GenerationRequest(prompt_ids(engine, text), SEEDED if i % 2 else GREEDY, 64, draft_max=0)
        alone[i] = collect(engine.submit(req))[:2]
    reqs = [GenerationRequest(prompt_ids(engine, t), SEEDED if i % 2 else GREEDY, 64, draft_max=0 if i < 2 else None)
            for i, t in enumerate(PROMPTS[:4])]
    jobs = [gevent.spawn(collect, engine.submit(r)) for r in reqs]
    gevent.joinall(jobs, raise_error=True, timeout=300)
    for i, j in enumerate(jobs):
        toks, lps, fin = j.value
        assert (toks, lps) == alone[i], i
        assert (fin.timings.draft_n == 0) == (i < 2), i
    greedy = jobs[2].value[2].timings  # a model drafting for itself, greedily: drafts kept
    assert greedy.draft_n_accepted > 0
    seeded = jobs[3].value[2].timings  # a seeded answer refuses some of the greedy drafts
    assert seeded.draft_n_accepted < seeded.draft_n


@pytest.mark.models
def test_cancelling_while_a_draft_model_drafts_frees_both_caches(engine):
    draft_kv = engine._sched.draft_model.kv
    cancel_after(engine, GenerationRequest(prompt_ids(engine, PROMPTS[3]), SEEDED, 400), 30)
    assert engine.kv.blocks_in_use() == 0 and draft_kv.blocks_in_use() == 0
    assert all(engine.kv.seq_len(s) == 0 and draft_kv.seq_len(s) == 0 for s in range(4))
    # and the next request runs as it would have
    toks, _, fin = collect(engine.submit(GenerationRequest(prompt_ids(engine, PROMPTS[4]), GREEDY, 32)))
    assert isinstance(fin, FinishEvent) and fin.timings.draft_n > 0 and toks
