"""serve(ServeOptions): the models' engines, the app, gevent's WSGI server (`bubo serve` fills
the options from its flags: bubo/cli/serve.py).

The HTTP server listens before any model is loaded (each engine loads its model on its own
thread): /health answers at once, /ready says 503 not_ready until the default model is in memory.
With several models (several -m, --models-dir, a preset, or a store holding several) the server
is a router: bubo/api/models_config.py says which models and names, bubo/engine/registry.py
loads, swaps and puts them to sleep."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

from bubo import cpus, store
from bubo.api import http, logs
from bubo.api.config import OLLAMA_PORT, ServerConfig, is_loopback
from bubo.api.models_config import check_model, model_specs, served_name
from bubo.api.openai.stored import FILE_NAME
from bubo.api.options import ServeOptions
from bubo.engine.engine import Engine
from bubo.engine.registry import ModelEntry, ModelStatus, Registry, TooManyAtStartError

say = logs.say
plural = logs.plural

log = logging.getLogger("bubo.serve")


SWITCH_INTERVAL_S = 0.0005

def server_config(args: ServeOptions, default_name: str | None = None) -> ServerConfig:
    """The HTTP settings; the served name and aliases are the default model's (one model: -m's
    name or --served-model-name, and -a)."""
    from bubo.api.auth import KeyFileError, load_keys
    from bubo.webui import check_ui_config

    try:
        keys = load_keys(list(args.api_key), args.api_key_file)
    except KeyFileError as e:
        raise ValueError(f"--api-key-file: {e}") from None
    return ServerConfig(
        served_model_name=default_name or args.served_model_name or served_name(args.model),
        aliases=list(args.alias) if default_name is None else [],
        api_keys=keys.keys,
        caller_names=keys.names,
        caller_max_slots=args.caller_max_slots,
        mcp=not args.no_mcp,
        cors_origins=list(args.cors_origins),
        debug_hooks=args.debug_hooks,
        host=args.host,
        port=args.port,
        slots_enabled=not args.no_slots,
        allow_special_in_content=args.allow_special_in_content,
        sampling_defaults=sampling_defaults(args),
        n_predict=args.n_predict if args.n_predict is not None and args.n_predict > 0 else None,
        webui=not args.no_webui,
        ui_defaults=check_ui_config(args.ui_config) if args.ui_config else {},
        prepare_timeout_s=args.prepare_timeout,
        host_allow=list(args.host_allow),
        allow_copy=args.allow_copy,
        reasoning_format=args.reasoning_format,
        responses_max=args.responses_max,
        slot_save_path=_slot_folder(args.slot_save_path),
        contexts_path=str(store.home() / "contexts"),
        responses_path=str(store.home() / FILE_NAME),
        sign_key=_sign_key(args.sign_key),
    )


def _sign_key(path: str | None) -> str | None:
    """--sign-key, read once here: a key that cannot be used stops serve in one line."""
    if path is None:
        return None
    from bubo.receipts import ReceiptError, Signer

    try:
        Signer(path)
    except ReceiptError as e:
        raise ValueError(f"--sign-key: {e}") from None
    return os.path.abspath(path)


def _slot_folder(path: str | None) -> str | None:
    """--slot-save-path, made if missing; a path that cannot be a writable folder stops serve."""
    if path is None:
        return None
    folder = os.path.abspath(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--slot-save-path {path}: cannot make that folder: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--slot-save-path {path}: the folder is not writable")
    return folder


def sampling_defaults(args: ServeOptions) -> dict[str, Any]:
    """The sampling defaults given (--temp, --top-k, ...: SamplingParams fields), checked: a bad
    value names its flag."""
    from bubo.sampling import SamplingParams

    fields = SamplingParams.__dataclass_fields__
    for name, value in args.sampling.items():
        if name not in fields:
            raise ValueError(f"sampling default {name!r}: not a sampling field (they are {', '.join(fields)})")
        try:
            SamplingParams(**{name: value})
        except (ValueError, TypeError) as e:
            flag = fields[name].metadata["flag"] or name
            raise ValueError(f"{flag} {value}: {e}") from None
    return dict(args.sampling)


def serve(args: ServeOptions) -> int:
    """Serve until SIGTERM or SIGINT (then drain); 1 when the one model cannot load."""
    import gevent

    from bubo.api.app import create_app

    if args.log_verbosity is not None and args.log_verbosity < 0:
        raise ValueError(f"--log-verbosity {args.log_verbosity}: give 0 or more (3: the usual lines, 4: debug)")
    logs.setup(verbose=args.verbose, disabled=args.log_disable, fmt=args.log_format, verbosity=args.log_verbosity)
    # the engine thread, the event loop and the preparation pool's workers share one GIL: a thread
    # that wants it back (the engine after a forward pass, the loop after a socket call) waits
    # for the holder's switch interval, 5 ms by default; at 0.5 ms a request being prepared slows
    # the other clients' streams a little instead of several times over
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    if args.port < 0 or args.port > 65535:
        raise ValueError(f"--port {args.port}: give 0..65535")
    for flag, value, least in (("--parallel", args.parallel, 1), ("--batch-size", args.batch_size, 1),
                               ("--ubatch-size", args.ubatch_size, 1), ("--queue-size", args.queue_size, 0),
                               ("--models-max", args.models_max, 0), ("--max-connections", args.max_connections, 1),
                               ("--responses-max", args.responses_max, 0),
                               ("--caller-max-slots", args.caller_max_slots, 1)):
        if value is not None and value < least:
            raise ValueError(f"{flag} {value}: give at least {least}")
    if args.ctx_size is not None and args.ctx_size < 0:
        raise ValueError(f"-c {args.ctx_size}: give 0 (the trained context) or a positive number of tokens")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"-t {args.threads}: give a positive number of threads")
    if args.threads_batch is not None and args.threads_batch < 1:
        raise ValueError(f"-tb {args.threads_batch}: give a positive number of threads")
    if args.n_predict is not None and (args.n_predict == 0 or args.n_predict < -1):
        raise ValueError(f"-n {args.n_predict}: give a positive number of tokens, or -1 for no limit")
    if args.cache_reuse < 0:
        raise ValueError(f"--cache-reuse {args.cache_reuse}: give 0 or more tokens")
    for note in args.notes:
        log.info("%s", note)
    if args.cache_reuse:
        log.info("--cache-reuse %d: accepted; bubo reuses the longest cached prefix of each prompt (in any slot) and "
                 "computes what follows the first difference again, without shifting cached chunks", args.cache_reuse)
    for flag, seconds in (("--timeout", args.timeout), ("--header-timeout", args.header_timeout),
                          ("--keepalive-timeout", args.keepalive_timeout), ("--prepare-timeout", args.prepare_timeout),
                          ("--write-timeout", args.write_timeout)):
        if not seconds > 0:
            raise ValueError(f"{flag} {seconds}: give a positive number of seconds")
    if not args.drain_timeout >= 0:
        raise ValueError(f"--drain-timeout {args.drain_timeout}: give 0 or more seconds")
    if args.sleep_idle_seconds is not None and args.sleep_idle_seconds <= 0:
        raise ValueError(f"--sleep-idle-seconds {args.sleep_idle_seconds}: give a positive number of seconds")
    if args.debug_hooks and not is_loopback(args.host):
        log.warning("--debug-hooks ignored: %s is not a loopback address", args.host)
    debug = args.debug_hooks and is_loopback(args.host)
    # a debug hook: widen the loading window so tests can see /ready say not_ready
    delay = float(os.environ.get("BUBO_DEBUG_LOAD_DELAY_S", "0") or 0) if debug else 0.0
    # and pin "available now" at load too (BUBO_DEBUG_MEM_AVAILABLE): a cache is then not taken whole
    raw_mem = os.environ.get("BUBO_DEBUG_MEM_AVAILABLE", "").strip() if debug else ""
    specs = model_specs(args, delay, int(raw_mem) if raw_mem.isdigit() else None)
    if len(specs) == 1:
        # one model that cannot load: say why and exit 1, before listening
        check_model(specs[0].source, embedding=args.embedding)
    # the default model: the first one given by -m or defined by the preset; with models found in
    # a folder or the store only, the first that loads (the registry decides)
    named = next((s.name for s in specs if s.origin == "-m" or s.origin.startswith("--models-preset")), None)
    try:
        registry = Registry(specs, models_max=args.models_max, autoload=not args.no_models_autoload,
                            sleep_idle_s=args.sleep_idle_seconds, default=named)
    except TooManyAtStartError as e:
        raise ValueError(f"{e} (--models-max {e.models_max}): raise it, or set load-on-startup = false for "
                         "some") from None
    router = registry.is_router
    if router:
        registry.check_files()  # a broken file shows as failed at once; one model fails its load as always
    config = server_config(args, registry.default.name if router else None)
    if not router:
        config.served_model_name = specs[0].name
        config.aliases = list(specs[0].aliases)
    app = create_app(registry, config)
    fd_limit = http.raise_fd_limit()
    limits = http.Limits(keepalive_s=args.keepalive_timeout, header_s=args.header_timeout, timeout_s=args.timeout,
                         max_connections=http.connection_cap(args.max_connections, fd_limit),
                         write_s=args.write_timeout)
    server = http.Server((args.host, args.port), app, limits=limits, log=None,
                         error_log=logging.getLogger("bubo.http"))
    try:
        server.init_socket()
    except OSError as e:
        raise ValueError(_cannot_listen(args.host, args.port, e)) from None
    host, port = server.address[:2]
    config.port = port
    servers = [server]
    if args.ollama and port != OLLAMA_PORT:
        servers.append(_ollama_listener(server, args.host, app, limits))
    registry.start()
    url = f"http://{host if ':' not in host else '[' + host + ']'}:{port}"
    say(f"listening on {url}", url=url)
    if config.webui:
        say(f"chat page: {url}/ (open it in a browser)", chat_page=f"{url}/")
    for extra in servers[1:]:
        extra.start()
        xhost, xport = extra.address[:2]
        say(f"also listening on http://{xhost if ':' not in xhost else '[' + xhost + ']'}:{xport} (Ollama's port)")
    threads = threads_said(specs[0].settings.n_threads or cpus.usable(), specs[0].settings.n_threads_batch)
    if router:
        say(f"{len(specs)} models (router mode; at most {args.models_max or 'any number of'} loaded "
            f"at once{', loaded on request' if not args.no_models_autoload else ''}): "
            + ", ".join(f"{s.name} ({s.source})" for s in specs))
    else:
        say(f"model {specs[0].source} as '{config.served_model_name}' (also: "
            f"{', '.join(config.model_names[1:])}), loading", model=config.served_model_name)
    ctx = {None: "the trained context, capped by memory", 0: "the trained context"}.get(args.ctx_size, args.ctx_size)
    say(f"{threads}; context {ctx}"
        f"{'; API key required' if config.api_keys else ''}; at most {limits.max_connections} connections")
    routes = sorted({r.rule for r in app.url_map.iter_rules() if r.endpoint != "static"})
    log.debug("routes %s", " ".join(routes))
    say(f"the routes: {url}/openapi.json", docs=f"{url}/openapi.json")
    for entry in registry.entries:
        if entry.status is ModelStatus.FAILED:
            say(f"model {entry.name} cannot be served: {entry.failure}")
    failed: list[str] = []
    watcher = gevent.spawn(_report_loads, registry, None if router else (server, failed))

    drain = Drain(servers, registry, config, args.drain_timeout)
    # the handlers must stay referenced: a collected watcher no longer fires
    handlers = [gevent.signal_handler(sig, drain.signal) for sig in (signal.SIGTERM, signal.SIGINT)]
    if args.api_key_file:
        handlers.append(gevent.signal_handler(signal.SIGHUP, _reload_keys, config, list(args.api_key),
                                              args.api_key_file))
    try:
        server.serve_forever()
    finally:
        for extra in servers[1:]:
            extra.stop(timeout=1)
        watcher.kill(block=False)
        registry.stop()
        for h in handlers:
            h.cancel()
    if failed:
        # one model and it cannot be served: the process must not look healthy (systemd, docker)
        logs.write_line(sys.stderr, f"bubo serve: error: {failed[0]}")
        return 1
    say("stopped")
    return 0


def _reload_keys(config: ServerConfig, given: list[str], path: str) -> None:
    """SIGHUP: --api-key-file read again (a wrong file keeps the keys in force); connections and
    requests in flight go on."""
    from bubo.api.auth import Keys, reload

    keys = reload(Keys(config.api_keys, config.caller_names), given, path)
    config.api_keys, config.caller_names = keys.keys, keys.names


def _cannot_listen(host: str, port: int, e: OSError) -> str:
    """Why the server cannot listen, in one line, with what to do."""
    import errno

    if e.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use (another bubo serve, or another server?): stop that one, "
                f"or give another port with --port N (--port 0 picks a free one)")
    if e.errno == errno.EACCES:
        return f"no permission to listen on port {port}: ports below 1024 need root; give --port 8080 or above"
    if e.errno == errno.EADDRNOTAVAIL:
        return (f"cannot listen on {host}: no network interface here has that address (--host 127.0.0.1, or "
                "0.0.0.0 for every interface)")
    return f"cannot listen on {host}:{port}: {e.strerror or e}"


def _ollama_listener(first: http.Server, host: str, app: Any, limits: http.Limits) -> http.Server:
    """The same app on Ollama's port (serve --ollama), for clients that assume it."""
    extra = http.Server((host, OLLAMA_PORT), app, limits=limits, log=None, error_log=logging.getLogger("bubo.http"))
    extra.conns = first.conns  # one registry of connections: --max-connections caps both listeners together
    try:
        extra.init_socket()
    except OSError as e:
        raise ValueError(f"--ollama: cannot listen on {host}:{OLLAMA_PORT} ({e.strerror or e}); is Ollama itself "
                         "running there? Stop it, or leave --ollama out and point the client at --port") from None
    return extra


