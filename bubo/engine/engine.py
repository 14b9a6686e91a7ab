"""The engine: one OS thread that owns the model and runs requests, one at a time, in its slot.

    engine = Engine("smollm2:135m", n_ctx=2048)
    engine.start()                      # loads on the engine thread; returns at once
    stream = engine.submit(GenerationRequest(prompt=ids, max_tokens=16))
    for event in stream:                # in a greenlet: waiting never blocks the gevent hub
        ...                             # TokenEvent ... then one FinishEvent or ErrorEvent

Only the engine thread calls decode (native code, GIL released), so health, metrics and
tokenize answers stay fast while a long prompt runs. Requests wait their turn in a FIFO queue;
the slot's KV cache keeps the last prompt and its answer, and the next request reuses the
prefix it shares with them. The thread wakes a waiting greenlet through a libev/libuv async
watcher of that greenlet's hub (thread-safe to send), never by blocking the hub.

The memory guard: the slot's KV cache is reserved for the whole context but taken from the OS
only as it fills (bubo._model.KVCache), so a context larger than memory is allowed and each
request is checked before it is queued. The KV bytes it needs beyond what the cache already took
(prompt + max_tokens, capped at the context) are compared with what the machine can give: more
than its total memory less what this process holds can never fit (InsufficientMemoryError,
permanent: 507); more than is available now less a safety margin must wait (503, retry). A
request without max_tokens is admitted for its prompt; its answer ends with finish "length" when
the cache would have to grow past the memory available, rather than invite the OOM killer.

The thread and its locks are the unpatched ones (gevent.monkey.get_original), so the engine
stays a real thread even in a monkey-patched process.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Any

import gevent
import gevent.event
from gevent.monkey import get_original

from bubo.engine.types import (ContextLengthError, ErrorEvent, Event, FinishEvent, GenerationRequest,
                               InsufficientMemoryError, NotReadyError, TokenEvent)

log = logging.getLogger("bubo.engine")

_start_new_thread, _allocate_lock, _get_ident = get_original(
    "_thread", ["start_new_thread", "allocate_lock", "get_ident"])

# the KV cache may take at most this share of the memory available at start when -c is not given
KV_MEMORY_SHARE = 0.5
KV_BYTES_PER_VALUE = 2  # the cache is f16
# memory the guard leaves to everything else (page cache, other processes, this one's buffers)
MEM_SAFETY_MARGIN = 512 * 1024 * 1024


class EventStream:
    """The events of one request. Iterate it in the greenlet (or thread) that submitted it.

    cancel() (or killing the greenlet that waits on it) ends it: the engine stops the request
    at its next step and frees the slot; iteration then stops without a final event. Read a
    stream to its final event or cancel it: until then it holds a watcher in the reader's hub."""

    def __init__(self, request: GenerationRequest):
        self.request = request
        self._lock = _allocate_lock()
        self._events: collections.deque[Event] = collections.deque()
        self._cancelled = False
        self._done = False  # a final event was taken by the reader
        self._closed = False  # the watcher is gone: the engine must not send any more
        self._hub = gevent.get_hub()
        self._wake = gevent.event.Event()
        self._watcher = self._hub.loop.async_()
        self._watcher.start(self._wake.set)

    # --- the engine's side (engine thread) ---------------------------------------------

    def _push(self, event: Event) -> None:
        with self._lock:
            if self._closed:
                return
            self._events.append(event)
            self._watcher.send()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    # --- the reader's side -------------------------------------------------------------

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        try:
            while True:
                if self._done or self._cancelled:
                    raise StopIteration
                self._wake.clear()
                with self._lock:
                    event = self._events.popleft() if self._events else None
                if event is not None:
                    if not isinstance(event, TokenEvent):
                        self._done = True
                        self._close()
                    return event
                self._wake.wait()
        except StopIteration:
            raise
        except BaseException:
            # the reader was killed (GreenletExit: its client went away) or interrupted
            self.cancel()
            raise

    def cancel(self) -> None:
        """Stop the request: the engine frees the slot at its next step. Idempotent."""
        if self._done:
            return
        self._cancelled = True
        self._close()
        if _get_ident() == self._hub.thread_ident:
            self._wake.set()  # a reader waiting in another greenlet stops now

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # the watcher belongs to the reader's hub: close it from the reader's thread only
        if _get_ident() == self._hub.thread_ident:
            self._watcher.stop()
            self._watcher.close()


