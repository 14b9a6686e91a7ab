"""`python -m bubo serve`: the models' engines, the app, gevent's WSGI server.

The HTTP server listens before any model is loaded (each engine loads its model on its own
thread): /health answers at once, /ready says 503 not_ready until the default model is in memory.
With several models (several -m, --models-dir, a preset, or a store holding several) the server
is a router: bubo/api/models_config.py says which models and names, bubo/engine/registry.py
loads, swaps and puts them to sleep."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from bubo.api import http
from bubo.api.config import ServerConfig, is_loopback
from bubo.api.models_config import model_specs, served_name
from bubo.engine.registry import ModelEntry, ModelStatus, Registry

log = logging.getLogger("bubo.serve")


# kept for callers of the old name
_served_name = served_name


def config_from_args(args: argparse.Namespace, default_name: str | None = None) -> ServerConfig:
    """The HTTP settings; the served name and aliases are the default model's (one model: -m's
    name or --served-model-name, and -a)."""
    from bubo.api.auth import load_key_file
    from bubo.cli import _csv

    keys = _csv(args.api_key)
    if args.api_key_file:
        keys += load_key_file(args.api_key_file)
    return ServerConfig(
        served_model_name=default_name or args.served_model_name or served_name(args.model),
        aliases=_csv(args.alias) if default_name is None else [],
        api_keys=keys,
        cors_origins=_csv(args.cors_origins),
        debug_hooks=args.debug_hooks,
        host=args.host,
        port=args.port,
        slots_enabled=not args.no_slots,
        allow_special_in_content=args.allow_special_in_content,
    )


def requested_models(args: argparse.Namespace) -> list[str]:
    """The -m models (BUBO_ARG_MODEL counts as one -m)."""
    if args.models:
        return list(args.models)
    return [args.model] if os.environ.get("BUBO_ARG_MODEL") else []


def serve(args: argparse.Namespace) -> int:
    import gevent

    from bubo.api.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    if args.port < 0 or args.port > 65535:
        raise ValueError(f"--port {args.port}: give 0..65535")
    for flag, value, least in (("--parallel", args.parallel, 1), ("--batch-size", args.batch_size, 1),
                               ("--ubatch-size", args.ubatch_size, 1), ("--queue-size", args.queue_size, 0),
                               ("--models-max", args.models_max, 0), ("--max-connections", args.max_connections, 1)):
        if value is not None and value < least:
            raise ValueError(f"{flag} {value}: give at least {least}")
    for flag, seconds in (("--timeout", args.timeout), ("--header-timeout", args.header_timeout),
                          ("--keepalive-timeout", args.keepalive_timeout)):
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
    args.models = requested_models(args)
    specs = model_specs(args, delay)
    registry = Registry(specs, models_max=args.models_max, autoload=not args.no_models_autoload,
                        sleep_idle_s=args.sleep_idle_seconds)
    router = registry.is_router
    if router:
        registry.check_files()  # a broken file shows as failed at once; one model fails its load as always
    config = config_from_args(args, specs[0].name if router else None)
    if not router:
        config.served_model_name = specs[0].name
        config.aliases = list(specs[0].aliases)
    app = create_app(registry, config)
    fd_limit = http.raise_fd_limit()
    limits = http.Limits(keepalive_s=args.keepalive_timeout, header_s=args.header_timeout, timeout_s=args.timeout,
                         max_connections=http.connection_cap(args.max_connections, fd_limit))
    server = http.Server((args.host, args.port), app, limits=limits, log=None,
                         error_log=logging.getLogger("bubo.http"))
    server.init_socket()
    host, port = server.address[:2]
    config.port = port
    registry.start()
    url = f"http://{host if ':' not in host else '[' + host + ']'}:{port}"
    print(f"bubo serve: listening on {url}", flush=True)
    threads = specs[0].settings.n_threads or os.cpu_count() or 1
    if router:
        print(f"bubo serve: {len(specs)} models (router mode; at most {args.models_max or 'any number of'} loaded "
              f"at once{', loaded on request' if not args.no_models_autoload else ''}): "
              + ", ".join(f"{s.name} ({s.source})" for s in specs), flush=True)
    else:
        print(f"bubo serve: model {specs[0].source} as '{config.served_model_name}' (also: "
              f"{', '.join(config.model_names[1:])}), loading", flush=True)
    print(f"bubo serve: threads {threads}; context "
          f"{args.ctx_size if args.ctx_size else 'the trained context, capped by memory'}"
          f"{'; API key required' if config.api_keys else ''}; at most {limits.max_connections} connections",
          flush=True)
    routes = sorted({r.rule for r in app.url_map.iter_rules() if r.endpoint != "static"})
    print("bubo serve: routes " + " ".join(routes), flush=True)
    for entry in registry.entries:
        if entry.status is ModelStatus.FAILED:
            print(f"bubo serve: model {entry.name} cannot be served: {entry.failure}", flush=True)
    watcher = gevent.spawn(_report_loads, registry)

    drain = Drain(server, registry, config, args.drain_timeout)
    # the handlers must stay referenced: a collected watcher no longer fires
    handlers = [gevent.signal_handler(sig, drain.signal) for sig in (signal.SIGTERM, signal.SIGINT)]
    try:
        server.serve_forever()
    finally:
        watcher.kill(block=False)
        registry.stop()
        for h in handlers:
            h.cancel()
    print("bubo serve: stopped", flush=True)
    return 0


class Drain:
    """SIGTERM or SIGINT: stop accepting, let the requests in flight finish for up to timeout_s
    (new requests on open connections get 503 shutting_down), then end what is left with an error
    event in each dialect's stream shape (the engines stop: Reason.SHUTTING_DOWN) and stop. A second
    signal skips the wait."""

    FLUSH_S = 2.0  # how long the ended streams get to write their last events

    def __init__(self, server: http.Server, registry: Registry, config: ServerConfig, timeout_s: float):
        self.server = server
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
            print("bubo serve: second signal: ending the requests in flight now", flush=True)

    def _busy(self) -> int:
        # a request still arriving counts: it gets its answer (503 shutting_down) when it is in
        return sum(1 for c in self.server.conns.values() if c.phase != http.IDLE)

    def _drop_idle(self) -> None:
        for h, c in list(self.server.conns.items()):
            if c.phase == http.IDLE:
                h.drop()

    def _drain(self) -> None:
        import time

        import gevent

        self.config.draining = True
        self.server.stop_accepting()  # no new connections (serve_forever goes on until stop) ...
        self.server.socket.close()  # ... and none waiting in the backlog: a new client is refused at once
        print(f"bubo serve: draining: {self._busy()} requests in flight, up to {self.timeout_s:g} s", flush=True)
        deadline = time.monotonic() + self.timeout_s
        while self._busy() and self.phase == "draining" and time.monotonic() < deadline:
            self._drop_idle()
            gevent.sleep(0.05)
        left = self._busy()
        if left:
            print(f"bubo serve: ending {left} requests in flight", flush=True)
        self.registry.stop()  # the engines end what is left: an error event in every stream
        deadline = time.monotonic() + self.FLUSH_S
        while self._busy() and time.monotonic() < deadline:
            gevent.sleep(0.05)
        print("bubo serve: stopping", flush=True)
        self.server.stop(timeout=1)


def _report_loads(registry: Registry) -> None:
    """Print each load's outcome (the first one as `ready:`, as with one model)."""
    import gevent

    seen: dict[str, tuple[ModelStatus, int]] = {}
    while True:
        for e in registry.entries:
            now = (e.status, e.n_loads)
            if seen.get(e.name) != now:
                seen[e.name] = now
                _report(e, registry.is_router)
        gevent.sleep(0.1)


def _report(e: ModelEntry, router: bool) -> None:
    eng = e.engine
    who = f" {e.name}" if router else ""
    if e.status is ModelStatus.LOADED and eng is not None:
        print(f"bubo serve: ready{who}: {eng.model_path}, context {eng.n_ctx} tokens "
              f"(trained {eng.n_ctx_train}) shared by {eng.n_parallel} slots", flush=True)
    elif e.status is ModelStatus.FAILED and eng is not None:
        print(f"bubo serve: the model{who} failed to load: {e.failure}", flush=True)
    elif router and e.status in (ModelStatus.SLEEPING, ModelStatus.UNLOADED) and e.n_loads:
        print(f"bubo serve: model {e.name} {e.status.value}", flush=True)
