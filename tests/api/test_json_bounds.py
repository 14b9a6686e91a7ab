"""JSON in and out within bounds: a request body is parsed with at most jsonin.MAX_VALUES values
(counted before the C parser runs, commas in text not counted against it), every check after the
parse walks in Python; a large answer is encoded in slices with the same bytes Flask writes."""

from __future__ import annotations

import json
import random

import pytest
from flask import Flask, jsonify

from bubo.api import jsonin, jsonout


def test_a_body_of_more_values_than_the_limit_is_refused_before_it_is_parsed(monkeypatch):
    monkeypatch.setattr(jsonin, "MAX_VALUES", 1000)
    ok = json.dumps({"prompt": list(range(900))})
    assert jsonin.parse(ok)["prompt"][-1] == 899
    for body in (json.dumps({"prompt": list(range(1000))}), json.dumps([{"a": 1}] * 600)):
        with pytest.raises(jsonin.JSONInputError, match="more than 1,000 values"):
            jsonin.parse(body)
    # commas and colons inside strings are text, not values (escaped quotes included)
    text = json.dumps({"prompt": 'a,b:"c", \\' * 5000, "x": [1, 2]})
    assert jsonin.parse(text)["x"] == [1, 2]


def test_numbers_depth_surrogates_and_scalars():
    with pytest.raises(jsonin.JSONInputError, match="200 digits"):
        jsonin.parse('{"a": [1, ' + "9" * 200 + "]}")
    with pytest.raises(jsonin.JSONInputError, match="more than 4300 digits"):
        jsonin.parse('{"a": ' + "9" * 5000 + "}")
    assert jsonin.parse('{"a": ' + "9" * 100 + "}")["a"] == int("9" * 100)
    with pytest.raises(jsonin.JSONInputError, match="202 characters"):
        jsonin.parse('{"a": 1.' + "5" * 200 + "}")
    with pytest.raises(jsonin.JSONInputError, match="NaN is not JSON"):
        jsonin.parse('{"t": NaN}')
    with pytest.raises(jsonin.JSONInputError, match="deeper than 128"):
        jsonin.parse("[" * 129 + "]" * 129)
    assert jsonin.parse("[" * 128 + "]" * 128)
    with pytest.raises(jsonin.JSONInputError, match=r"messages\[1\].content holds a lone UTF-16 surrogate"):
        jsonin.parse('{"messages": [{"content": "ok"}, {"content": "\\ud800"}]}')
    for scalar in ("null", "3", '"x"', "true", "1.5"):
        assert jsonin.parse(scalar) == json.loads(scalar)


def _values():
    rng = random.Random(7)
    return [
        {"tokens": list(range(100_000))},
        {"tokens": [{"id": i, "piece": "é" if i % 3 else [0xe2, 0x96]} for i in range(40_000)]},
        {"data": [{"object": "embedding", "index": i, "embedding": [rng.random() for _ in range(384)]}
                  for i in range(100)]},
        [[1.5, None, True, "x\u2028y"]] * 20_000,
        {"a": {"b": list(range(70_000)), "c": "🦉"}, "d": []},
        [], {}, "text", 5, None, [[]] * 1000,
    ]


def test_large_answers_are_the_bytes_flask_writes():
    app = Flask("t")
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.json.sort_keys = False  # type: ignore[attr-defined]
    with app.app_context():
        for v in _values():
            assert jsonout.response(v).get_data() == jsonify(v).get_data()
            # a caller that knows its answer is small: one call, the same bytes
            assert jsonout.response(v, small=True).get_data() == jsonify(v).get_data()


@pytest.mark.parametrize("small", [False, True])
def test_a_lone_surrogate_in_an_answer_is_escaped(small):
    out = jsonout.response({"text": "a\ud800b", "ok": "é"}, small=small).get_data()
    assert json.loads(out) == {"text": "a\ud800b", "ok": "é"} and b"\\ud800" in out


def test_a_listing_is_the_object_it_lists_made_a_slice_at_a_time():
    made = []

    def items(a, b):
        made.append((a, b))
        return [{"id": i} for i in range(a, b)]

    r = jsonout.listing({"model": "m"}, "tokens", 10_000, items)
    data = r.get_data()
    assert json.loads(data) == {"model": "m", "tokens": [{"id": i} for i in range(10_000)]}
    assert r.headers["Content-Length"] == str(len(data)) and data.endswith(b"}\n")
    assert max(b - a for a, b in made) <= 4096
    assert json.loads(jsonout.listing({}, "tokens", 0, items).get_data()) == {"tokens": []}


def test_arrays_write_each_float32_as_the_shortest_text_that_reads_back_as_it(monkeypatch):
    import numpy as np

    rng = np.random.default_rng(3)
    vecs = np.concatenate([rng.standard_normal((40, 384)), rng.standard_normal((2, 384)) * 1e-30,
                           rng.standard_normal((2, 384)) * 1e30]).astype(np.float32)
    calls = []
    real = jsonout.orjson.dumps
    monkeypatch.setattr(jsonout.orjson, "dumps", lambda v, **kw: calls.append(len(v)) or real(v, **kw))
    monkeypatch.setattr(jsonout, "SLICE_VALUES", 384 * 8)
    items = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)]
    r = jsonout.arrays({"object": "list", "model": "m\u00e9\ud800", "usage": {"n": 1}}, "data", items, 384)
    data = r.get_data()
    got = json.loads(data)
    assert data.endswith(b"}\n") and r.headers["Content-Length"] == str(len(data))
    assert got["object"] == "list" and got["model"] == "m\u00e9\ud800" and got["usage"] == {"n": 1}
    assert [d["index"] for d in got["data"]] == list(range(len(vecs)))
    back = np.array([d["embedding"] for d in got["data"]], dtype=np.float32)
    assert np.array_equal(back, vecs)  # every value reads back as the same float32
    # float32's shortest text, not float64's: about half as long; written a slice of 8 vectors at a time
    assert len(data) < 0.7 * len(json.dumps([v.tolist() for v in vecs], separators=(",", ":")))
    small = jsonout.arrays({}, "v", np.array([0.1, -2.5e-8], np.float32), 1).get_data()
    assert json.loads(small) == {"v": [0.1, -2.5e-8]}
    assert calls and max(calls) <= 8
    # the bare list (llama-server's shape), a 2-D item, one vector as the list, no items
    bare = jsonout.arrays(None, "", [{"index": 0, "embedding": vecs[:1]}], 384).get_data()
    assert np.array_equal(np.array(json.loads(bare)[0]["embedding"], np.float32), vecs[:1])
    one = json.loads(jsonout.arrays({}, "embedding", vecs[0], 1).get_data())
    assert np.array_equal(np.array(one["embedding"], np.float32), vecs[0])
    assert json.loads(jsonout.arrays({"m": 1}, "embeddings", vecs[:0], 384).get_data()) == {"m": 1, "embeddings": []}


def test_a_surrogate_escape_is_found_across_the_chunks_searched(monkeypatch):
    monkeypatch.setattr(jsonin, "_SCAN_CHUNK", 8)
    for i in range(24):  # the escape at every place across two chunks' edge
        with pytest.raises(jsonin.JSONInputError, match="lone UTF-16 surrogate"):
            jsonin.parse(json.dumps(["a" * i]).replace('"]', '\\ud800"]'))
        assert jsonin.parse(json.dumps(["a" * i + "\u0800\ud7ff"], ensure_ascii=True)) == ["a" * i + "\u0800\ud7ff"]
