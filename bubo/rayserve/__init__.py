"""`bubo ray-serve`: bubo replicas on Ray Serve (pip install 'bubo[ray]').

build_app() makes the Serve application (bubo.rayserve.app), deploy() checks the cluster can hold
it and runs it, and `bubo ray-serve` (bubo/cli/ray_serve.py) calls them and waits for a signal. Ray is
imported here and in app/router only, never by the rest of bubo."""

from __future__ import annotations

import time
from typing import Any

from bubo.rayserve.app import BuboIngress, BuboReplica, Options

INSTALL_HINT = "ray-serve needs Ray Serve: pip install 'bubo[ray]'"
DEPLOY_POLL_S = 0.5
UNSCHEDULABLE_GRACE_S = 30.0  # replicas whose resources no node has fail the deploy after this


class RayMissing(RuntimeError):
    pass


class DeployError(RuntimeError):
    pass


def require_ray() -> None:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
        from ray.serve.request_router import RequestRouter  # noqa: F401
    except ImportError as e:
        raise RayMissing(f"{INSTALL_HINT} ({e})") from None


def build_app(opts: Options) -> Any:
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from bubo.rayserve.router import PrefixAwareRouter

    replica: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": opts.threads},
        "max_ongoing_requests": opts.max_ongoing_requests,
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 15.0,
        "graceful_shutdown_timeout_s": 5.0,
    }
    autoscaling = opts.autoscaling
    if autoscaling:
        replica["autoscaling_config"] = autoscaling
    else:
        replica["num_replicas"] = opts.replicas
    if opts.one_per_node:
        replica["max_replicas_per_node"] = 1
    if opts.router == "prefix":
        router: dict[str, Any] = {"request_router_class": PrefixAwareRouter,
                                  "request_router_kwargs": {"busy_threshold": opts.busy_threshold}}
        replica["request_router_config"] = RequestRouterConfig(**router)
    elif opts.router != "pow2":
        raise ValueError(f"--router {opts.router}: give prefix or pow2")
    deployment: Any = serve.deployment  # a decorator that also takes the class
    replicas = deployment(BuboReplica, name="BuboReplica").options(**replica)
    ingress = deployment(BuboIngress, name="BuboIngress").options(
        num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096)
    return ingress.bind(replicas.bind(opts.serve_argv, opts.threads, opts.ready_timeout_s, api_keys=opts.api_keys,
                                      api_key_file=opts.api_key_file))


def check_resources(opts: Options) -> None:
    """A clear error, before anything is deployed, where the cluster cannot hold the replicas
    (Ray would otherwise leave them pending for good)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    cpus = [float(n.get("Resources", {}).get("CPU", 0)) for n in nodes]
    need = opts.least_replicas
    if opts.one_per_node:
        fit = sum(1 for c in cpus if c >= opts.threads)
        if fit < need:
            raise DeployError(f"{need} replicas, one per node, need {need} nodes with {opts.threads} CPUs each; "
                              f"the cluster has {fit} such nodes (of {len(nodes)}): add nodes or ask for fewer "
                              f"replicas")
    fit = sum(int(c // opts.threads) for c in cpus)
    if fit < need:
        threads = f"{opts.threads} thread{'s' if opts.threads != 1 else ''}"
        raise DeployError(f"{need} replicas of {threads} need {need * opts.threads} CPUs, "
                          f"{opts.threads} on one node each; the cluster's {len(nodes)} node(s) have "
                          f"{', '.join(f'{c:g}' for c in cpus)} CPUs, room for {fit}: add nodes, or ask for "
                          f"fewer replicas (--replicas) or threads (-t)")


def deploy(opts: Options, timeout_s: float) -> None:
    """Run the application and wait until every replica is ready; DeployError (the app deleted)
    when one fails to start or cannot be placed. check_resources(opts) first: a refusal then
    comes before Serve is started on the cluster."""
    from ray import serve

    serve._run(build_app(opts), _blocking=False, name=opts.name, route_prefix=opts.route_prefix)
    deadline = time.monotonic() + timeout_s
    pending_since: float | None = None
    while True:
        app = serve.status().applications.get(opts.name)
        status = str(getattr(app, "status", "")) if app is not None else ""
        if status.endswith("RUNNING"):
            return
        messages = [d.message for d in (app.deployments.values() if app is not None else []) if d.message]
        # a replica whose constructor failed (its server could not start: a model that cannot be
        # served, a bad flag) fails again the same way: said at the first failure, not after Serve's
        # retries (tens of seconds)
        if status.endswith("DEPLOY_FAILED") or status.endswith("UNHEALTHY") or any(
                "failed to start" in m for m in messages):
            _give_up(opts.name, "; ".join(messages) or app.message if app is not None else status)
        if any("resources" in m.lower() and ("pending" in m.lower() or "scheduled" in m.lower()) for m in messages):
            pending_since = pending_since or time.monotonic()
            if time.monotonic() - pending_since > UNSCHEDULABLE_GRACE_S:
                _give_up(opts.name, "; ".join(messages))
        if time.monotonic() > deadline:
            _give_up(opts.name, f"not running after {timeout_s:.0f} s: " + ("; ".join(messages) or status))
        time.sleep(DEPLOY_POLL_S)


def _give_up(name: str, why: str) -> None:
    from ray import serve

    try:
        serve.delete(name)
    finally:
        raise DeployError(f"the replicas did not start: {_last_line(why)}")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    errs = [ln for ln in lines if "Error" in ln]
    return (errs[-1] if errs else lines[-1] if lines else "no reason given")[:600]


__all__ = ["BuboIngress", "BuboReplica", "DeployError", "Options", "RayMissing", "build_app", "check_resources",
           "deploy", "require_ray"]
