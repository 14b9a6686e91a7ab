"""`python -m bubo serve`: the engine thread, the app, gevent's WSGI server.

The HTTP server listens before the model is loaded (the engine loads it on its own thread):
/health answers at once, /ready says 503 not_ready until the model is in memory."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from typing import Any

from gevent import pywsgi

from bubo.api.config import ServerConfig, is_loopback

log = logging.getLogger("bubo.serve")


class _Handler(pywsgi.WSGIHandler):
    """Hands the client socket to the app (environ["bubo.socket"]) so that an SSE response can
    see the client leave (EOF) without waiting for its next write to fail."""

    def handle(self) -> None:
        # pywsgi writes the headers and the body in separate sends: with Nagle's algorithm the
        # body waits for the client's delayed ACK of the headers, 40 ms on Linux, per response
        try:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not TCP (a Unix socket)
        super().handle()

    def get_environ(self) -> dict[str, Any]:
        env = super().get_environ()
        env["bubo.socket"] = self.socket
        return env


def _served_name(model: str) -> str:
    """The default model id: a catalog name as given, a path as its file name without .gguf."""
    if os.sep in model or model.endswith(".gguf"):
        base = os.path.basename(model)
        return base[:-5] if base.endswith(".gguf") else base
    return model


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    from bubo.api.auth import load_key_file
    from bubo.cli import _csv

    keys = _csv(args.api_key)
    if args.api_key_file:
        keys += load_key_file(args.api_key_file)
    return ServerConfig(
        served_model_name=args.served_model_name or _served_name(args.model),
        aliases=_csv(args.alias),
        api_keys=keys,
        cors_origins=_csv(args.cors_origins),
        debug_hooks=args.debug_hooks,
        host=args.host,
        port=args.port,
        slots_enabled=not args.no_slots,
    )


def serve(args: argparse.Namespace) -> int:
    import gevent

    from bubo.api.app import create_app
    from bubo.engine import Engine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    if args.port < 0 or args.port > 65535:
        raise ValueError(f"--port {args.port}: give 0..65535")
    config = config_from_args(args)
    if args.debug_hooks and not is_loopback(args.host):
        log.warning("--debug-hooks ignored: %s is not a loopback address", args.host)
    # a debug hook: widen the loading window so tests can see /ready say not_ready
    delay = float(os.environ.get("BUBO_DEBUG_LOAD_DELAY_S", "0") or 0) if config.debug_routes_enabled else 0.0
    template = None
    if args.chat_template_file:
        try:
            with open(args.chat_template_file, encoding="utf-8") as f:
                template = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--chat-template-file {args.chat_template_file}: {e}") from None
    for flag, value, least in (("--parallel", args.parallel, 1), ("--batch-size", args.batch_size, 1),
                               ("--ubatch-size", args.ubatch_size, 1), ("--queue-size", args.queue_size, 0)):
        if value is not None and value < least:
            raise ValueError(f"{flag} {value}: give at least {least}")
    engine = Engine(args.model, n_ctx=args.ctx_size, n_threads=args.threads, chat_template=template,
                    load_delay_s=delay, n_parallel=args.parallel, n_batch=args.batch_size,
                    n_ubatch=args.ubatch_size, queue_size=args.queue_size)
    app = create_app(engine, config)
    server = pywsgi.WSGIServer((args.host, args.port), app, handler_class=_Handler,
                               log=None, error_log=logging.getLogger("bubo.http"))
    server.init_socket()
    host, port = server.address[:2]
    config.port = port
    engine.start()
    url = f"http://{host if ':' not in host else '[' + host + ']'}:{port}"
    print(f"bubo serve: listening on {url}", flush=True)
    print(f"bubo serve: model {args.model} as '{config.served_model_name}' (also: "
          f"{', '.join(config.model_names[1:])}), loading", flush=True)
    print(f"bubo serve: threads {engine.n_threads}; context "
          f"{args.ctx_size if args.ctx_size else 'the trained context, capped by memory'}"
          f"{'; API key required' if config.api_keys else ''}", flush=True)
    routes = sorted({r.rule for r in app.url_map.iter_rules() if r.endpoint != "static"})
    print("bubo serve: routes " + " ".join(routes), flush=True)

    def on_ready() -> None:
        while not engine.ready and engine.load_error is None:
            gevent.sleep(0.1)
        if engine.ready:
            print(f"bubo serve: ready: {engine.model_path}, context {engine.n_ctx} tokens "
                  f"(trained {engine.n_ctx_train}) shared by {engine.n_parallel} slots", flush=True)
        else:
            print(f"bubo serve: the model failed to load: {engine.load_error}", flush=True)

    gevent.spawn(on_ready)
    def stop() -> None:
        print("bubo serve: stopping", flush=True)
        server.stop(timeout=1)

    # the handlers must stay referenced: a collected watcher no longer fires
    handlers = [gevent.signal_handler(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)]
    try:
        server.serve_forever()
    finally:
        engine.stop()
        for h in handlers:
            h.cancel()
    print("bubo serve: stopped", flush=True)
    return 0
