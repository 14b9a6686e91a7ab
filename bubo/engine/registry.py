"""Several models behind one server: names to engines, loaded, unloaded, swapped and put to sleep.

    reg = Registry([ModelSpec("smollm2", "/m/smollm2.gguf"), ModelSpec("gemma3", "/m/gemma3.gguf")],
                   models_max=1)
    reg.start()                       # loads the models marked load_on_startup
    engine = reg.acquire("gemma3")    # in a greenlet: waits while gemma3 loads (and smollm2 leaves)
    stream = engine.submit(...)

One model is the registry's simplest case: one entry, loaded at start, never swapped.

Every name is a model id or one of its aliases. acquire() gives the loaded engine, loading it
first when it is not (autoload; a sleeping model always reloads), and counts the caller as a
user of it until release(); an engine with users, queued or running requests, or streams still
being read is busy. A load that would pass models_max (or the memory available) first unloads the
least recently used idle model; while every loaded model is busy it waits, so a request that
needs a swap is answered once one is free, never dropped. unload() waits for the model's work in
flight to end; requests that arrive meanwhile wait for the unload, then load it again (autoload)
or are refused. With sleep_idle_s, a model idle that long is unloaded (its memory goes back to
the OS) and shows as sleeping until its next request reloads it.

Everything here runs in the gevent hub's thread (the HTTP greenlets and the registry's own
watcher greenlets); models load on their engines' threads, which the greenlets poll.
"""

from __future__ import annotations

import dataclasses
import enum
import gc
import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import gevent
import gevent.lock

from bubo.engine.draft import DEFAULT_DRAFT, DraftConfig
from bubo.engine.engine import Engine, ModelInfo
from bubo.engine.memory import memory_budget
from bubo.engine.types import EngineRefusal, InsufficientMemoryError, NotReadyError, Reason

log = logging.getLogger("bubo.registry")

POLL_S = 0.02  # how often a waiting greenlet looks at a load, an unload or a busy model again
DEFAULT_MODELS_MAX = 4  # llama-server's default; 0: no limit
DEFAULT_NAME = "bubo"  # always names the default model (the first one)