class Drain:
    """SIGTERM or SIGINT: stop accepting, let the requests in flight finish for up to timeout_s
    (new requests on open connections get 503 shutting_down), then end what is left with an error
    event in each dialect's stream shape (the engines stop: Reason.SHUTTING_DOWN) and stop. A second
    signal skips the wait."""

    FLUSH_S = 2.0  # how long the ended streams get to write their last events

    def __init__(self, servers: list[http.Server], registry: Registry, config: ServerConfig, timeout_s: float):
        self.servers = servers  # the first one's serve_forever runs the process; the others were started
        self.registry = registry
        self.config = config
        self.timeout_s = timeout_s
        self.phase = "serving"

    def signal(self) -> None:
        import gevent

        if self.phase == "serving":
            self.phase = "draining"
            gevent.spawn(self._drain)
        elif self.phase == "draining":
            self.phase = "ending"
            say("second signal: ending the requests in flight now")

    def _busy(self) -> int:
        # a request still arriving counts: it gets its answer (503 shutting_down) when it is in
        return sum(1 for c in self.servers[0].conns.values() if c.phase != http.IDLE)

    def _drop_idle(self) -> None:
        for h, c in list(self.servers[0].conns.items()):  # every listener's (they share the registry)
            if c.phase == http.IDLE:
                h.drop()

    def _drain(self) -> None:
        import time

        import gevent

        self.config.draining = True
        for s in self.servers:
            s.stop_accepting()  # no new connections (serve_forever goes on until stop) ...
            s.socket.close()  # ... and none waiting in the backlog: a new client is refused at once
        say(f"draining: {plural(self._busy(), 'request')} in flight, up to {self.timeout_s:g} s")
        deadline = time.monotonic() + self.timeout_s
        while self._busy() and self.phase == "draining" and time.monotonic() < deadline:
            self._drop_idle()
            gevent.sleep(0.05)
        left = self._busy()
        if left:
            say(f"ending {plural(left, 'request')} in flight")
        self.registry.stop()  # the engines end what is left: an error event in every stream
        deadline = time.monotonic() + self.FLUSH_S
        while self._busy() and time.monotonic() < deadline:
            gevent.sleep(0.05)
        say("stopping")
        for s in reversed(self.servers):
            s.stop(timeout=1)


