"""The engine: one OS thread that owns a model and serves every request in parallel slots.

    engine = Engine("smollm2:135m", n_ctx=2048, n_parallel=4)
    engine.start()                      # loads on the engine thread; returns at once
    stream = engine.submit(GenerationRequest(prompt=ids, max_tokens=16))
    for event in stream:                # in a greenlet: waiting never blocks the gevent hub
        ...                             # TokenEvent ... then one FinishEvent or ErrorEvent

Only the engine thread calls decode (native code, GIL released), so health, metrics and
tokenize answers stay fast while a long prompt runs. The thread loads a Runtime (bubo/runtime.py)
and runs the scheduler (bubo/engine/scheduler.py): continuous batching over n_parallel slots that
share one paged KV cache of n_ctx tokens and its prefix cache. Requests wait in a FIFO queue for a
slot; with queue_size set, a request that finds every slot busy and queue_size requests waiting is
refused (QueueFullError). The thread wakes a waiting greenlet through a libev/libuv async watcher
of that greenlet's hub (thread-safe to send), never by blocking the hub.

The memory guard: the KV cache is reserved for the whole context but taken from the OS only as it
fills (bubo._model.KVCache), so a context larger than memory is allowed and each request is
checked before it is queued. The KV bytes it needs beyond what the cache already took (prompt +
max_tokens, capped at the context) are compared with what the machine can give: more than its
total memory less what this process holds can never fit (InsufficientMemoryError, permanent);
more than is available now less a safety margin must wait (InsufficientMemoryError, retry). A
request without max_tokens is admitted for its prompt; its answer ends with finish "length" when
the cache would have to grow past the memory available, rather than invite the OOM killer. This
process's memory counts every model it holds, so with several models loaded (the registry,
bubo/engine/registry.py) the guard covers their sum.

stop() ends the thread after its current step; requests still in flight end with an ErrorEvent
(Reason.SHUTTING_DOWN) and the engine lets go of its runtime and cache, so their memory returns
to the OS once nothing else holds them (the registry's unload and idle sleep rely on that).

The thread and its locks are the unpatched ones, and its events reach the readers' greenlets
through bubo/engine/streams.py (EventStream, EmbedJob). The engine core it runs is the scheduler;
the library's bubo.Model steps the same scheduler in its caller's thread instead.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from bubo import cpus
from bubo.engine.contexts import MAX_CONTEXTS
from bubo.engine.draft import DEFAULT_DRAFT, DraftConfig, DraftModel
from bubo.engine.memory import (
    KV_TYPES,
    check_cache_type,
    context_size,
    memory_budget,
    memory_short,
    reserve_small_cache,
)
from bubo.engine.streams import Call, EmbedJob, EventStream, allocate_lock, start_new_thread
from bubo.engine.types import (
    ContextLengthError,
    EngineMetrics,
    ErrorEvent,
    GenerationRequest,
    InsufficientMemoryError,
    InvalidRequestError,
    NotReadyError,
    QueueFullError,
    Reason,
    SlotState,
)

if TYPE_CHECKING:
    from pathlib import Path

    from bubo._model import KVCache
    from bubo._tokenizer import Tokenizer
    from bubo.engine.generation import Generation
    from bubo.engine.scheduler import Scheduler
    from bubo.runtime import Runtime

log = logging.getLogger("bubo.engine")
T = TypeVar("T")


# an encoder's thread takes queued embeddings jobs together up to this many tokens (a job larger
# than that runs alone): eight forward passes' worth, so a burst of small requests shares passes
EMBED_BATCH_TOKENS = 4096
# Clients that each send one small request at a time fall into step with the encoder's passes:
# those answered by one pass send again while the next runs, which takes only the others, so the
# passes carry half the clients each, and a pass of few tokens costs nearly what a fuller one does
# (the weights stream through the caches once per pass). When a batch holds a job that waited
# through the pass before it, or that pass answered several clients, the thread waits for as many
# new jobs as that pass answered (linger_for), at most EMBED_LINGER_SHARE of a pass's recent time
# and EMBED_LINGER_MAX_S, woken once when they are queued. A lone client's request never waits:
# nothing waited, and the pass before answered only it.
# (all-minilm:l6-v2, one input per request, AMD EPYC Zen 5: 4 clients 242 -> 332 requests/s, 2 clients
# 205 -> 269, one client unchanged)
EMBED_LINGER_SHARE = 0.25
EMBED_LINGER_MAX_S = 0.002


def linger_for(queued_at: list[float], last_end: float, last_n: int, now: float, pass_s: float) -> int:
    """How many jobs an encoder's batch waits for (EMBED_LINGER_SHARE): those taken (queued at
    queued_at) that waited for the last batch, which ended at last_end with last_n jobs, and as
    many as that batch answered, whose clients send again. None (0) when the engine has been idle
    for a pass's time (pass_s) or more, or when nothing shows another client: no job waited and
    the last batch answered one request (a lone client's next one)."""
    if not last_n or now - last_end >= pass_s:
        return 0
    waited = sum(1 for t in queued_at if t < last_end)
    return waited + last_n if waited or last_n > 1 else 0


# slots: -np's default is as many as the context gives MIN_TOKENS_PER_SLOT each, at most
# DEFAULT_MAX_PARALLEL on the CPU; a step (one forward pass) takes at most MAX_STEP_TOKENS
DEFAULT_MAX_PARALLEL = 4
MAX_PARALLEL = 256
MIN_TOKENS_PER_SLOT = 512
DEFAULT_N_BATCH = 2048  # llama-server's -b
DEFAULT_N_UBATCH = 512  # llama-server's -ub
MAX_STEP_TOKENS = 512  # the native decode's batch limit (BUBO_MODEL_MAX_BATCH)


@dataclasses.dataclass(frozen=True)
class Checked:
    """A request Engine.check has taken apart: its sampler and grammar state, ready to queue."""

    engine: Engine
    req: GenerationRequest
    gen: Generation


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a loaded model is, kept after it is unloaded (a sleeping model's /props)."""

    path: str
    architecture: str
    name: str | None
    n_ctx: int
    n_ctx_train: int | None
    n_vocab: int
    n_embd: int | None
    n_layer: int | None
    n_parallel: int
    chat_template: str | None
    bos_token: str
    eos_token: str


@dataclasses.dataclass(frozen=True)
class CacheView:
    """What the KV cache holds: each slot's tokens, the blocks in use, the blocks kept only for
    the prefix cache."""

    n_ctx: int
    block_size: int
    used_blocks: int
    cached_blocks: int
    slots: list[tuple[int, list[int]]]  # (slot id, the tokens its sequence holds)


class Engine:
    """One model, n_parallel slots, one engine thread. See the module docstring.

    An encoder (bert) has no slots and no KV cache: its thread runs embeddings jobs (embed())
    one after another, each a batch of its inputs; submit() refuses it text generation."""

    def __init__(self, model: str, *, n_ctx: int | None = None, n_threads: int | None = None,
                 n_threads_batch: int | None = None, chat_template: str | None = None, load_delay_s: float = 0.0,
                 load_mem_available: int | None = None,
                 n_parallel: int | None = None, n_batch: int = DEFAULT_N_BATCH, n_ubatch: int = DEFAULT_N_UBATCH,
                 queue_size: int | None = None, draft: DraftConfig | None = DEFAULT_DRAFT,
                 cache_type_k: str = "f16", cache_type_v: str = "f16", embedding: bool = False,
                 pooling: str | None = None, lora: tuple[tuple[str, float], ...] = ()):
        if n_ctx is not None and n_ctx < 0:
            raise ValueError(f"n_ctx must be 0 (the trained context) or positive, got {n_ctx}")
        if n_threads is not None and n_threads <= 0:
            raise ValueError(f"n_threads must be positive, got {n_threads}")
        if n_threads_batch is not None and n_threads_batch <= 0:
            raise ValueError(f"n_threads_batch must be positive, got {n_threads_batch}")
        if n_parallel is not None and not 1 <= n_parallel <= MAX_PARALLEL:
            raise ValueError(f"n_parallel must be 1..{MAX_PARALLEL}, got {n_parallel}")
        if n_batch <= 0 or n_ubatch <= 0:
            raise ValueError(f"batch sizes must be positive, got n_batch={n_batch} n_ubatch={n_ubatch}")
        if queue_size is not None and queue_size < 0:
            raise ValueError(f"queue_size must be >= 0 (or None: unbounded), got {queue_size}")
        self.cache_type_k = check_cache_type(cache_type_k, "cache_type_k", k=True)
        self.cache_type_v = check_cache_type(cache_type_v, "cache_type_v", k=False)
        self._settings: dict[str, Any] = dict(
            n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads_batch, chat_template=chat_template,
            load_delay_s=load_delay_s,
            load_mem_available=load_mem_available,
            n_parallel=n_parallel, n_batch=n_batch, n_ubatch=n_ubatch, queue_size=queue_size, draft=draft,
            cache_type_k=cache_type_k, cache_type_v=cache_type_v, embedding=embedding, pooling=pooling, lora=lora)
        self.lora = tuple(lora)  # LoRA adapters (path, initial scale): loaded with the model (Runtime.load_adapters)
        if pooling is not None and pooling not in ("mean", "cls", "last"):
            raise ValueError(f"pooling must be mean, cls or last, not {pooling!r}")
        self.embedding = embedding  # --embedding: refuse a model that is not an encoder
        self.pooling = pooling
        self.draft = draft  # speculative decoding (bubo.engine.draft): prompt lookup or a draft model; None: off
        self.model_name = str(model)
        self._chat_template_override = chat_template  # replaces the GGUF's tokenizer.chat_template
        self.model_path: str | None = None
        self.n_ctx: int | None = None
        self.n_ctx_train: int | None = None
        self.n_threads = n_threads or cpus.usable()
        self.n_threads_batch = n_threads_batch or self.n_threads  # a prompt's steps (llama.cpp's -tb)
        self.n_parallel: int | None = n_parallel  # resolved at load
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.queue_size = queue_size
        self.runtime: Runtime | None = None  # once loaded; None again once stopped
        self.kv: KVCache | None = None  # the slots' shared KV cache
        self.weights_bytes = 0  # the model file's size, once loaded
        self.draft_weights_bytes = 0  # the draft model file's size, once loaded (0: none)
        self.kv_bytes = 0  # the KV cache's K and V storage at full capacity, once loaded
        self.load_s: float | None = None  # how long the last load took
        self.info: ModelInfo | None = None  # once loaded; kept once stopped
        self.ready = False
        self.load_error: str | None = None
        self.stopped = False  # the thread has ended and let go of the model
        self._n_ctx_requested = n_ctx
        self._load_delay_s = load_delay_s  # a debug hook: makes the loading window observable
        self._load_mem_available = load_mem_available  # a debug hook: the memory free at load
        self._lock = allocate_lock()  # guards the open-stream count and the embeddings jobs
        self._work = allocate_lock()  # released = "there is work"; the engine thread acquires it
        self._work.acquire()
        self._sched: Scheduler | None = None
        self.encoder = False  # an embedding model (known once loaded)
        self._jobs: collections.deque[EmbedJob] = collections.deque()
        self._wake_jobs = 1  # queued embeddings jobs that wake the encoder's thread (more while it lingers)
        self._calls: collections.deque[Call] = collections.deque()  # run on the thread between steps
        self._calls_closed = False  # the thread has ended: a call is refused
        self._started = False
        self._stopping = False
        self._n_open = 0  # streams submitted and not yet read to their end or cancelled
        self._stop_why = f"the model {self.model_name} was stopped (unloaded, or the server is shutting down)"

    # --- what the model is (once ready) ------------------------------------------------

    def _runtime(self) -> Runtime:
        rt = self.runtime
        if rt is None or not self.ready:
            raise NotReadyError(self.load_error or f"the model {self.model_name} is not loaded")
        return rt

    @property
    def tokenizer(self) -> Tokenizer:
        return self._runtime().tokenizer

    @property
    def chat_template(self) -> str | None:
        """The chat template's source (the override, else the model file's; None: a base model)."""
        return self._runtime().chat_template_source

    @property
    def metadata(self) -> dict[str, Any]:
        return self._runtime().metadata

    # --- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        """Load the model on the engine thread and serve requests there; returns at once."""
        if self._started:
            raise RuntimeError("the engine is already started")
        self._started = True
        start_new_thread(self._main, ())

    @property
    def started(self) -> bool:
        return self._started

    def fresh(self) -> Engine:
        """A new engine, not started, for the same model with the same settings (to load it again
        after this one stopped)."""
        return Engine(self.model_name, **self._settings)

    def stop(self, why: str | None = None) -> None:
        """Ask the engine thread to end after the current step (see the module docstring); why
        is what the requests still in flight are told."""
        if why is not None:
            self._stop_why = why
        self._stopping = True
        if self.encoder:  # the queued embeddings jobs end now, not after the one running
            with self._lock:
                rest = list(self._jobs)
                self._jobs.clear()
                self._n_open -= len(rest)
            for job in rest:
                job.finish(error=NotReadyError(self._stop_why))
        self._signal()

    @property
    def idle(self) -> bool:
        """Nothing in flight: no request in a slot or waiting, no stream still being read."""
        sched = self._sched
        return self._n_open == 0 and (sched is None or sched.idle())

    def _main(self) -> None:
        cpus.name_thread("bubo-engine")
        try:
            self._load()
        except BaseException as e:  # noqa: BLE001 - reported by /ready, logged
            why = f"{type(e).__name__}: {e}"
            # logged before it is set: whoever waits on load_error (serve's last line) comes after
            log.error("loading %s failed: %s", self.model_name, why)
            self.load_error = why
            self._release()
            return
        self.ready = True
        if self.encoder:
            self._serve_embeddings()
            return
        log.debug("model ready: %s (context %d tokens shared by %d slots, %d threads)", self.model_name,
                 self.n_ctx, self.n_parallel, self.n_threads)
        sched = self._sched
        assert sched is not None
        while not self._stopping:
            self._run_calls(sched)
            try:
                worked = sched.step()
            except Exception as e:  # noqa: BLE001 - a bug in one step must not end the engine
                log.exception("engine step failed")
                sched.fail_all(ErrorEvent(Reason.INTERNAL, f"generation failed: {type(e).__name__}: {e}"))
                worked = True
            if not worked and not self._calls:
                self._work.acquire()
        self.ready = False
        try:
            sched.close(ErrorEvent(Reason.SHUTTING_DOWN, self._stop_why))
        finally:
            with self._lock:
                calls = list(self._calls)
                self._calls.clear()
                self._calls_closed = True
            for call in calls:
                call.finish(error=NotReadyError(self._stop_why))
            self._release()

    def _run_calls(self, sched: Scheduler) -> None:
        with self._lock:
            calls = list(self._calls)
            self._calls.clear()
        for call in calls:
            assert call.fn is not None
            if call.cancelled:  # its waiter is gone (a client that left): nobody would learn what it did
                call.finish(error=NotReadyError("cancelled"))
                continue
            try:
                call.finish(call.fn(sched))
            except Exception as e:  # noqa: BLE001 - the call's failure is its caller's answer
                call.finish(error=e)

    def call(self, fn: Callable[[Scheduler], T]) -> T:
        """fn(scheduler) on the engine's thread between two steps (what the KV cache holds may
        change only there): its value, or its exception raised here. The caller's greenlet waits
        without blocking the hub. NotReadyError while loading or stopping."""
        if self._stopping or self.stopped:
            raise NotReadyError(f"the model {self.model_name} is being unloaded")
        if not self.ready or self._sched is None:
            raise self._not_ready()
        job = Call(fn)
        with self._lock:
            closed = self._calls_closed
            if not closed:
                self._calls.append(job)
        if closed:
            job.finish(error=NotReadyError(self._stop_why))
        self._signal()
        return cast(T, job.result())

    def _serve_embeddings(self) -> None:
        """An encoder's thread: the queued embeddings jobs until stopped. Whatever is queued when
        the thread comes for work (up to EMBED_BATCH_TOKENS) goes through the model together,
        so that many small requests share forward passes as one request's inputs do."""
        log.debug("embedding model ready: %s (%d threads)", self.model_name, self.n_threads)
        jobs: list[EmbedJob] = []
        last_end, last_n, pass_s = 0.0, 0, 0.0  # the last batch: when it ended, its jobs; a batch's recent time
        try:
            while not self._stopping:
                jobs = []
                n_tokens = self._take_jobs(jobs, 0)
                if not jobs:
                    self._work.acquire()
                    continue
                want = linger_for([job.queued_at for job in jobs], last_end, last_n, time.monotonic(), pass_s)
                if want > len(jobs) and n_tokens < MAX_STEP_TOKENS:  # (a full pass gains nothing by waiting)
                    n_tokens = self._linger(jobs, n_tokens, want, min(EMBED_LINGER_MAX_S, EMBED_LINGER_SHARE * pass_s))
                log.debug("embedding %d jobs, %d tokens", len(jobs), n_tokens)
                t0 = time.monotonic()
                try:
                    self._run_jobs(jobs)
                except Exception as e:  # noqa: BLE001 - a bug in one batch must not end the engine
                    log.exception("embedding failed")
                    for job in jobs:
                        job.finish(error=e)
                finally:
                    now = time.monotonic()
                    # the first answer's time: a request queued before it is another client's
                    last_end = min((job.answered_at for job in jobs if job.answered_at), default=now)
                    last_n = sum(1 for job in jobs if not job.cancelled)
                    pass_s = now - t0 if not pass_s else 0.8 * pass_s + 0.2 * (now - t0)
                    with self._lock:
                        self._n_open -= len(jobs)
                    jobs = []
        finally:
            self.ready = False
            with self._lock:
                queued = list(self._jobs)
                self._jobs.clear()
                self._n_open -= len(queued) + len(jobs)  # jobs: taken and not yet counted off
            for job in jobs + queued:
                job.finish(error=NotReadyError(self._stop_why))  # no-op for those already answered
            self._release()

    def _take_jobs(self, jobs: list[EmbedJob], n_tokens: int) -> int:
        """Queued embeddings jobs onto jobs while they fit EMBED_BATCH_TOKENS (the first always);
        the batch's tokens."""
        with self._lock:
            while self._jobs and (not jobs or n_tokens + self._jobs[0].n_tokens <= EMBED_BATCH_TOKENS):
                job = self._jobs.popleft()
                jobs.append(job)
                n_tokens += job.n_tokens
        return n_tokens

    def _linger(self, jobs: list[EmbedJob], n_tokens: int, want: int, wait_s: float) -> int:
        """Jobs that arrive within wait_s join the batch, until it has want jobs or is full. The
        thread is woken once, when the queue holds the jobs it waits for (not by each: a wake-up
        takes the GIL from the thread that is reading the next request)."""
        deadline = time.monotonic() + wait_s
        self._work.acquire(False)  # a wake-up left by the jobs already taken
        try:
            while len(jobs) < want and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with self._lock:
                    self._wake_jobs = want - len(jobs)
                    ready = len(self._jobs) >= self._wake_jobs
                if not ready:
                    self._work.acquire(timeout=left)  # released by embed() at _wake_jobs queued, and by stop
                before = len(jobs)
                n_tokens = self._take_jobs(jobs, n_tokens)
                if len(jobs) == before and self._jobs:
                    break  # the next job does not fit this batch
        finally:
            with self._lock:
                self._wake_jobs = 1
        return n_tokens

    def _run_jobs(self, jobs: list[EmbedJob]) -> None:
        """Jobs of one pooling through embed_ids, in passes of up to EMBED_BATCH_TOKENS tokens (a
        large job takes several); each normalised (or not) as it asked. Between passes, a
        cancelled job is dropped and a stopping engine ends the rest."""
        from bubo.embed import embed_ids, normalize_rows

        runtime = self.runtime
        assert runtime is not None
        groups: dict[str | None, list[EmbedJob]] = {}
        for job in jobs:
            if not job.cancelled:
                groups.setdefault(job.pooling or self.pooling, []).append(job)
        for pooling, group in groups.items():
            rows: dict[int, list[np.ndarray]] = {id(job): [] for job in group}
            todo = [(job, seq) for job in group for seq in job.seqs]
            i = 0
            while i < len(todo) and not self._stopping:
                j, n = i, 0
                while j < len(todo) and (j == i or n + len(todo[j][1]) <= EMBED_BATCH_TOKENS):
                    n += len(todo[j][1])
                    j += 1
                batch = [(job, seq) for job, seq in todo[i:j] if not job.cancelled and not job.done]
                i = j
                if not batch:
                    continue
                try:
                    vectors = embed_ids(runtime, [seq for _, seq in batch], pooling, normalize=False)
                except Exception as e:  # noqa: BLE001 - each job's reader raises it
                    for job, _ in batch:
                        job.finish(error=e)
                    continue
                for (job, _), vec in zip(batch, vectors):
                    rows[id(job)].append(vec)
            for job in group:
                if job.done or job.cancelled:
                    continue
                if len(rows[id(job)]) < len(job.seqs):  # stopped between passes
                    job.finish(error=NotReadyError(self._stop_why))
                    continue
                mine = np.stack(rows[id(job)])
                job.finish(normalize_rows(mine) if job.normalize else mine)

    def embed(self, seqs: list[list[int]], pooling: str | None = None, normalize: bool = True) -> EmbedJob:
        """Queue an embeddings job (token id lists checked by bubo.embed.tokenize); returns it at
        once: its result() waits. NotReadyError while loading or stopping; InvalidRequestError
        for a model that is not an encoder."""
        if self._stopping or self.stopped:
            raise NotReadyError(f"the model {self.model_name} is being unloaded")
        if not self.ready or self.runtime is None:
            raise self._not_ready()
        if not self.encoder:
            raise InvalidRequestError(f"the model {self.model_name} is not an embedding model")
        job = EmbedJob(seqs, pooling, normalize)
        if not self._queue(job):
            job.cancelled = True
            job.finish(error=NotReadyError(f"the model {self.model_name} is being unloaded"))
            job.result()  # raises it, and closes the job's watcher
        return job

    def _queue(self, job: EmbedJob) -> bool:
        """Queue an embeddings job and wake the thread where it waits for as many (False: the
        engine is stopping, nothing queued)."""
        with self._lock:
            stopping = self._stopping
            if not stopping:
                self._jobs.append(job)
                self._n_open += 1
            wake = stopping or len(self._jobs) >= self._wake_jobs
        if wake:
            self._signal()
        return not stopping

    def _release(self) -> None:
        """Let go of the model and its cache (the thread is ending)."""
        self._sched = None
        self.kv = None
        self.runtime = None
        self.stopped = True

    def _load(self) -> None:
        from bubo import store
        from bubo._model import KVCache
        from bubo.engine.scheduler import Scheduler
        from bubo.runtime import Runtime

        if self._load_delay_s > 0:
            time.sleep(self._load_delay_s)
        t0 = time.monotonic()
        path = store.resolve(self.model_name)
        runtime = Runtime(path, n_threads=self.n_threads, n_threads_batch=self.n_threads_batch,
                          chat_template=self._chat_template_override, name=self.model_name)
        if not runtime.hparams.get("causal", True):
            if self.lora:
                raise ValueError(f"{self.model_name} is an embedding model: it takes no LoRA adapters")
            self._load_encoder(runtime, path, t0)
            return
        runtime.load_adapters(self.lora)
        if self.embedding:
            raise ValueError(f"{self.model_name} is a text-generation model ({runtime.hparams.get('arch')}), "
                             "not an embedding model: an engine made for embeddings serves encoders only "
                             "(such as all-minilm:l6-v2)")
        # the context is sized from the memory free after the load: prepacked weights are the
        # process's own memory, not page cache the kernel could give to the KV cache
        self.n_ctx_train, self.n_ctx = context_size(runtime.metadata, self._n_ctx_requested,
                                                     (KV_TYPES[self.cache_type_k] + KV_TYPES[self.cache_type_v]) / 2)
        if self.n_ctx > (self.n_ctx_train or self.n_ctx):
            # a server honours -c past the trained context, as llama-server does (quality past
            # the trained length is the user's call)
            log.warning("context %d is larger than the trained context %s", self.n_ctx, self.n_ctx_train)
        if self.n_parallel is None:
            self.n_parallel = max(1, min(DEFAULT_MAX_PARALLEL, self.n_ctx // MIN_TOKENS_PER_SLOT))
        n_step = min(self.n_batch, self.n_ubatch, MAX_STEP_TOKENS)
        # swa_full: every layer keeps every block, so that a cached prefix is whole for the
        # sliding-window layers too (their window pool would have released the blocks a later
        # request needs); it costs gemma3 the window layers' share of the context's memory
        # the sequences past the slots' are contexts (bubo.engine.contexts): a block table each
        self.kv = KVCache(runtime.native, self.n_ctx, n_seq_max=self.n_parallel + MAX_CONTEXTS, swa_full=True,
                          type=self.cache_type_k, type_v=self.cache_type_v)
        reserve_small_cache(self.kv, self.n_ctx, self._load_mem_available)
        draft_model = None
        if self.draft is not None and self.draft.model is not None:
            draft_model = DraftModel.load(self.draft, runtime, self.n_ctx, self.n_parallel, n_step)
            self.draft_weights_bytes = draft_model.weights_bytes
        self._sched = Scheduler(runtime, self.kv, self.n_parallel, n_step, self.n_ctx, memory_short,
                                draft=self.draft, draft_model=draft_model, lock=allocate_lock())
        self.model_path = str(path)
        self.weights_bytes = os.path.getsize(path)
        self.kv_bytes = self.kv.nbytes
        self.info = _model_info(runtime, self.n_ctx, self.n_ctx_train, self.n_parallel)
        runtime.control_spans("")  # the control tokens' texts, found once here rather than in a request
        self.load_s = time.monotonic() - t0
        self.runtime = runtime

    def _load_encoder(self, runtime: Runtime, path: Path, t0: float) -> None:
        """An encoder: no KV cache, no slots; its context is what one input may hold."""
        self.encoder = True
        self.n_ctx_train = self.n_ctx = int(runtime.hparams["n_ctx_train"])
        self.n_parallel = 1
        self.model_path = str(path)
        self.weights_bytes = os.path.getsize(path)
        self.info = _model_info(runtime, self.n_ctx, self.n_ctx_train, self.n_parallel)
        self.load_s = time.monotonic() - t0
        self.runtime = runtime

    # --- requests ----------------------------------------------------------------------

    def check(self, req: GenerationRequest, *, mem_available: int | None = None) -> Checked:
        """What submit checks and builds before it queues, from any thread (the server does this
        in its preparation pool, bubo.api.offload): the refusals listed at submit, but for the
        full queue, and the request's sampler and grammar state (a grammar the matcher cannot
        start on, a logit_bias that bans every first token: refused here)."""
        sched, rt = self._ready_parts()
        if not req.prompt:
            raise InvalidRequestError("the prompt is empty")
        assert self.n_ctx is not None and self.n_parallel is not None
        if len(req.prompt) >= self.n_ctx:
            raise ContextLengthError(len(req.prompt), self.n_ctx)
        if req.max_tokens is not None and req.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be a positive integer or None, got {req.max_tokens}")
        self._check_memory(req, mem_available)
        rt.check_ids(req.prompt)
        n_vocab = rt.n_vocab
        bad = [t for t in (req.params.logit_bias or {}) if not 0 <= int(t) < n_vocab]
        if bad:
            raise InvalidRequestError(f"logit_bias token {bad[0]} is out of range: this model's ids are "
                                      f"0..{n_vocab - 1}")
        bad = [t for t in req.probs_of if not 0 <= int(t) < n_vocab]
        if bad:
            raise InvalidRequestError(f"probs_of token {bad[0]} is out of range: this model's ids are 0..{n_vocab - 1}")
        return Checked(self, req, sched.new_generation(req))

    def _not_ready(self) -> NotReadyError:
        """Why a request cannot run yet: the load failed, or it is still loading."""
        if self.load_error:
            return NotReadyError(self.load_error)
        return NotReadyError(f"the model {self.model_name} is loading", loading=True)

    def _ready_parts(self) -> tuple[Scheduler, Runtime]:
        sched = self._sched
        rt = self.runtime
        if self.encoder and rt is not None:
            from bubo.embed import EncoderOnlyError

            raise EncoderOnlyError(self.model_name, str(rt.hparams.get("arch")))
        if not self.ready or sched is None or rt is None:
            raise self._not_ready()
        return sched, rt

    def submit(self, req: GenerationRequest, *, mem_available: int | None = None,
               checked: Checked | None = None) -> EventStream:
        """Queue a request; returns its EventStream at once. Raises NotReadyError while the
        model loads (or once stopped), ContextLengthError for a prompt that cannot fit,
        InsufficientMemoryError for a KV cache that cannot fit in memory (now, or ever),
        QueueFullError when every slot is busy and queue_size requests already wait,
        InvalidRequestError (a ValueError) for token ids out of range or an empty prompt.
        mem_available (bytes) replaces the machine's available memory figure: a debug hook that
        makes the memory guard's retry path testable. checked: what check(req) gave (it is done
        here otherwise)."""
        if checked is None or checked.engine is not self or checked.req is not req:
            checked = self.check(req, mem_available=mem_available)
        sched = self._ready_parts()[0]
        assert self.n_parallel is not None
        stream = EventStream(req)
        try:
            task = sched.new_task(stream, checked.gen)
        except BaseException:
            stream.cancel()
            raise
        # the scheduler refuses a task once the engine thread has closed it (failing what was
        # queued): a request is either queued before that (and failed) or refused here
        most = None if self.queue_size is None else self.n_parallel + self.queue_size
        refused = "closed" if self._stopping else sched.add(task, most)
        if refused is not None:
            stream.cancel()
            if refused == "full":
                assert self.queue_size is not None
                raise QueueFullError(self.n_parallel, self.queue_size)
            raise NotReadyError(f"the model {self.model_name} is being unloaded")
        with self._lock:
            self._n_open += 1
        stream.on_close(self._stream_closed)
        stream.on_drain(self._signal)
        self._signal()
        return stream

    def _stream_closed(self) -> None:
        with self._lock:
            self._n_open -= 1
        self._signal()  # a paused request's slot is freed at the next step, which must come

    def kv_bytes_needed(self, req: GenerationRequest) -> tuple[int, int]:
        """(tokens, bytes): the tokens the request may put in the cache (prompt + max_tokens,
        capped at the context; the prompt alone without max_tokens) and the KV bytes the cache
        must still take from the OS for them, counting its free and cached blocks as there.
        Read from another thread while the engine runs, it is an estimate."""
        sched, kv = self._sched, self.kv
        if self.n_ctx is None or sched is None or kv is None:
            raise NotReadyError(self.load_error or f"the model {self.model_name} is not loaded")
        n = len(req.prompt) + (req.max_tokens if req.max_tokens is not None else 0)
        n = min(n, self.n_ctx)
        return n, kv.grow_bytes(_spare_seq(sched), n)

    def _check_memory(self, req: GenerationRequest, mem_available: int | None) -> None:
        n, need = self.kv_bytes_needed(req)
        if need == 0:
            return
        ceiling, available = memory_budget(mem_available)
        if ceiling is not None and need > ceiling:
            raise InsufficientMemoryError(need, ceiling, True, n)
        if available is not None and need > available:
            raise InsufficientMemoryError(need, available, False, n)

    def _signal(self) -> None:
        try:
            self._work.release()
        except RuntimeError:
            pass  # already signalled

    # --- introspection (any thread) ----------------------------------------------------

    @property
    def busy(self) -> bool:
        sched = self._sched
        return sched is not None and any(s.task is not None for s in sched.slots)

    def metrics(self) -> EngineMetrics:
        """Counters since start and gauges now (zeros before the model is loaded)."""
        sched, kv = self._sched, self.kv
        if sched is None or kv is None:
            return EngineMetrics()
        c = dict(sched.counters)
        deferred = sched.n_waiting()
        processing = sum(1 for s in sched.slots if s.task is not None)
        used, total = kv.blocks_in_use(), kv.pool_blocks()
        lookups = c.pop("prefix_cache_lookup_tokens_total")
        hits = c.pop("prefix_cache_hit_tokens_total")
        busy_total = c.pop("n_busy_slots_total")
        return EngineMetrics(
            requests_total=int(c["requests_total"]),
            prompt_tokens_total=int(c["prompt_tokens_total"]),
            prompt_tokens_cached_total=int(c["prompt_tokens_cached_total"]),
            prompt_seconds_total=float(c["prompt_seconds_total"]),
            tokens_predicted_total=int(c["tokens_predicted_total"]),
            tokens_predicted_seconds_total=float(c["tokens_predicted_seconds_total"]),
            n_decode_total=int(c["n_decode_total"]),
            n_tokens_max=int(c["n_tokens_max"]),
            n_preemptions_total=int(c["n_preemptions_total"]),
            n_drafted_total=int(c["n_drafted_total"]),
            n_drafted_accepted_total=int(c["n_drafted_accepted_total"]),
            requests_processing=processing,
            requests_deferred=deferred,
            kv_cache_tokens=sum(kv.seq_len(s.id) for s in sched.slots),
            kv_cache_usage_ratio=(used + kv.n_cached_blocks) / total if total else 0.0,
            kv_cache_used_blocks=used,
            kv_cache_cached_blocks=kv.n_cached_blocks,
            prompt_tokens_seconds=(c["prompt_tokens_total"] / c["prompt_seconds_total"]
                                   if c["prompt_seconds_total"] > 0 else 0.0),
            predicted_tokens_seconds=(c["tokens_predicted_total"] / c["tokens_predicted_seconds_total"]
                                      if c["tokens_predicted_seconds_total"] > 0 else 0.0),
            n_busy_slots_per_decode=busy_total / c["n_decode_total"] if c["n_decode_total"] else 0.0,
            prefix_cache_hit_ratio=hits / lookups if lookups else 0.0,
            time_to_first_token_seconds=sched.ttft.snapshot(),
            queue_wait_seconds=sched.queue_wait.snapshot(),
        )

    def cache_view(self) -> CacheView:
        """What the KV cache holds (/debug/cache)."""
        sched, kv = self._sched, self.kv
        if sched is None or kv is None or self.n_ctx is None:
            raise NotReadyError(self.load_error or f"the model {self.model_name} is not loaded")
        out = []
        for s in sched.slots:
            t = s.task
            out.append((s.id, list(t.tokens[: t.n_past]) if t is not None else list(s.held)))
        return CacheView(self.n_ctx, kv.block_size, kv.blocks_in_use(), kv.n_cached_blocks, out)

    def slots(self) -> list[SlotState]:
        """Every slot's state ([] before the model is loaded)."""
        sched = self._sched
        return sched.slot_states() if sched is not None else []


def _model_info(rt: Runtime, n_ctx: int, n_ctx_train: int | None, n_parallel: int) -> ModelInfo:
    md = rt.metadata
    arch = str(md.get("general.architecture", ""))
    tok = rt.tokenizer

    def text_of(i: int | None) -> str:
        return tok.token_text(i).decode("utf-8", "replace") if i is not None else ""

    def num(key: str) -> int | None:
        v = md.get(f"{arch}.{key}")
        return int(v) if isinstance(v, int) else None

    name = md.get("general.name")
    return ModelInfo(path=rt.path, architecture=arch, name=name if isinstance(name, str) else None, n_ctx=n_ctx,
                     n_ctx_train=n_ctx_train, n_vocab=rt.n_vocab, n_embd=num("embedding_length"),
                     n_layer=num("block_count"), n_parallel=n_parallel, chat_template=rt.chat_template_source,
                     bos_token=text_of(tok.bos_id), eos_token=text_of(tok.eos_id))


def _spare_seq(sched: Scheduler) -> int:
    """A sequence id to estimate a new request's growth with: an idle slot's (it holds
    nothing), else the first slot's (its blocks then count as there: an estimate)."""
    for s in sched.slots:
        if s.task is None:
            return s.id
    return 0