class ModelStatus(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"  # waiting for its requests in flight to end
    SLEEPING = "sleeping"  # unloaded after sleep_idle_s without requests; the next one reloads it
    FAILED = "failed"  # the last load failed (error says why); /models/load tries again


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """What an Engine is made with (the server's -c, -t, -np, -b, -ub, --queue-size, ...)."""

    n_ctx: int | None = None
    n_threads: int | None = None
    n_threads_batch: int | None = None  # -tb: a prompt's steps (None: n_threads)
    n_parallel: int | None = None
    n_batch: int = 2048
    n_ubatch: int = 512
    queue_size: int | None = None
    chat_template: str | None = None
    load_delay_s: float = 0.0
    load_mem_available: int | None = None  # a debug hook: the memory free at load, as the guard sees it
    draft: DraftConfig | None = DEFAULT_DRAFT  # speculative decoding (None: off)
    cache_type_k: str = "f16"  # the KV cache's K and V storage types (-ctk, -ctv)
    cache_type_v: str = "f16"
    embedding: bool = False  # --embedding: the model must be an embedding model (an encoder)
    pooling: str | None = None  # --pooling: mean, cls or last (None: the model file's)
    lora: tuple[tuple[str, float], ...] = ()  # --lora, --lora-scaled: adapter files and their initial scales


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model the server can serve: its id, other names, where it comes from (a GGUF path or
    a catalog name) and how its engine is made."""

    name: str
    source: str
    aliases: tuple[str, ...] = ()
    settings: EngineSettings = EngineSettings()
    load_on_startup: bool = False
    origin: str = "command line"  # where the spec was given (for error messages)


class UnknownModelError(EngineRefusal, LookupError):
    reason = Reason.MODEL_UNKNOWN

    def __init__(self, name: str, available: list[str], close: list[str] | None = None):
        self.name = name
        self.available = available
        self.close = close or []  # served names close to `name` (a typo's likely meaning)
        listed = ", ".join(f"'{n}'" for n in available)
        super().__init__(f"model '{name}' is not served here{did_you_mean(self.close)}; the models are {listed}")


def did_you_mean(close: list[str]) -> str:
    """" (did you mean 'a' or 'b'?)" for the names close to a mistyped one; "" for none."""
    if not close:
        return ""
    return f" (did you mean '{close[0]}'" + "".join(f" or '{n}'" for n in close[1:]) + "?)"


def implied_names(spec: ModelSpec) -> list[str]:
    """The other names a model answers to beyond its id and aliases, as people and clients spell
    them: a name's Ollama `:latest` (and a `:latest` name without it), a tagged name's short name
    (qwen2.5-coder:0.5b -> qwen2.5-coder), a catalog model's full name, short name and store file
    name without .gguf, and a file's name without .gguf."""
    from bubo import store

    out: list[str] = []
    for n in (spec.name, *spec.aliases, spec.source):
        if os.sep in n or n.endswith(".gguf"):
            out.append(os.path.basename(n).removesuffix(".gguf"))
            continue
        base, colon, tag = n.rpartition(":") if ":" in n else (n, "", "")
        if colon and tag != "latest":
            out += [base, f"{base}:latest", f"{n}:latest"]  # Ollama's clients may add it to any name
        elif colon:
            out.append(base)
        else:
            out.append(f"{n}:latest")
        try:
            canonical = store.catalog_name(n)
        except store.UnknownModelError:
            canonical = None
        if canonical is not None:
            entry = store.CATALOG[canonical]
            out += [canonical, entry.family, f"{entry.family}:latest", entry.filename.removesuffix(".gguf")]
    return list(dict.fromkeys(out))


class ModelNotLoadedError(EngineRefusal, RuntimeError):
    """The model is not loaded and the registry loads models only when asked (autoload off)."""

    reason = Reason.MODEL_NOT_LOADED

    def __init__(self, name: str):
        super().__init__(f"the model {name} is not loaded and this server loads models only when asked")
        self.name = name


class TooManyAtStartError(ValueError):
    """More models load at start than may be loaded at once."""

    def __init__(self, names: list[str], models_max: int):
        super().__init__(f"{len(names)} models load at start ({', '.join(names)}) but at most {models_max} may be "
                         "loaded at once")
        self.names = names
        self.models_max = models_max


class ModelEntry:
    """One model's state in the registry."""

    def __init__(self, spec: ModelSpec, engine: Engine | None = None):
        self.spec = spec
        self.engine = engine
        self._status = ModelStatus.UNLOADED
        self.error: str | None = None  # why the last load failed
        self.users = 0  # acquired and not yet released
        self.last_used = 0.0  # time.monotonic() of the last acquire (LRU)
        self.last_busy = time.monotonic()  # when it was last seen busy (idle sleep)
        self.n_loads = 0
        self.startup = False  # loading at start: requests get not_ready meanwhile, as with one model
        self.pending = False  # a load waits for room (a swap): shows as loading
        self.waiting = 0  # requests waiting for it to load: it serves them before it can be swapped out
        self.info: ModelInfo | None = None  # what it was when last loaded (kept while it sleeps)
        # a request's keep_alive (Ollama's): idle seconds before it sleeps, over the registry's
        # sleep_idle_s; math.inf: never; None: the registry's
        self.keep_alive_s: float | None = None

    def idle_limit(self, idle_s: float | None) -> float | None:
        """Idle seconds before it sleeps: its keep_alive, else the registry's idle_s (None: never)."""
        return self.keep_alive_s if self.keep_alive_s is not None else idle_s

    def expires_at(self, idle_s: float | None) -> float | None:
        """When (time.time()) this model will sleep if no request comes (a busy one: its limit
        from now), or None if never."""
        limit = self.idle_limit(idle_s)
        if limit is None or math.isinf(limit):
            return None
        idle = 0.0 if self.busy else time.monotonic() - self.last_busy
        return time.time() + max(limit - idle, 0.0)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def status(self) -> ModelStatus:
        eng = self.engine
        if self.pending and eng is None:
            return ModelStatus.LOADING
        if self._status in (ModelStatus.UNLOADING, ModelStatus.SLEEPING) or eng is None:
            return self._status
        if eng.ready:
            return ModelStatus.LOADED
        if eng.load_error is not None:
            return ModelStatus.FAILED
        if eng.stopped:
            return ModelStatus.UNLOADED
        return ModelStatus.LOADING

    @property
    def failure(self) -> str:
        """Why the model cannot be served (its last load failed, or its file is broken)."""
        eng = self.engine
        return (eng.load_error if eng is not None and eng.load_error else None) or self.error or "unknown error"

    @property
    def busy(self) -> bool:
        eng = self.engine
        return self.users > 0 or (eng is not None and not eng.idle)


def adapter_files(spec: ModelSpec) -> dict[str, str]:
    """A model's LoRA adapters by name (the file's name without .gguf: base+name models): their files."""
    return {Path(path).name.removesuffix(".gguf"): path for path, _ in spec.settings.lora}


def _never_loaded(spec: ModelSpec) -> Engine:
    s = spec.settings
    return Engine(spec.source, n_ctx=s.n_ctx, n_threads=s.n_threads, n_threads_batch=s.n_threads_batch,
                  chat_template=s.chat_template,
                  load_delay_s=s.load_delay_s, load_mem_available=s.load_mem_available,
                  n_parallel=s.n_parallel, n_batch=s.n_batch, n_ubatch=s.n_ubatch,
                  queue_size=s.queue_size, draft=s.draft, cache_type_k=s.cache_type_k, cache_type_v=s.cache_type_v,
                  embedding=s.embedding, pooling=s.pooling, lora=s.lora)


class Registry:
    """See the module docstring. models_max 0: no limit; autoload False: a model loads only at
    start (load_on_startup) or through load(); sleep_idle_s None: models never sleep."""

    def __init__(self, specs: Iterable[ModelSpec], *, models_max: int = DEFAULT_MODELS_MAX, autoload: bool = True,
                 sleep_idle_s: float | None = None, factory: Callable[[ModelSpec], Engine] = _never_loaded,
                 default: str | None = None):
        self.entries: list[ModelEntry] = [ModelEntry(s) for s in specs]
        if not self.entries:
            raise ValueError("the registry needs at least one model")
        if models_max < 0:
            raise ValueError(f"models_max must be >= 0 (0: no limit), got {models_max}")
        if sleep_idle_s is not None and sleep_idle_s <= 0:
            raise ValueError(f"sleep_idle_s must be positive, got {sleep_idle_s}")
        self.models_max = models_max
        self.autoload = autoload
        self.sleep_idle_s = sleep_idle_s
        self._factory = factory
        self._names: dict[str, ModelEntry] = {}
        for e in self.entries:
            for n in (e.name, *e.spec.aliases):
                other = self._names.get(n)
                if other is not None and other is not e:
                    raise ValueError(f"two models are named '{n}': {other.spec.source} ({other.spec.origin}) and "
                                     f"{e.spec.source} ({e.spec.origin}); give one of them another name")
                self._names[n] = e
        # LoRA adapters as models (llamay's listing): "base+adapter" is the base with that adapter at scale 1
        self._adapters: dict[str, tuple[ModelEntry, str]] = {}
        for e in self.entries:
            for name in adapter_files(e.spec):
                if f"{e.name}+{name}" not in self._names:  # a model's own name wins
                    self._adapters[f"{e.name}+{name}"] = (e, name)
        # the names models answer to beyond their ids and aliases (implied_names); one that two
        # models imply means the one the catalog says it means (qwen2.5-coder: the 0.5b), else neither
        self._implied: dict[str, list[ModelEntry]] = {}
        for e in self.entries:
            for n in implied_names(e.spec):
                if n not in self._names and e not in self._implied.setdefault(n, []):
                    self._implied[n].append(e)
        # the default model: the one named (-m, a preset), while it can be served; else the first
        # that loads (kept once chosen), or until one has, the first that has not failed
        self._designated = self._names[default] if default is not None else None
        self._chosen: ModelEntry | None = None
        at_start = [e.name for e in self.entries if e.spec.load_on_startup]
        if 0 < models_max < len(at_start):
            raise TooManyAtStartError(at_start, models_max)
        self._swap = gevent.lock.Semaphore()  # one load decision at a time
        self.stopped = False
        self._watchers: list[gevent.Greenlet] = []
        self._sleeping: gevent.Greenlet | None = None  # the idle-sleep watcher, once there is one

    @classmethod
    def single(cls, engine: Engine, name: str, aliases: Iterable[str] = ()) -> Registry:
        """A registry of one model whose engine is already made (started or not); if it sleeps,
        it comes back as a fresh engine with the same settings."""
        spec = ModelSpec(name, engine.model_name, tuple(a for a in aliases if a != name), load_on_startup=True)
        reg = cls([spec], models_max=0, factory=lambda _spec: engine.fresh())
        reg.entries[0].engine = engine
        reg.entries[0].startup = True  # its first load is the server's start: not_ready meanwhile
        return reg

    # --- names ---------------------------------------------------------------------------------

    @property
    def default(self) -> ModelEntry:
        """The model "bubo" names and llama-server's routes use without a `model`: the one the
        server was told (-m, a preset) unless it failed; else the first model that loaded; until
        one has, the first that has not failed. A model that cannot load is never the default
        while another can be."""
        for e in (self._designated, self._chosen):
            if e is not None and e.status is not ModelStatus.FAILED:
                return e
        for e in self.entries:
            if e.status in (ModelStatus.LOADED, ModelStatus.SLEEPING):
                self._chosen = e
                return e
        for e in self.entries:
            if e.status is not ModelStatus.FAILED:
                return e
        return self._designated or self.entries[0]

    @property
    def is_router(self) -> bool:
        return len(self.entries) > 1

    def names(self) -> list[str]:
        """Every name a request may use: the ids in order, then the aliases, then base+adapter names."""
        out = [e.name for e in self.entries]
        out += [n for n in self._names if n not in out]
        out += [n for n in self._adapters if n not in out]
        return out + ([DEFAULT_NAME] if DEFAULT_NAME not in out else [])

    def adapter_models(self) -> list[tuple[str, ModelEntry, str]]:
        """(the base+adapter name, the base's entry, the adapter's name) of every adapter as a model."""
        return [(n, e, a) for n, (e, a) in self._adapters.items()]

    def adapter_of(self, name: str) -> str | None:
        """The adapter a base+adapter name means (None for any other name)."""
        if name in self._names:
            return None
        got = self._adapters.get(name)
        if got is None:
            folded = [v for n, v in self._adapters.items() if n.casefold() == name.casefold()]
            got = folded[0] if len(folded) == 1 else None
        return got[1] if got is not None else None

    def lookup(self, name: str) -> ModelEntry:
        """The model `name` means: an id or alias, "bubo" (the default model), or a name it
        implies (implied_names); failing those, any of these spelled in other letter case when
        only one model answers to it. UnknownModelError, with the close names, when none does."""
        entry = self._names.get(name) or self._implied_one(name)
        if entry is None and name in self._adapters:
            entry = self._adapters[name][0]
        if entry is None and name in (DEFAULT_NAME, f"{DEFAULT_NAME}:latest"):
            return self.default
        if entry is None:
            folded = {e for n, e in self._every_name() if n.casefold() == name.casefold()}
            if len(folded) == 1:
                return folded.pop()
            raise UnknownModelError(name, self.names(), self.close_names(name))
        return entry

    def _implied_one(self, name: str) -> ModelEntry | None:
        claims = self._implied.get(name)
        if not claims:
            return None
        if len(claims) == 1:
            return claims[0]
        from bubo import store

        try:
            meant = store.catalog_name(name)
        except store.UnknownModelError:
            return None
        return next((e for e in claims if meant is not None and meant in implied_names(e.spec)), None)

    def _every_name(self) -> list[tuple[str, ModelEntry]]:
        out = list(self._names.items())
        out += [(n, e) for n, claims in self._implied.items() for e in claims]
        out += [(n, e) for n, (e, _) in self._adapters.items()]
        return out + [(DEFAULT_NAME, self.default), (f"{DEFAULT_NAME}:latest", self.default)]

    def close_names(self, name: str) -> list[str]:
        """The ids and aliases close to a name that matches none (a typo's likely meaning), the
        closest first: the ones of the models that the close spellings of any of their names mean."""
        import difflib

        every = self._every_name()
        close = difflib.get_close_matches(name.casefold(), [n.casefold() for n, _ in every], n=5, cutoff=0.75)
        out: list[str] = []
        for c in close:
            for n, e in every:
                if n.casefold() == c and e.name not in out:
                    out.append(e.name)
        return out[:3]

    def check_files(self) -> None:
        """Read the header of every model that is a file: one that cannot be served (missing,
        not GGUF, malformed, an architecture or block type bubo does not run) shows as failed,
        with the reason, before anyone asks for it; the others are not disturbed."""
        from bubo.errors import BuboError
        from bubo.gguf import GGUFFile, check_model_file

        for e in self.entries:
            if e.engine is not None or not _is_path(e.spec.source):
                continue
            try:
                with GGUFFile(e.spec.source) as f:
                    check_model_file(f)
            except (BuboError, OSError) as err:
                e._status = ModelStatus.FAILED
                e.error = f"{type(err).__name__}: {err}"
                log.error("model %s cannot be served: %s", e.name, e.error)

    # --- life cycle ---------------------------------------------------------------------------

    def start(self, sleep_poll_s: float = 1.0) -> None:
        """Start loading the models marked load_on_startup (an engine already made is started
        as it is), and the idle-sleep watcher. Returns at once: a model that cannot load (its
        file, or the memory) shows as failed, and the others serve."""
        for e in self.entries:
            if e.engine is not None:
                e.startup = True
                if not e.engine.started:
                    e.engine.start()
                    e.n_loads += 1
            elif e.spec.load_on_startup and e.status is ModelStatus.UNLOADED:
                self._load_at_start(e)
        if self.is_router:
            self._watchers.append(gevent.spawn(self._default_loads, sleep_poll_s / 4))
        if self.sleep_idle_s is not None:
            self._sleeping = gevent.spawn(self._sleeper, min(sleep_poll_s, self.sleep_idle_s / 4))
            self._watchers.append(self._sleeping)

    def _load_at_start(self, e: ModelEntry) -> None:
        e.startup = e.pending = True  # loading (requests get not_ready) from now on
        self._watchers.append(gevent.spawn(self._load_quietly, e))

    def _default_loads(self, poll_s: float) -> None:
        """Until a model has loaded: when the default is one nothing loads (the one that was to
        load at start failed, the next is the default now), start loading it, so that /ready
        comes to say ready whichever model fails."""
        while not self.stopped:
            if any(e.info is not None or (e.engine is not None and e.engine.info is not None) for e in self.entries):
                return
            if not any(e.spec.load_on_startup and e.status is ModelStatus.FAILED for e in self.entries):
                gevent.sleep(poll_s)  # nothing that was to load at start has failed: nothing to replace
                continue
            d = self.default
            if d.status is ModelStatus.UNLOADED and not d.pending:
                self._load_at_start(d)
            gevent.sleep(poll_s)

    def stop(self) -> None:
        """Stop every engine (their requests end with Reason.SHUTTING_DOWN) and load nothing more."""
        self.stopped = True
        for g in self._watchers:
            g.kill(block=False)
        for e in self.entries:
            if e.engine is not None:
                e.engine.stop("the server is shutting down: this answer ends here, unfinished")

    # --- requests ----------------------------------------------------------------------------

    def acquire(self, name: str) -> Engine:
        """The loaded engine of the model `name` (an id or alias), loading it if need be; the
        caller uses it until release(entry). UnknownModelError, ModelNotLoadedError (autoload off),
        NotReadyError (loading at start, or its load failed), InsufficientMemoryError (it cannot
        fit beside what must stay loaded)."""
        entry = self.lookup(name)
        entry.waiting += 1
        try:
            return self._acquire(entry)
        finally:
            entry.waiting -= 1

    def _acquire(self, entry: ModelEntry) -> Engine:
        while True:
            if self.stopped:
                raise NotReadyError("the server is shutting down")
            status = entry.status
            if status is ModelStatus.LOADED:
                assert entry.engine is not None
                entry.users += 1
                entry.last_used = entry.last_busy = time.monotonic()
                return entry.engine
            if status is ModelStatus.LOADING and entry.startup:
                raise NotReadyError(f"the model {entry.name} is loading", loading=True)
            if status is ModelStatus.FAILED:
                raise NotReadyError(f"the model {entry.name} failed to load: {entry.failure}")
            if status is ModelStatus.UNLOADED and not self.autoload:
                raise ModelNotLoadedError(entry.name)
            if status in (ModelStatus.UNLOADED, ModelStatus.SLEEPING):
                self._begin_load(entry)
                continue
            gevent.sleep(POLL_S)  # loading, waiting for a swap, or unloading: look again

    def release(self, entry: ModelEntry) -> None:
        entry.users = max(entry.users - 1, 0)
        entry.last_busy = time.monotonic()

    # --- load and unload ------------------------------------------------------------------------

    def load(self, name: str) -> ModelEntry:
        """Start loading `name` unless it is loaded or loading (a failed model tries again);
        returns at once (its status tells when it is loaded), unless the load is refused at once
        (the memory: InsufficientMemoryError)."""
        entry = self.lookup(name)
        if entry.status in (ModelStatus.UNLOADED, ModelStatus.SLEEPING, ModelStatus.FAILED):
            g = gevent.spawn(self._begin_load, entry)
            g.join(timeout=POLL_S)  # a refusal comes at once; a swap that waits goes on alone
            if g.ready():
                g.get()
            else:
                g.link_exception(lambda g: self._failed(entry, g.exception))
        return entry

    @staticmethod
    def _failed(entry: ModelEntry, err: BaseException | None) -> None:
        entry._status = ModelStatus.FAILED
        entry.error = err.message if isinstance(err, EngineRefusal) else f"{type(err).__name__}: {err}"
        log.error("model %s cannot load: %s", entry.name, entry.error)

    def unload(self, name: str, *, sleeping: bool = False) -> ModelEntry:
        """Unload `name`, waiting for its requests in flight (queued, running, or streams still
        being read) to end; requests that arrive meanwhile wait for the unload. Returns once
        its memory is released (unloaded or failed models: at once)."""
        entry = self.lookup(name)
        while entry.status is ModelStatus.LOADING:
            gevent.sleep(POLL_S)
        if entry.status is ModelStatus.UNLOADING:
            while entry.status is ModelStatus.UNLOADING:
                gevent.sleep(POLL_S)
            return entry
        if entry.status is ModelStatus.LOADED:
            self._drain(entry, ModelStatus.SLEEPING if sleeping else ModelStatus.UNLOADED)
        return entry

    def _drain(self, entry: ModelEntry, status: ModelStatus) -> None:
        """Unload a loaded entry once its work in flight has ended: from now on new requests for
        it wait (its status is unloading), so a busy model cannot keep a swap waiting forever."""
        entry._status = ModelStatus.UNLOADING
        try:
            while entry.busy:
                gevent.sleep(POLL_S)
            self._drop(entry, status)
        finally:
            if entry._status is ModelStatus.UNLOADING:  # interrupted: it is still loaded
                entry._status = ModelStatus.UNLOADED

    def _drop(self, entry: ModelEntry, status: ModelStatus) -> None:
        """Stop an idle entry's engine and let its memory go."""
        eng = entry.engine
        assert eng is not None
        entry._status = ModelStatus.UNLOADING  # no request takes it from here on
        eng.stop()
        while not eng.stopped:
            gevent.sleep(POLL_S)
        entry.info = eng.info or entry.info
        entry.engine = None
        entry._status = status
        del eng
        gc.unfreeze()  # a server freezes what a loaded model put on the heap (serve._freeze_heap)
        gc.collect()  # the runtime and its cache may sit in reference cycles: free them now
        log.info("model %s %s", entry.name, "sleeps" if status is ModelStatus.SLEEPING else "unloaded")

    def _load_quietly(self, entry: ModelEntry) -> None:
        """A start-up load (entry.pending set) in a greenlet of its own: a refusal marks the
        model failed, with why."""
        try:
            self._load_pending(entry, startup=True)
        except EngineRefusal as e:
            self._failed(entry, e)

    def _begin_load(self, entry: ModelEntry) -> None:
        """Make room (models_max, memory), then start entry's engine. While the model that must
        go is busy, it stops taking requests and this waits for its work in flight to end."""
        if entry.status in (ModelStatus.LOADED, ModelStatus.LOADING, ModelStatus.UNLOADING):
            return  # another request got here first
        entry.pending = True  # shows as loading: the requests behind this one wait for it
        self._load_pending(entry)

    def _load_pending(self, entry: ModelEntry, startup: bool = False) -> None:
        try:
            with self._swap:
                while True:
                    must, victim = self._victim(entry)
                    if not must:
                        break
                    if victim is not None:
                        self._drain(victim, ModelStatus.UNLOADED)
                    else:
                        gevent.sleep(POLL_S)  # still loading, or about to serve its waiters: look again
                entry._status = ModelStatus.UNLOADED
                entry.error = None
                entry.startup = startup
                entry.engine = self._factory(entry.spec)
                entry.engine.start()
                entry.n_loads += 1
                entry.last_used = entry.last_busy = time.monotonic()
                log.info("loading model %s from %s", entry.name, entry.spec.source)
        finally:
            entry.pending = False

    def _victim(self, entry: ModelEntry) -> tuple[bool, ModelEntry | None]:
        """(must one go, which) before entry can load: over models_max, or while the memory
        available now (less what the models still loading will take) is short of entry's
        weights, the least recently used loaded model goes, idle ones first; None while every
        candidate is still loading or has requests waiting for it (they are served first).
        InsufficientMemoryError when entry cannot fit even with every other model gone."""
        loaded = [e for e in self.entries if e is not entry and e.engine is not None]
        over = self.models_max > 0 and len(loaded) >= self.models_max
        short = False
        # one model loads as it always did; with several, the memory available now must hold
        # the new model's weights beside the ones that stay
        need = _weights_bytes(entry.spec.source) if self.is_router else None
        if need is not None:
            ceiling, available = memory_budget()
            coming = sum(_weights_bytes(e.spec.source) or 0 for e in loaded if e.status is ModelStatus.LOADING)
            reclaimable = sum(_weights_bytes(e.spec.source) or 0 for e in loaded)
            if ceiling is not None and need > ceiling + reclaimable:
                raise InsufficientMemoryError(need, ceiling + reclaimable, True, 0,
                                              what=f"{need / 1024 ** 3:.2f} GiB for the weights of {entry.name}")
            if available is not None and need > available - coming:
                short = True
                if not loaded:
                    raise InsufficientMemoryError(need, max(available - coming, 0), False, 0,
                                                  what=f"{need / 1024 ** 3:.2f} GiB for the weights of {entry.name}")
        if not (over or short):
            return False, None
        ready = [e for e in loaded if e.status is ModelStatus.LOADED and e.waiting == 0]
        if not ready:
            return True, None
        return True, min(ready, key=lambda e: (e.busy, e.last_used))

    # --- idle sleep -------------------------------------------------------------------------------

    KEEP_ALIVE_POLL_S = 0.25

    def keep_alive(self, name: str, seconds: float) -> None:
        """How long model `name` stays loaded once idle, from now on (a request's keep_alive, as
        Ollama has it): 0 unloads it as soon as its requests end, math.inf never; it sleeps, and
        its next request loads it again."""
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"keep_alive must be >= 0 seconds (math.inf: forever), got {seconds}")
        entry = self.lookup(name)
        entry.keep_alive_s = seconds
        entry.last_busy = time.monotonic()
        if self._sleeping is None and not self.stopped and not math.isinf(seconds):
            self._sleeping = gevent.spawn(self._sleeper, self.KEEP_ALIVE_POLL_S)
            self._watchers.append(self._sleeping)

    def _sleeper(self, poll_s: float) -> None:
        while True:
            gevent.sleep(poll_s)
            now = time.monotonic()
            for e in self.entries:
                limit = e.idle_limit(self.sleep_idle_s)
                if e.status is not ModelStatus.LOADED or e.busy:
                    e.last_busy = now  # idle time counts from the end of the load or of the last request
                elif limit is not None and now - e.last_busy >= limit:
                    try:
                        self.unload(e.name, sleeping=True)
                    except Exception:  # noqa: BLE001 - the watcher must go on
                        log.exception("putting %s to sleep failed", e.name)


def _weights_bytes(source: str) -> int | None:
    """The size of a model's file, what its weights take in memory once loaded (a catalog
    model's listed size; None: unknown)."""
    try:
        return os.path.getsize(source)
    except OSError:
        pass
    from bubo import store

    try:
        name = store.catalog_name(source)
    except store.UnknownModelError:
        return None
    if name is None:
        return None
    if store.is_stored(name):
        return os.path.getsize(store.model_path(name))
    return store.CATALOG[name].gguf_size  # None for a converted model: its GGUF's size is known once written


def _is_path(source: str) -> bool:
    """A file's path rather than a catalog name (smollm2:135m, or smollm2 for its default tag)."""
    from bubo import store

    try:
        return store.catalog_name(source) is None
    except store.UnknownModelError:
        return False  # a catalog family with an unknown tag: resolving it at load names the tags
