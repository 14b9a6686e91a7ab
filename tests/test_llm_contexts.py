"""The library's contexts (bubo.Model.context, Context.fork/save, Model.load_context,
generate(..., context=, save=)) on smollm2:135m: a context continued answers what the whole prompt
answers, without reading the context again; forks share its rows; a saved context loads back and
answers the same; a damaged or foreign file is a ValueError that keeps nothing."""

import json
import struct

import pytest

import bubo

pytestmark = pytest.mark.models

TEXT = " ".join(f"Line {i}: the river ferryman works near the old mill and sells bread to travellers."
                for i in range(12))


@pytest.fixture(scope="module")
def m(catalog_model):
    with bubo.Model(catalog_model("smollm2:135m"), n_ctx=2048, draft=False) as model:
        yield model


def test_a_context_continued_forked_saved_and_loaded_answers_as_the_whole_prompt(m, tmp_path):
    ids = m.tokenize(TEXT)
    more = " The ferryman"
    whole = m.complete(ids + m.tokenize(more, add_special=False), max_tokens=8, temperature=0)
    ctx = m.context(TEXT)
    assert ctx.tokens == ids and len(ctx) == len(ids)
    got = m.complete(more, context=ctx, max_tokens=8, temperature=0)
    assert got.text == whole.text and got.cached_tokens == len(ids)  # the context's rows, not read again

    child = ctx.fork()
    assert child.tokens == ids and child.id != ctx.id
    moved = m.complete(more, context=child, save=True, max_tokens=8, temperature=0)
    assert moved.text == whole.text and len(child) > len(ids) and len(ctx) == len(ids)
    # the child goes on from its answer; the parent is as it was
    assert m.complete(more, context=ctx, max_tokens=8, temperature=0).text == whole.text

    path = tmp_path / "ctx.bin"
    assert ctx.save(path) == path.stat().st_size
    loaded = m.load_context(path)
    assert loaded.tokens == ids
    assert m.complete(more, context=loaded, max_tokens=8, temperature=0).text == whole.text
    for c in (ctx, child, loaded):
        c.close()


def test_a_damaged_or_foreign_file_is_a_value_error(m, tmp_path):
    ctx = m.context(TEXT)
    good = tmp_path / "good.bin"
    ctx.save(good)
    data = good.read_bytes()
    n_header = struct.unpack_from("<I", data, 12)[0]
    head = json.loads(data[16:16 + n_header])
    foreign = json.dumps({**head, "model_sha256": "f" * 64}).encode()
    cases = {"truncated": data[:-10], "flipped": data[:-5] + bytes([data[-5] ^ 1]) + data[-4:],
             "foreign": data[:12] + struct.pack("<I", len(foreign)) + foreign + data[16 + n_header:]}
    before = len(m._contexts().by_id)
    for name, raw in cases.items():
        bad = tmp_path / f"{name}.bin"
        bad.write_bytes(raw)
        with pytest.raises(ValueError):
            m.load_context(bad)
    assert len(m._contexts().by_id) == before  # nothing kept
    with pytest.raises(ValueError, match="save=True needs a context"):
        m.complete("x", save=True, max_tokens=1)
    ctx.close()