def _report_loads(registry: Registry, single: tuple[http.Server, list[str]] | None) -> None:
    """Say each load's outcome (the first one as `ready:`, as with one model). One model
    (`single`: the server and a list for the failure) that fails to load stops the server: the
    failure is put in the list and serve() exits 1."""
    import gevent

    seen: dict[str, tuple[ModelStatus, int]] = {}
    while True:
        for e in registry.entries:
            now = (e.status, e.n_loads)
            if seen.get(e.name) != now:
                seen[e.name] = now
                if single is not None and e.status is ModelStatus.FAILED:
                    server, failed = single
                    failed.append(f"the model {e.name} cannot be served: {e.failure}")
                    server.stop(timeout=1)
                    return
                _report(e, registry.is_router)
                if e.status is ModelStatus.LOADED:
                    _freeze_heap()
        gevent.sleep(0.1)


def _freeze_heap() -> None:
    """What a loaded model put on the heap (its vocabulary's tables, its template) lives as long as
    it does: out of the garbage collector's sight (gc.freeze), a full collection, which holds the
    GIL from start to end, walks only what requests made since (the heap of a loaded model made
    one take over 100 ms: the event loop stood still for as long)."""
    import gc

    gc.collect()
    gc.freeze()


def threads_said(n: int, n_batch: int | None) -> str:
    """"1 thread", "4 threads", "2 threads (4 for prompts)" (-t, and -tb when it differs)."""
    return plural(n, "thread") + (f" ({n_batch} for prompts)" if n_batch and n_batch != n else "")


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _cache_types(eng: Engine) -> str:
    """" (K q8_0, V q4_0)" for a cache that is not f16 throughout."""
    k, v = eng.cache_type_k, eng.cache_type_v
    return "" if k == v == "f16" else f" (K {k}, V {v})"