class Engine:
    """One model, one slot, one engine thread. See the module docstring."""

    def __init__(self, model: str, *, n_ctx: int | None = None, n_threads: int | None = None,
                 chat_template: str | None = None, load_delay_s: float = 0.0):
        if n_ctx is not None and n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        if n_threads is not None and n_threads <= 0:
            raise ValueError(f"n_threads must be positive, got {n_threads}")
        self.model_name = str(model)
        self._chat_template_override = chat_template  # replaces the GGUF's tokenizer.chat_template
        self.model_path: str | None = None
        self.n_ctx: int | None = None
        self.n_ctx_train: int | None = None
        self.n_threads = n_threads or os.cpu_count() or 1
        self.tokenizer: Any = None
        self.chat_template: str | None = None
        self.metadata: dict[str, Any] = {}
        self.model: Any = None  # bubo.Model, once ready
        self.ready = False
        self.load_error: str | None = None
        self._n_ctx_requested = n_ctx
        self._load_delay_s = load_delay_s  # a debug hook: makes the loading window observable
        self._lock = _allocate_lock()  # guards _queue
        self._work = _allocate_lock()  # released = "there is work"; the engine thread acquires it
        self._work.acquire()
        self._queue: collections.deque[EventStream] = collections.deque()
        self._current: EventStream | None = None
        self._started = False
        self._stopping = False
        self._slot = {"n_prompt_tokens": 0, "n_prompt_tokens_processed": 0, "n_prompt_tokens_cache": 0,
                      "n_decoded": 0, "n_remain": -1, "id_task": -1}
        self._n_task = 0
        self._counters = dict(
            requests_total=0, prompt_tokens_total=0, prompt_tokens_cached_total=0, prompt_seconds_total=0.0,
            tokens_predicted_total=0, tokens_predicted_seconds_total=0.0, n_decode_total=0,
            n_tokens_max=0,
        )

    # --- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        """Load the model on the engine thread and serve requests there; returns at once."""
        if self._started:
            raise RuntimeError("the engine is already started")
        self._started = True
        _start_new_thread(self._main, ())

    def stop(self) -> None:
        """Ask the engine thread to end after the current step."""
        self._stopping = True
        self._signal()

    def _main(self) -> None:
        try:
            self._load()
        except BaseException as e:  # noqa: BLE001 - reported by /ready, logged
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("loading %s failed: %s", self.model_name, self.load_error)
            return
        self.ready = True
        log.info("model ready: %s (context %d tokens, %d threads)", self.model_name, self.n_ctx, self.n_threads)
        while not self._stopping:
            stream = self._next()
            if stream is None:
                continue
            self._current = stream
            try:
                self._run(stream)
            except MemoryError as e:
                # the cache could not grow (the guard's figures went stale): the slot was cleared
                log.warning("request ran out of memory: %s", e)
                stream._push(ErrorEvent(503, "insufficient_memory", f"out of memory: {e}"))
            except Exception as e:  # noqa: BLE001 - one request failed; the engine goes on
                log.exception("request failed")
                stream._push(ErrorEvent(500, "internal_error", f"generation failed: {type(e).__name__}: {e}"))
            finally:
                self._current = None

    def _load(self) -> None:
        from bubo import store
        from bubo.gguf import GGUFFile
        from bubo.llm import Model

        if self._load_delay_s > 0:
            time.sleep(self._load_delay_s)
        path = store.resolve(self.model_name)
        with GGUFFile(path) as f:
            md = f.metadata
        self.n_ctx_train, self.n_ctx = _context_size(md, self._n_ctx_requested)
        model = Model(path, n_ctx=self.n_ctx, n_threads=self.n_threads,
                      chat_template=self._chat_template_override)
        if self.n_ctx > model.n_ctx:
            # bubo.Model stops at the trained context; a server honours -c past it, as
            # llama-server does (quality past the trained length is the user's call). The cache
            # costs address space only until it fills, so the one Model made is simply replaced.
            from bubo._model import KVCache

            log.warning("context %d is larger than the trained context %s", self.n_ctx, self.n_ctx_train)
            model._kv = KVCache(model._native, self.n_ctx, swa_full=False)
            model.n_ctx = self.n_ctx
        self.model_path = str(path)
        self.metadata = model.metadata
        self.tokenizer = model.tokenizer
        tmpl = self._chat_template_override or md.get("tokenizer.chat_template")
        self.chat_template = tmpl if isinstance(tmpl, str) else None
        self.n_ctx = model.n_ctx
        self.model = model

    # --- requests ----------------------------------------------------------------------

    def submit(self, req: GenerationRequest, *, mem_available: int | None = None) -> EventStream:
        """Queue a request; returns its EventStream at once. Raises NotReadyError while the
        model loads, ContextLengthError for a prompt that cannot fit, InsufficientMemoryError
        for a KV cache that cannot fit in memory (now, or ever), ValueError for token ids out
        of range or an empty prompt. mem_available (bytes) replaces the machine's available
        memory figure: a debug hook that makes the 503 path testable."""
        if not self.ready:
            raise NotReadyError(self.load_error or f"the model {self.model_name} is loading")
        if not req.prompt:
            raise ValueError("the prompt is empty")
        assert self.n_ctx is not None
        if len(req.prompt) >= self.n_ctx:
            raise ContextLengthError(len(req.prompt), self.n_ctx)
        if req.max_tokens is not None and req.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer or None, got {req.max_tokens}")
        self._check_memory(req, mem_available)
        self.model._check_ids(req.prompt)
        n_vocab = self.tokenizer.n_vocab
        bad = [t for t in (req.params.logit_bias or {}) if not 0 <= int(t) < n_vocab]
        if bad:
            raise ValueError(f"logit_bias token {bad[0]} is out of range: this model's ids are 0..{n_vocab - 1}")
        stream = EventStream(req)
        with self._lock:
            self._queue.append(stream)
        self._signal()
        return stream

    def kv_bytes_needed(self, req: GenerationRequest) -> tuple[int, int]:
        """(tokens, bytes): the tokens the request may put in the slot's cache (prompt +
        max_tokens, capped at the context; the prompt alone without max_tokens) and the KV bytes
        the cache must still take from the OS for them. Read from another thread while the
        engine runs, it is an estimate: the slot may hold a little more or less by then."""
        assert self.n_ctx is not None
        n = len(req.prompt) + (req.max_tokens if req.max_tokens is not None else 0)
        n = min(n, self.n_ctx)
        return n, self.model._kv.grow_bytes(0, n)

    def _check_memory(self, req: GenerationRequest, mem_available: int | None) -> None:
        n, need = self.kv_bytes_needed(req)
        if need == 0:
            return
        ceiling, available = memory_budget(mem_available)
        if ceiling is not None and need > ceiling:
            raise InsufficientMemoryError(need, ceiling, True, n)
        if available is not None and need > available:
            raise InsufficientMemoryError(need, available, False, n)

    def _out_of_memory(self, n_tokens: int) -> bool:
        """The cache would have to grow for n_tokens and the memory available now is short."""
        need = self.model._kv.grow_bytes(0, n_tokens)
        if need == 0:
            return False
        available = memory_budget(None)[1]
        return available is not None and need > available

    def _signal(self) -> None:
        try:
            self._work.release()
        except RuntimeError:
            pass  # already signalled

    def _next(self) -> EventStream | None:
        while True:
            with self._lock:
                while self._queue:
                    stream = self._queue.popleft()
                    if not stream.cancelled:
                        return stream
            if self._stopping:
                return None
            self._work.acquire()

    def _run(self, stream: EventStream) -> None:
        from bubo.llm import StopMatcher, _Run

        req = stream.request
        m = self.model
        tok = self.tokenizer
        t0 = time.perf_counter()
        params = req.params if req.params.n_probs == req.n_probs else req.params.replace(n_probs=req.n_probs)
        if not req.cache_prompt:
            m._kv.truncate(0, 0)
            m._kv_tokens.clear()
        self._n_task += 1
        slot = self._slot
        slot.update(id_task=self._n_task, n_prompt_tokens=len(req.prompt), n_prompt_tokens_processed=0,
                    n_prompt_tokens_cache=0, n_decoded=0,
                    n_remain=req.max_tokens if req.max_tokens is not None else -1)
        run = _Run(m, list(req.prompt), req.max_tokens, StopMatcher(req.stop), params)
        logits = run._prefill(interrupt=lambda: stream.cancelled)
        n_cached = run.n_cached
        n_prompt = len(req.prompt) - n_cached
        slot.update(n_prompt_tokens_cache=n_cached, n_prompt_tokens_processed=n_prompt)
        c = self._counters
        c["requests_total"] += 1
        c["prompt_tokens_cached_total"] += n_cached
        c["n_decode_total"] += -(-max(n_prompt - 1, 0) // _prefill_chunk()) + 1
        if logits is None:
            return  # cancelled during the prompt
        t1 = time.perf_counter()
        c["prompt_tokens_total"] += n_prompt
        c["prompt_seconds_total"] += t1 - t0
        detok = tok.detokenizer()
        matcher = run.matcher
        reason: str | None = None
        n_gen = 0
        try:
            while True:
                if stream.cancelled:
                    return
                token, logprob, top = run.sampler.sample(logits)
                run.sampler.accept(token)
                run.generated.append(token)
                n_gen += 1
                slot["n_decoded"] = n_gen
                if req.max_tokens is not None:
                    slot["n_remain"] = req.max_tokens - n_gen
                if tok.is_eog(token):
                    text = matcher.feed(detok.flush()) + matcher.flush()
                    reason = "stop"
                else:
                    text = matcher.feed(detok.feed(token))
                    out_of_room = ((req.max_tokens is not None and n_gen >= req.max_tokens)
                                   or len(m._kv_tokens) >= m.n_ctx
                                   or self._out_of_memory(len(m._kv_tokens) + 1))
                    if matcher.stopped is None and out_of_room:
                        text += matcher.feed(detok.flush())
                        text += matcher.flush()
                        reason = "length"
                    if matcher.stopped is not None:
                        reason = "stop"
                stream._push(TokenEvent(int(token), text, float(logprob), [(int(t), float(p)) for t, p in top]))
                if reason is not None:
                    break
                logits = run._decode([token], len(m._kv_tokens), True)
                c["n_decode_total"] += 1
        finally:
            dt = time.perf_counter() - t1
            c["tokens_predicted_total"] += n_gen
            c["tokens_predicted_seconds_total"] += dt
            c["n_tokens_max"] = max(c["n_tokens_max"], len(m._kv_tokens))
        prompt_ms = (t1 - t0) * 1e3
        predicted_ms = dt * 1e3
        timings = {
            "cache_n": n_cached,
            "prompt_n": n_prompt,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
            "prompt_per_second": n_prompt / (t1 - t0) if n_prompt and t1 > t0 else 0.0,
            "predicted_n": n_gen,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n_gen if n_gen else 0.0,
            "predicted_per_second": n_gen / dt if n_gen and dt > 0 else 0.0,
        }
        stream._push(FinishEvent(reason, matcher.stopped, len(req.prompt), n_cached, n_gen, timings))

    # --- introspection (any thread) ----------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._current is not None

    def metrics(self) -> dict[str, Any]:
        """Counters since start (llama-server's metric names, without the llamacpp: prefix)."""
        c = dict(self._counters)
        with self._lock:
            deferred = sum(1 for s in self._queue if not s.cancelled)
        n_kv = len(self.model._kv_tokens) if self.model is not None else 0
        c.update(
            requests_processing=1 if self.busy else 0,
            requests_deferred=deferred,
            kv_cache_tokens=n_kv,
            kv_cache_usage_ratio=n_kv / self.n_ctx if self.n_ctx else 0.0,
            prompt_tokens_seconds=(c["prompt_tokens_total"] / c["prompt_seconds_total"]
                                   if c["prompt_seconds_total"] > 0 else 0.0),
            predicted_tokens_seconds=(c["tokens_predicted_total"] / c["tokens_predicted_seconds_total"]
                                      if c["tokens_predicted_seconds_total"] > 0 else 0.0),
            n_busy_slots_per_decode=1.0 if c["n_decode_total"] else 0.0,
            n_drafted_total=0, n_drafted_accepted_total=0,  # no speculative decoding yet
        )
        return c

    def slots(self) -> list[dict[str, Any]]:
        """The one slot, as llama-server's /slots shows it."""
        processing = self.busy
        s = dict(self._slot)
        n_kv = len(self.model._kv_tokens) if self.model is not None else 0
        return [{
            "id": 0,
            "n_ctx": self.n_ctx,
            "is_processing": processing,
            "state": 1 if processing else 0,
            "id_task": s["id_task"],
            "n_prompt_tokens": s["n_prompt_tokens"],
            "n_prompt_tokens_processed": s["n_prompt_tokens_processed"],
            "n_prompt_tokens_cache": s["n_prompt_tokens_cache"],
            "cache_n": n_kv,
            "next_token": {"has_next_token": processing, "n_decoded": s["n_decoded"], "n_remain": s["n_remain"]},
        }]


def _prefill_chunk() -> int:
    from bubo.llm import PREFILL_CHUNK

    return PREFILL_CHUNK


def _context_size(md: dict[str, Any], requested: int | None) -> tuple[int | None, int]:
    """(trained context, context to use): the request if given (even past the trained one, as
    llama-server allows; memory is checked per request), else the trained context capped so the
    f16 KV cache takes at most KV_MEMORY_SHARE of the memory available now."""
    arch = md.get("general.architecture", "")
    train = md.get(f"{arch}.context_length")
    train = int(train) if isinstance(train, int) and train > 0 else None
    if requested is not None:
        return train, requested
    n_ctx = train or 4096
    n_layer = int(md.get(f"{arch}.block_count") or 0)
    n_head = int(md.get(f"{arch}.attention.head_count") or 0)
    n_head_kv = md.get(f"{arch}.attention.head_count_kv") or n_head
    n_head_kv = int(n_head_kv if isinstance(n_head_kv, int) else max(n_head_kv))
    head_dim = md.get(f"{arch}.attention.key_length") or (
        int(md.get(f"{arch}.embedding_length") or 0) // n_head if n_head else 0)
    per_token = 2 * n_layer * n_head_kv * int(head_dim) * KV_BYTES_PER_VALUE
    avail = _available_memory()
    if per_token > 0 and avail:
        fit = int(avail * KV_MEMORY_SHARE) // per_token
        n_ctx = max(min(n_ctx, fit // 256 * 256), 256)
    return train, n_ctx


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes ({} where there is none)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def _cgroup_limit() -> tuple[int, int] | None:
    """(memory.max, memory.current) of this process's cgroup v2, when it has a limit."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return (int(limit), current) if limit.isdigit() else None


def _rss() -> int:
    """Bytes this process holds in memory now."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def memory_budget(available_override: int | None = None) -> tuple[int | None, int | None]:
    """(ceiling, available) in bytes for new KV cache: ceiling is the machine's total memory (or
    its cgroup's limit, the smaller) less what this process holds, the most a request could ever
    get; available is what the machine has free now (MemAvailable, or the cgroup's headroom) less
    MEM_SAFETY_MARGIN. available_override replaces the free figure (a debug hook). None: unknown."""
    info = _meminfo()
    total = info.get("MemTotal")
    if total is None:
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            total = None
    free = available_override if available_override is not None else _available_memory()
    cg = _cgroup_limit()
    if cg is not None:
        limit, current = cg
        total = min(total, limit) if total is not None else limit
        if available_override is None:
            free = min(free, limit - current) if free is not None else limit - current
    ceiling = max(total - _rss(), 0) if total is not None else None
    available = max(free - MEM_SAFETY_MARGIN, 0) if free is not None else None
    return ceiling, available


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
