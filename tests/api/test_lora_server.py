"""LoRA adapters on the server, as llama-server has them: --lora, --lora-scaled,
--lora-init-without-apply; GET/POST /lora-adapters (global scales); a request's `lora` field for
itself alone. Requests with different adapters share batches and each gets the answer it gets
alone; the prefix cache never gives one adapter set's blocks to another; a bad field is a 400 and
an adapter that does not fit the model stops the server at start, naming the tensor."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from client import call

from .conftest import MODEL, start_server

pytestmark = pytest.mark.models

STORY = ("Once upon a time, in a land far away, there lived a dragon who guarded a golden egg in a cave above the "
         "sea, and every winter the villagers below climbed the cliffs to bring it bread, salt and stories.")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, catalog_model):
    from reference.lora import random_pairs, write_adapter

    folder = tmp_path_factory.mktemp("lora")
    mp = catalog_model(MODEL)
    strong = write_adapter(folder / "strong.gguf", mp, random_pairs(mp, 16, seed=1, std=0.05), alpha=32.0,
                           dtype="F16")
    subset = write_adapter(folder / "subset.gguf", mp, random_pairs(mp, 8, mats=("attn_v", "ffn_up"), seed=2,
                                                                     std=0.08), alpha=8.0)
    return str(strong), str(subset)


@pytest.fixture(scope="module")
def srv(adapters, tmp_path_factory):
    strong, subset = adapters
    slots = tmp_path_factory.mktemp("slots")
    with start_server("-np", "4", "--lora", strong, "--lora-scaled", subset, "0.5", "--slot-save-path",
                      str(slots)) as s:
        yield s.wait_ready()


def _complete(server, prompt=STORY, **extra):
    status, _, data = call(server.url + "/completion", "POST",
                           {"prompt": prompt, "n_predict": 16, "temperature": 0, "return_tokens": True, **extra})
    out = json.loads(data)
    assert status == 200, out
    return out


def test_the_adapters_their_scales_and_a_requests_own(srv, adapters):
    status, _, data = call(srv.url + "/lora-adapters")
    assert status == 200 and json.loads(data) == [{"id": 0, "path": adapters[0], "scale": 1.0},
                                                  {"id": 1, "path": adapters[1], "scale": 0.5}]
    base = _complete(srv, lora=[])["tokens"]
    strong = _complete(srv, lora=[{"id": 0, "scale": 1.0}])["tokens"]
    both = _complete(srv, lora=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])["tokens"]
    assert base != strong
    assert _complete(srv)["tokens"] == both  # no field: the global scales
    # the global scales change: an adapter left out is 0
    status, _, data = call(srv.url + "/lora-adapters", "POST", [{"id": 0, "scale": 1.0}])
    assert status == 200 and json.loads(data) == {"success": True}
    assert [a["scale"] for a in json.loads(call(srv.url + "/lora-adapters")[2])] == [1.0, 0.0]
    assert _complete(srv)["tokens"] == strong
    assert call(srv.url + "/lora-adapters", "POST", [])[0] == 200
    assert _complete(srv)["tokens"] == base
    # every generating route takes the field
    status, _, data = call(srv.url + "/v1/chat/completions", "POST", {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0,
        "lora": [{"id": 0, "scale": 1.0}]})
    assert status == 200, data
    assert "lora" not in call(srv.url + "/v1/chat/completions", "POST", {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
        "lora": [{"id": 0}]})[1].get("X-Bubo-Ignored-Fields", "")


def test_adapters_are_models_too(srv, adapters):
    strong = f"{MODEL}+strong"
    listed = {m["id"]: m for m in json.loads(call(srv.url + "/v1/models")[2])["data"]}
    assert listed[strong]["parent"] == MODEL and listed[strong]["adapter"] == {"name": "strong", "path": adapters[0]}
    assert f"{MODEL}+subset" in listed
    tags = [m["name"] for m in json.loads(call(srv.url + "/api/tags")[2])["models"]]
    assert strong in tags
    status, _, data = call(srv.url + "/api/show", "POST", {"model": strong})
    shown = json.loads(data)
    assert status == 200 and f"ADAPTER {adapters[0]}" in shown["modelfile"] and shown["adapters"][0]["name"] == "strong"
    # the name is the base with that adapter at scale 1, whatever the global scales
    assert call(srv.url + "/lora-adapters", "POST", [])[0] == 200
    named = _complete(srv, model=strong)["tokens"]
    assert named == _complete(srv, lora=[{"id": 0, "scale": 1.0}])["tokens"] != _complete(srv)["tokens"]
    texts = []
    for name in (strong, strong.upper(), MODEL):  # any letter case, as every model name
        status, _, data = call(srv.url + "/v1/completions", "POST", {"model": name, "prompt": STORY,
                                                                     "max_tokens": 16, "temperature": 0})
        assert status == 200, data
        texts.append(json.loads(data)["choices"][0]["text"])
    assert texts[0] == texts[1] != texts[2]
    status, _, data = call(srv.url + "/v1/completions", "POST", {"model": f"{MODEL}+nope", "prompt": "x"})
    assert status == 404 and strong in json.loads(data)["error"]["message"]


def _last_slot(server) -> int:
    return max(json.loads(call(server.url + "/slots")[2]), key=lambda s: s["id_task"])["id"]


def test_an_adapted_conversation_is_not_saved_to_a_slot_file(srv):
    _complete(srv, lora=[{"id": 0, "scale": 1.0}])
    status, _, data = call(srv.url + f"/slots/{_last_slot(srv)}?action=save", "POST", {"filename": "a.bin"})
    assert status == 400 and "LoRA adapters" in json.loads(data)["error"]["message"]
    _complete(srv, lora=[])
    assert call(srv.url + f"/slots/{_last_slot(srv)}?action=save", "POST", {"filename": "b.bin"})[0] == 200


def test_a_batch_of_different_adapters_answers_as_each_alone(srv):
    sets = [[], [{"id": 0, "scale": 1.0}], [{"id": 0, "scale": 0.3}, {"id": 1, "scale": 2.0}], [{"id": 1, "scale": 1}]]
    alone = [_complete(srv, prompt=STORY[:80 + 7 * i], lora=s)["tokens"] for i, s in enumerate(sets)]
    got: dict[int, list[int]] = {}

    def run(i: int) -> None:
        got[i] = _complete(srv, prompt=STORY[:80 + 7 * i], lora=sets[i], cache_prompt=False)["tokens"]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [got[i] for i in range(len(sets))] == alone


def test_the_prefix_cache_keeps_adapter_sets_apart(srv):
    prompt = "A second tale. " + STORY * 2  # no request before has its first block
    first = _complete(srv, prompt=prompt, lora=[{"id": 0, "scale": 1.0}])
    assert first["timings"]["cache_n"] == 0
    other = _complete(srv, prompt=prompt, lora=[{"id": 0, "scale": 0.5}])
    assert other["timings"]["cache_n"] == 0  # the same tokens, other rows
    again = _complete(srv, prompt=prompt, lora=[{"id": 0, "scale": 1.0}])
    assert again["timings"]["cache_n"] >= 64 and again["tokens"] == first["tokens"]
    assert _complete(srv, prompt=prompt, lora=[])["timings"]["cache_n"] == 0


@pytest.mark.parametrize("field, says", [
    ({"id": 0}, "must be an array"),
    ([{"id": 2, "scale": 1}], "lora[0].id 2: this model has adapters 0..1"),
    ([{"id": "0"}], "lora[0].id '0'"),
    ([{"id": 0, "scale": "x"}], "lora[0].scale must be a finite number"),
    ([{"id": 0, "scale": 1e9}], "at most 1e6"),
    ([{"id": 0, "weight": 1}], 'lora[0] must be {"id": N, "scale": X}'),
])
def test_a_bad_lora_field_is_a_400(srv, field, says):
    status, _, data = call(srv.url + "/completion", "POST", {"prompt": "Hi", "n_predict": 1, "lora": field})
    out = json.loads(data)
    assert status == 400 and says in out["error"]["message"], out
    status, _, data = call(srv.url + "/lora-adapters", "POST", field)
    assert status == 400 and says.replace("lora", "the body") in json.loads(data)["error"]["message"], data


def test_init_without_apply_and_an_adapter_that_does_not_fit(tmp_path, adapters):
    with start_server("--lora", adapters[0], "--lora-init-without-apply") as s:
        s.wait_ready()
        assert [a["scale"] for a in json.loads(call(s.url + "/lora-adapters")[2])] == [0.0]
    from reference.lora import random_pairs, write_adapter
    from reference.tiny import write_tiny_model

    other = write_tiny_model(tmp_path / "tiny.gguf", "llama", types="F32")  # a llama of another width
    bad = write_adapter(tmp_path / "tiny-lora.gguf", other, random_pairs(other, 4, mats=("attn_q",), layers=[0]),
                        base_name=None)
    out = subprocess.run([sys.executable, "-m", "bubo", "serve", "-m", MODEL, "--port", "0", "--lora", bad],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "blk.0.attn_q.weight.lora_a is [4, 64]; the model's blk.0.attn_q.weight takes 576 inputs" in out.stderr, \
        out.stderr[-2000:]


def test_adapters_in_the_store_and_in_a_preset(tmp_path, catalog_model, adapters):
    """The store's adapters are served as base+name beside their base (at scale 0 on the base's
    own requests); a preset gives each model of a router its own; --lora with several models is
    refused at start."""
    import os
    import shutil

    from reference.lora import random_pairs, write_adapter

    mp = catalog_model(MODEL)
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    for model in (mp, catalog_model("qwen2.5-coder:0.5b")):  # two stored models: served from the store
        os.link(model, home / "models" / model.name)
        (home / "models" / f"{model.name}.verified").write_text("")
    write_adapter(home / "models" / "tone.gguf", mp, random_pairs(mp, 8, seed=9, std=0.05), alpha=16.0)
    env = {"BUBO_HOME": str(home)}
    listed = subprocess.run([sys.executable, "-m", "bubo", "list"], capture_output=True, text=True, env={
        **os.environ, **env}, timeout=60).stdout
    assert "tone" in listed and "LoRA of" in listed, listed
    with start_server(env=env, model=None) as s:
        s.wait_ready()
        ids = [m["id"] for m in json.loads(call(s.url + "/v1/models")[2])["data"]]
        assert f"{MODEL}+tone" in ids and not any(i.startswith("qwen") and "+" in i for i in ids), ids
        status, _, data = call(s.url + f"/lora-adapters?model={MODEL}")
        assert status == 200 and json.loads(data)[0]["scale"] == 0.0, data
    shutil.rmtree(home)

    preset = tmp_path / "preset.ini"
    preset.write_text(f"[small]\nmodel = {mp}\nlora = {adapters[0]}:0.5, {adapters[1]}\n"
                      f"[other]\nmodel = {mp}\n")
    with start_server("--models-preset", str(preset), model=None) as s:
        s.wait_ready()
        ids = [m["id"] for m in json.loads(call(s.url + "/v1/models")[2])["data"]]
        assert {"small+strong", "small+subset"} <= set(ids) and not any(i.startswith("other+") for i in ids)
        status, _, data = call(s.url + "/lora-adapters?model=small")
        assert [a["scale"] for a in json.loads(data)] == [0.5, 1.0]
    out = subprocess.run([sys.executable, "-m", "bubo", "serve", "-m", str(mp), "-m", str(mp) + "x", "--port", "0",
                          "--lora", adapters[0]], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--models-preset section (lora = FILE" in out.stderr, out.stderr[-1000:]
