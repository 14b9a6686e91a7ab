"""What a request may do to the models everyone shares: an Ollama keep_alive that shortens how
long a model stays loaded (0: unload it now) counts only from a caller allowed to manage models
(with an API key, or on this machine when the server has no keys); a copy in the store is a hard
link, refused where none can be made unless the server allows copies (--allow-copy), and a name
with a newline after it is no name."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from client import call

from bubo import store
from bubo.api.app import create_app
from bubo.api.config import ServerConfig
from bubo.engine.registry import ModelStatus

from .conftest import Server
from engines import start_engine

pytestmark = pytest.mark.models

NAME = "smollm2:135m"


@pytest.fixture(scope="module")
def engine(catalog_model):
    e = start_engine(catalog_model(NAME), n_ctx=512)
    yield e
    e.stop()


def _client(engine, remote: str, **cfg):
    app = create_app(engine, ServerConfig(served_model_name=NAME, **cfg))
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = remote
    return app, client


def test_a_keep_alive_of_zero_from_another_machine_unloads_nothing(engine, caplog):
    caplog.set_level(logging.INFO, logger="bubo.api")
    app, far = _client(engine, "192.0.2.9")
    reg = app.config["BUBO_MODELS"]
    r = far.post("/api/generate", json={"model": NAME, "keep_alive": 0})
    assert r.status_code == 200 and r.json["done_reason"] == "load"  # taken as a request without keep_alive
    assert reg.lookup(NAME).status is ModelStatus.LOADED
    assert "keep_alive 0 s from 192.0.2.9" in caplog.text and "ignored" in caplog.text
    # a short keep_alive on a chat from afar is ignored too; a longer one is anyone's to give
    r = far.post("/api/chat", json={"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "stream": False,
                                    "keep_alive": "1s", "options": {"num_predict": 1}})
    assert r.status_code == 200 and reg.lookup(NAME).keep_alive_s is None
    r = far.post("/api/generate", json={"model": NAME, "keep_alive": -1})
    assert r.status_code == 200 and reg.lookup(NAME).keep_alive_s == float("inf")


def test_a_caller_allowed_to_manage_models_may_shorten_it(engine):
    for remote, cfg, headers in (("127.0.0.1", {}, {}),
                                 ("192.0.2.9", {"api_keys": ["k"]}, {"Authorization": "Bearer k"})):
        app, c = _client(engine, remote, **cfg)
        reg = app.config["BUBO_MODELS"]
        r = c.post("/api/generate", json={"model": NAME, "keep_alive": "30s"}, headers=headers)
        assert r.status_code == 200 and reg.lookup(NAME).keep_alive_s == 30.0, (remote, r.json)


def test_a_name_with_a_newline_after_it_is_no_name(engine):
    _, c = _client(engine, "127.0.0.1")
    r = c.post("/api/copy", json={"source": NAME, "destination": "mine\n"})
    assert r.status_code == 400 and "is not a model name" in r.json["error"]


def test_a_copy_is_a_hard_link_or_refused_unless_allowed(catalog_model, tmp_path):
    """The store on a tmpfs, the served model's file on the disk: no hard link can be made."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(catalog_model(NAME)).st_dev:
        pytest.skip("no second filesystem (a tmpfs at /dev/shm) to copy across")
    home = Path(os.environ.get("TMPDIR_SHM", shm)) / f"bubo-copy-test-{os.getpid()}"
    (home / "models").mkdir(parents=True)
    real = store.pull(NAME)
    try:
        for flags, want in (((), 400), (("--allow-copy",), 200)):
            with Server(*flags, "-m", str(real), model=None, ctx=512, env={"BUBO_HOME": str(home)}) as s:
                s.wait_ready()
                status, _, body = call(s.url + "/api/copy", "POST", {"source": "bubo", "destination": "mine:v1"})
                copied = home / "models" / "mine:v1.gguf"
                assert status == want, body
                if want == 400:
                    assert b"--allow-copy" in body and not copied.exists()
                    assert not any(p.name.startswith(".") for p in (home / "models").iterdir())  # no partial file
                else:
                    assert copied.is_file() and not copied.is_symlink()
                    assert copied.stat().st_size == real.stat().st_size
                    assert os.stat(copied).st_ino != os.stat(real).st_ino
                    copied.unlink()
        # on one filesystem it is a hard link: no bytes written
        disk_home = tmp_path / "home"
        (disk_home / "models").mkdir(parents=True)
        (disk_home / "models" / real.name).symlink_to(real)
        with Server("-m", str(real), model=None, ctx=512, env={"BUBO_HOME": str(disk_home)}) as s:
            s.wait_ready()
            assert call(s.url + "/api/copy", "POST", {"source": "bubo", "destination": "mine:v1"})[0] == 200
            assert os.stat(disk_home / "models" / "mine:v1.gguf").st_ino == os.stat(real).st_ino
    finally:
        import shutil

        shutil.rmtree(home, ignore_errors=True)
