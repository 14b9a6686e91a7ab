"""Which models `bubo serve` serves and with which settings (bubo/api/models_config.py), from the
parsed command line, without starting anything."""

from __future__ import annotations

import pytest

from bubo.api.models_config import ModelsConfigError, model_specs, read_preset
from bubo.cli.flags import build_parser
from bubo.cli.serve import options
from bubo.engine.registry import EngineSettings


def specs(*argv: str):
    return model_specs(options(build_parser().parse_args(["serve", *argv])))


def test_one_model_keeps_its_served_name_and_aliases():
    (s,) = specs("-m", "/x/My-Model.Q4.gguf", "-a", "one,two", "-c", "512")
    assert (s.name, s.source, s.aliases, s.load_on_startup) == ("My-Model.Q4", "/x/My-Model.Q4.gguf",
                                                                ("one", "two"), True)
    assert s.settings == EngineSettings(n_ctx=512)
    (s,) = specs("-m", "/x/m.gguf", "--served-model-name", "mine")
    assert s.name == "mine"


def test_several_models_and_a_models_dir(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    (d / "b.gguf").write_bytes(b"x")
    (d / "a.gguf").write_bytes(b"x")
    (d / "sub").mkdir()
    (d / "sub" / "only.gguf").write_bytes(b"x")
    (d / "two").mkdir()
    (d / "two" / "1.gguf").write_bytes(b"x")
    (d / "two" / "2.gguf").write_bytes(b"x")  # which one? neither: skipped
    got = specs("-m", "gemma3:270m", "--models-dir", str(d), "-np", "2")
    assert [(s.name, s.load_on_startup) for s in got] == [("gemma3:270m", True), ("a", False), ("b", False),
                                                          ("sub", False)]
    assert got[3].source == str(d / "sub" / "only.gguf")
    assert all(s.settings.n_parallel == 2 for s in got)
    # the same file twice under one name is one model (a link to it too)
    assert len(specs("-m", "/m/x.gguf", "-m", "/m/x.gguf")) == 1
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "a.gguf").symlink_to(d / "a.gguf")
    assert len(specs("-m", str(d / "a.gguf"), "-m", str(tmp_path / "link" / "a.gguf"))) == 1


def test_preset_precedence_command_line_then_section_then_defaults(tmp_path):
    p = tmp_path / "p.ini"
    p.write_text("; comments too\n[*]\nc = 512\nnp = 3\nub = 128\nload-on-startup = false\n\n"
                 "[owl]\nmodel = /m/owl.gguf\nc = 768\nalias = hoot\nload-on-startup = true\n\n"
                 "[gemma3:270m]\nt = 1\n")
    got = specs("-m", "gemma3:270m", "--models-preset", str(p), "-np", "2")
    by = {s.name: s for s in got}
    assert by["owl"].settings == EngineSettings(n_ctx=768, n_parallel=2, n_ubatch=128)
    assert by["gemma3:270m"].settings == EngineSettings(n_ctx=512, n_threads=1, n_parallel=2, n_ubatch=128)
    assert by["owl"].aliases == ("hoot",) and by["owl"].load_on_startup
    assert not by["gemma3:270m"].load_on_startup  # [*] says so, even for the default model


@pytest.mark.parametrize("text,message", [
    ("[x]\nmodel = /m.gguf\nbogus = 1\n", "[x] bogus: unknown key"),
    ("[x]\nmodel = /m.gguf\nc = -5\n", "[x] c = '-5': give at least 1"),
    ("[x]\nmodel = /m.gguf\nload-on-startup = maybe\n", "[x] load-on-startup = 'maybe': expected true or false"),
    ("[*]\nmodel = /m.gguf\n", "[*] model: [*] holds settings for every model"),
    ("c = 5\n", "File contains no section headers"),
    ("[x]\nc = 1\nc = 2\n", "option 'c' in section 'x' already exists"),
    ("[x]\nmodel =\n", "[x] model is empty"),
])
def test_bad_presets_name_file_section_and_key(tmp_path, text, message):
    p = tmp_path / "bad.ini"
    p.write_text(text)
    with pytest.raises(ModelsConfigError) as e:
        read_preset(str(p))
    assert str(p) in str(e.value) and message in str(e.value)


def test_other_bad_sources(tmp_path):
    with pytest.raises(ModelsConfigError, match="no such file|No such file"):
        specs("--models-preset", str(tmp_path / "missing.ini"))
    with pytest.raises(ModelsConfigError, match="not a folder"):
        specs("--models-dir", str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelsConfigError, match="no .gguf files"):
        specs("--models-dir", str(tmp_path / "empty"))
    with pytest.raises(ModelsConfigError, match="-a/--alias names one model"):
        specs("-m", "/a.gguf", "-m", "/b.gguf", "-a", "x")


def test_no_model_serves_the_store(monkeypatch, tmp_path):
    from bubo import store

    def stored(*names):
        return lambda: [store.StoredModel(n, tmp_path / (n if n.endswith(".gguf") else "x.gguf"), 1) for n in names]

    default = store.DEFAULT_MODEL
    monkeypatch.setattr(store, "stored_models", stored("gemma3:270m"))
    assert [(s.name, s.source) for s in specs()] == [(default, default)]  # as always: the default
    monkeypatch.setattr(store, "stored_models", stored("gemma3:270m", "mine.gguf", default))
    got = specs()
    assert [(s.name, s.source, s.load_on_startup) for s in got] == [
        (default, default, True), ("gemma3:270m", "gemma3:270m", False),
        ("mine", str(tmp_path / "mine.gguf"), False)]