def _report(e: ModelEntry, router: bool) -> None:
    eng = e.engine
    who = f" {e.name}" if router else ""
    if e.status is ModelStatus.LOADED and eng is not None and eng.encoder:
        took = f" in {eng.load_s:.1f} s" if eng.load_s is not None else ""
        arch = eng.runtime.hparams.get("arch") if eng.runtime is not None else "?"
        say(f"ready{who}: {eng.model_path}{took}; weights {_mib(eng.weights_bytes)}; an embedding model ({arch}): "
            f"inputs of up to {eng.n_ctx} tokens; {threads_said(eng.n_threads, eng.n_threads_batch)}",
            model=e.name, load_s=eng.load_s,
            weights_bytes=eng.weights_bytes, n_ctx=eng.n_ctx, n_threads=eng.n_threads, embedding=True)
    elif e.status is ModelStatus.LOADED and eng is not None:
        took = f" in {eng.load_s:.1f} s" if eng.load_s is not None else ""
        d = eng.draft
        requant = f", weights as {d.requant}" if d is not None and d.requant else ""
        drafts = (f"; drafts by {d.model} ({_mib(eng.draft_weights_bytes)}{requant})"
                  if d is not None and d.model is not None else "; drafts by prompt lookup" if d is not None else "")
        say(f"ready{who}: {eng.model_path}{took}; weights {_mib(eng.weights_bytes)}, "
            f"KV cache {_mib(eng.kv_bytes)}{_cache_types(eng)}{drafts}; "
            f"context {eng.n_ctx} tokens (trained {eng.n_ctx_train}) shared by {plural(eng.n_parallel or 1, 'slot')}; "
            f"{threads_said(eng.n_threads, eng.n_threads_batch)}", model=e.name, load_s=eng.load_s,
            weights_bytes=eng.weights_bytes, kv_bytes=eng.kv_bytes, n_ctx=eng.n_ctx, n_parallel=eng.n_parallel,
            n_threads=eng.n_threads, n_threads_batch=eng.n_threads_batch)
    elif e.status is ModelStatus.FAILED and eng is not None:
        say(f"the model{who} failed to load: {e.failure}")
    elif router and e.status in (ModelStatus.SLEEPING, ModelStatus.UNLOADED) and e.n_loads:
        say(f"model {e.name} {e.status.value}")
