"""The library's LoRA adapters: bubo.Model(path, lora=[...]), Model.lora and set_lora, and each
call's own lora= (generate, complete, chat, chat_stream): an adapter's answer is not the base's,
no adapter (or scale 0) is the base's, bit for bit."""
from __future__ import annotations

import pytest

import bubo
from bubo.lora import AdapterError

from reference.lora import random_pairs, write_adapter
from reference.tiny import write_tiny_model

pytestmark = pytest.mark.models

NAME = "smollm2:135m"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def files(tmp_path_factory, catalog_model):
    folder = tmp_path_factory.mktemp("lora")
    mp = catalog_model(NAME)
    strong = write_adapter(folder / "strong.gguf", mp, random_pairs(mp, 16, seed=1, std=0.05), alpha=32.0)
    light = write_adapter(folder / "light.gguf", mp, random_pairs(mp, 4, mats=("attn_v",), seed=2), alpha=4.0)
    return strong, light


def _greedy(m, **kw):
    out = m.complete(PROMPT, max_tokens=12, temperature=0, **kw)
    return out.tokens, out.logprobs


def test_adapters_per_model_and_per_call(files):
    strong, light = files
    with bubo.Model(NAME, n_ctx=512) as plain:
        base = _greedy(plain)
        base_chat = plain.chat([{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0).content
    with bubo.Model(NAME, n_ctx=512, lora=[strong, (light, 0.5)]) as m:
        assert [(a["id"], a["name"], a["scale"]) for a in m.lora] == [(0, "strong", 1.0), (1, "light", 0.5)]
        adapted = _greedy(m)
        assert adapted != base
        assert _greedy(m, lora={}) == base and _greedy(m, lora={"strong": 0, 1: 0}) == base
        assert _greedy(m, lora={"strong": 1.0, "light": 0.5}) == adapted
        assert m.chat([{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0, lora={}).content == base_chat
        m.set_lora({"strong": 1.0})
        assert [a["scale"] for a in m.lora] == [1.0, 0.0]
        only_strong = _greedy(m)
        assert _greedy(m, lora={0: 1.0}) == only_strong
        m.set_lora({})
        assert _greedy(m) == base
        with pytest.raises(AdapterError, match="no adapter named 'nope'"):
            m.complete(PROMPT, max_tokens=1, lora={"nope": 1.0})
        with pytest.raises(AdapterError, match=r"lora\[0\].id 5: this model has adapters 0..1"):
            m.complete(PROMPT, max_tokens=1, lora={5: 1.0})


def test_an_adapter_of_another_model_is_refused_at_load(tmp_path):
    other = write_tiny_model(tmp_path / "tiny.gguf", "qwen2", types="F32")
    bad = write_adapter(tmp_path / "qwen.gguf", other, random_pairs(other, 4, mats=("attn_q",), layers=[0]))
    with pytest.raises(AdapterError, match="an adapter of a qwen2 model; this model is llama"):
        bubo.Model(NAME, n_ctx=256, lora=[bad])


def test_contexts_keep_their_adapters_rows_apart(files):
    """A context is read with the adapters in force, and continued from only by a call with the
    same ones: its rows never serve a call of another adapter set (a second reader's find)."""
    strong, _ = files
    story = "Once upon a time, in a land far away, there lived a dragon who guarded a golden egg. " * 3
    more = " The dragon said"
    with bubo.Model(NAME, n_ctx=1024) as plain:
        base = _greedy_on(plain, story + more)
    with bubo.Model(NAME, n_ctx=1024, lora=[strong]) as m:
        adapted = _greedy_on(m, story + more)
        ctx = m.context(story, add_special=True)
        m.complete("Something else entirely.", max_tokens=2, temperature=0)
        assert _greedy_on(m, more, context=ctx) == adapted  # read with the adapter, continued with it
        assert _greedy_on(m, story + more, lora={}) == base  # its rows are no base call's
        assert _greedy_on(m, more, context=ctx, lora={}) == base  # another set: the prompt is read again


def _greedy_on(m, prompt, **kw):
    c = m.complete(prompt, max_tokens=8, temperature=0, add_special=kw.pop("add_special", "context" not in kw), **kw)
    return c.tokens


def test_a_scale_out_of_range_is_refused_at_load(files):
    with pytest.raises(AdapterError, match="not a finite number of at most 1e6"):
        bubo.Model(NAME, n_ctx=256, lora=[(files[0], 2e6)])
