"""`bubo ray-serve`: check the flags, join or start a Ray cluster, deploy, wait for a signal."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import types

from bubo.cli.flags import csv
from bubo.rayserve import DeployError, Options, check_resources, deploy, require_ray


def options_from_args(args: argparse.Namespace) -> Options:
    for flag, value, least in (("--replicas", args.replicas, 1), ("-t", args.threads, 1),
                               ("--busy-threshold", args.busy_threshold, 1),
                               ("--max-ongoing-requests", args.max_ongoing_requests, 1),
                               ("--min-replicas", args.min_replicas, 0), ("--max-replicas", args.max_replicas, 1)):
        if value is not None and value < least:
            raise ValueError(f"{flag} {value}: give at least {least}")
    if args.min_replicas is not None and args.max_replicas is None:
        raise ValueError("--min-replicas needs --max-replicas (autoscaling between the two)")
    if args.max_replicas is not None and args.min_replicas is not None and args.min_replicas > args.max_replicas:
        raise ValueError(f"--min-replicas {args.min_replicas} is more than --max-replicas {args.max_replicas}")
    if not args.target_ongoing_requests > 0:
        raise ValueError(f"--target-ongoing-requests {args.target_ongoing_requests}: give a positive number")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: give 1..65535")
    if not args.ready_timeout > 0:
        raise ValueError(f"--ready-timeout {args.ready_timeout}: give a positive number of seconds")
    keys, key_file = _key_flags(args.serve_argv)
    return Options(serve_argv=list(args.serve_argv), api_keys=keys, api_key_file=key_file,
                   replicas=args.replicas, threads=args.threads,
                   min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                   target_ongoing_requests=args.target_ongoing_requests,
                   max_ongoing_requests=args.max_ongoing_requests, router=args.router,
                   busy_threshold=args.busy_threshold, one_per_node=args.one_per_node,
                   ready_timeout_s=args.ready_timeout, name=args.app_name)


def _key_flags(serve_argv: list[str]) -> tuple[list[str], str | None]:
    """The replicas' --api-key and --api-key-file as given on this command line (the variables
    BUBO_ARG_API_KEY and BUBO_ARG_API_KEY_FILE are each replica's node's own: it reads them there,
    as its `bubo serve` does)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--api-key", default=None)
    p.add_argument("--api-key-file", default=None)
    given, _ = p.parse_known_args(serve_argv)
    return csv(given.api_key), given.api_key_file


def ray_serve(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    require_ray()
    import ray
    from ray import serve

    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(logging_level=logging.WARNING, include_dashboard=False)  # a new cluster on this machine, ours
    check_resources(opts)  # before Serve starts: a refusal leaves nothing behind on the cluster
    serve.start(proxy_location=args.proxy_location, http_options={"host": args.host, "port": args.port})
    _check_serve(args, opts)
    print(f"bubo ray-serve: starting {opts.least_replicas} replica(s) of `bubo serve {' '.join(opts.serve_argv)}` "
          f"({opts.threads} thread(s) each, router {opts.router})", flush=True)
    try:
        deploy(opts, timeout_s=opts.ready_timeout_s + 60)
    except DeployError:
        _shutdown_if_idle()
        raise
    stop = threading.Event()

    def on_signal(signum: int, frame: types.FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"bubo ray-serve: listening on http://{args.host}:{args.port} ({opts.least_replicas} replica(s); "
          f"Ray dashboard and `serve status` show them)", flush=True)
    while not stop.wait(1.0):
        pass
    print("bubo ray-serve: stopping", file=sys.stderr, flush=True)
    if address:
        # a cluster that stays: take the application off it (a second signal: leave at once)
        done = threading.Thread(target=serve.delete, args=(opts.name,), daemon=True)
        stop.clear()
        done.start()
        while done.is_alive() and not stop.wait(0.5):
            pass
        _shutdown_if_idle()
    # a cluster this command started ends with it (ray.init's own processes)
    return 0


def _shutdown_if_idle() -> None:
    """With no application left, Serve's proxy goes too, so that the next ray-serve picks its port."""
    from ray import serve

    if not serve.status().applications:
        serve.shutdown()  # type: ignore[no-untyped-call]


def _check_serve(args: argparse.Namespace, opts: Options) -> None:
    """Ray Serve already running on the cluster keeps its proxy's address, and another
    application on the route prefix keeps it: say so rather than print an address nothing
    listens on, or Serve's own traceback."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is None:
        return
    http = client.http_config
    if http is not None and (http.port != args.port or http.host != args.host):
        raise ValueError(f"Ray Serve already runs on this cluster with its HTTP proxy on {http.host}:{http.port}; "
                         f"stop it first (`serve shutdown`), or give --host {http.host} --port {http.port} to "
                         f"serve there (an application of the same --app-name is replaced)")
    for name, app in (client.get_serve_details().get("applications") or {}).items():
        if (name != opts.name and isinstance(app, dict) and app.get("route_prefix") == opts.route_prefix
                and app.get("status") != "DELETING"):  # one going away (a stop under way) is no conflict
            raise ValueError(f"the application {name!r} already serves {opts.route_prefix} on this cluster's Ray "
                             f"Serve: give --app-name {name} to replace it, or stop the ray-serve that runs it first")
