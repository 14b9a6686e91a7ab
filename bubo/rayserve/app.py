"""bubo on Ray Serve: N replicas of `bubo serve` behind Ray Serve's HTTP proxy.

    client -> Ray Serve's proxy -> BuboIngress -> (request router) -> BuboReplica -> its `bubo serve`

- BuboReplica runs one `bubo serve` process on its node (127.0.0.1, a free port, the user's
  serve flags, -t of its CPUs) and passes requests to it as they are: every dialect, stream and
  API key check is bubo's own, nothing is re-implemented here. The process dies with the replica
  (PR_SET_PDEATHSIG) and the replica's health check fails when the process is gone, so Ray
  replaces both.
- BuboIngress reads the body, computes its prefix key (bubo.rayserve.prefix) for the router,
  and streams the replica's answer back. A replica lost before it took the request: the request
  goes to another. Lost while it held it: 503 with Retry-After, or where a stream's 200 went out,
  the dialect's in-band error event.
- The router (bubo.rayserve.router) picks the replica holding the prompt's prefix, else the least
  loaded; `router="pow2"` keeps Ray Serve's default (power of two choices).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from bubo.api.config import DEFAULT_MAX_BODY_BYTES
from bubo.api.errors import ApiError
from bubo.rayserve.forward import (
    ACCEPTED,
    Forward,
    Head,
    end_to_end,
    error_body,
    no_replica,
    replica_lost,
    stream_error_bytes,
)
from bubo.rayserve.prefix import prefix_key

log = logging.getLogger("bubo.ray")

_LISTENING = re.compile(r"listening on (http://\S+)")
ROUTE_ATTEMPTS = 3  # a request no replica took yet is sent this many times before a 503


@dataclass
class Options:
    """What `bubo ray-serve` deploys (its flags: bubo/cli/flags.py)."""

    serve_argv: list[str] = field(default_factory=list)  # `bubo serve` flags for each replica (-m, -c, ...)
    api_keys: list[str] = field(default_factory=list)  # its servers' --api-key and --api-key-file
    api_key_file: str | None = None
    replicas: int = 1
    threads: int = 1  # CPUs per replica: its -t and its Ray num_cpus
    min_replicas: int | None = None  # with max_replicas: autoscaling on ongoing requests
    max_replicas: int | None = None
    target_ongoing_requests: float = 2.0
    max_ongoing_requests: int = 32
    router: str = "prefix"  # or "pow2", Ray Serve's default
    busy_threshold: int = 4
    one_per_node: bool = False
    ready_timeout_s: float = 600.0
    name: str = "bubo"
    route_prefix: str = "/"

    @property
    def autoscaling(self) -> dict[str, Any] | None:
        if self.max_replicas is None:
            return None
        lo = self.min_replicas if self.min_replicas is not None else 1
        return {"min_replicas": lo, "max_replicas": self.max_replicas, "initial_replicas": max(lo, min(
            self.replicas, self.max_replicas)), "target_ongoing_requests": self.target_ongoing_requests}

    @property
    def least_replicas(self) -> int:
        a = self.autoscaling
        return int(a["initial_replicas"]) if a else self.replicas


# --- the replica ---------------------------------------------------------------------------


# The server is started through this (the process itself, after its exec, single-threaded: a
# preexec_fn in the Ray worker's child, forked from a process full of gRPC threads, is not safe):
# it asks for SIGKILL when its parent's forking thread ends, checks the parent did not end first,
# then becomes `bubo serve`.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "parent = int(sys.argv[1])\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
    "except (OSError, AttributeError):\n"
    "    pass  # not Linux: the replica's health check still notices a server gone\n"
    "if os.getppid() != parent:\n"
    "    sys.exit(1)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


def _first_key(keys: list[str], key_file: str | None) -> str | None:
    """A key the replica's own health checks can use: the first of its server's keys, as its
    `bubo serve` finds them on this node: --api-key, else BUBO_ARG_API_KEY; then --api-key-file,
    else BUBO_ARG_API_KEY_FILE (a flag wins over its variable)."""
    from bubo.api.auth import load_key_file

    if not keys:
        keys = [k.strip() for k in os.environ.get("BUBO_ARG_API_KEY", "").split(",") if k.strip()]
    key_file = key_file or os.environ.get("BUBO_ARG_API_KEY_FILE") or None
    keys = list(keys) + (load_key_file(key_file) if key_file else [])
    return keys[0] if keys else None


class ServeProcessError(RuntimeError):
    pass


class BuboReplica:
    """One `bubo serve` on this node, and the requests passed to it."""

    def __init__(self, serve_argv: list[str], threads: int, ready_timeout_s: float, api_keys: list[str] | None = None,
                 api_key_file: str | None = None) -> None:
        import ray
        from ray import serve

        ctx = serve.get_replica_context()
        node = ray.get_runtime_context().get_node_id()
        # answers carry it (X-Bubo-Replica): which replica, on which node
        self.replica_id = f"{ctx.replica_id.unique_id if ctx is not None else os.getpid()}@{node[:12]}"
        self.key = _first_key(api_keys or [], api_key_file)
        argv = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), "-m", "bubo", "serve", *serve_argv,
                "-t", str(threads), "--host", "127.0.0.1", "--port", "0", "--no-webui"]
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self._tail: deque[str] = deque(maxlen=20)  # the server's last lines, for a failure's message
        started = threading.Event()
        found = threading.Event()
        failure: list[BaseException] = []

        def spawn() -> None:
            # the thread that forks stays alive as long as the child (PDEATHSIG follows the thread)
            try:
                self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, text=True, errors="replace")
            except OSError as e:
                failure.append(e)
                started.set()
                return
            started.set()
            assert self.proc.stdout is not None
            try:
                for line in self.proc.stdout:
                    self._tail.append(line.rstrip("\n"))
                    m = _LISTENING.search(line)
                    if m and not found.is_set():
                        self.url = m.group(1).rstrip("/")
                        found.set()
                    print(line, end="", flush=True)
            except Exception:  # noqa: BLE001 - this thread must outlive the child whatever its output
                log.exception("bubo ray: reading bubo serve's output")
            finally:
                found.set()
                self.proc.wait()

        self._spawner = threading.Thread(target=spawn, name="bubo-serve", daemon=True)
        self._spawner.start()
        started.wait()
        if failure:
            raise ServeProcessError(f"cannot start bubo serve: {failure[0]}")
        deadline = time.monotonic() + ready_timeout_s
        found.wait(ready_timeout_s)
        if not self.url:
            self._fail(f"bubo serve {' '.join(serve_argv)} exited before it listened "
                       f"(status {self.proc.poll() if self.proc else None})")
        while not self._ready():
            if self.proc is not None and self.proc.poll() is not None:
                self._fail(f"bubo serve exited with status {self.proc.returncode} while loading")
            if time.monotonic() > deadline:
                self._fail(f"bubo serve was not ready within {ready_timeout_s:.0f} s")
            time.sleep(0.2)
        self._session: Any = None

    def _fail(self, why: str) -> NoReturn:
        """The replica cannot start: its server goes first (Ray makes another replica)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        said = [ln for ln in self._tail if "error" in ln.lower()] or list(self._tail)[-1:]
        raise ServeProcessError(f"{why}: {said[-1].strip()}" if said else why)

    def _get(self, path: str, timeout: float = 5.0) -> int:
        req = urllib.request.Request(self.url + path)
        if self.key:
            req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0

    def _ready(self) -> bool:
        return self._get("/ready") == 200

    def check_health(self) -> None:
        """Ray Serve calls this every few seconds: a server that has gone means a new replica."""
        if self.proc is None or self.proc.poll() is not None:
            raise ServeProcessError(f"bubo serve exited (status {self.proc.returncode if self.proc else None})")
        if self._get("/health") != 200:
            raise ServeProcessError("bubo serve does not answer /health")

    async def forward(self, req: Forward) -> AsyncIterator[Any]:
        import aiohttp

        yield ACCEPTED
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                                  auto_decompress=False)
        url = self.url + req.path + (f"?{req.query}" if req.query else "")
        async with self._session.request(req.method, url, headers=list(req.headers), data=req.body or None,
                                         allow_redirects=False, skip_auto_headers=("User-Agent", "Accept",
                                                                                   "Accept-Encoding",
                                                                                   "Content-Type")) as resp:
            yield Head(resp.status, end_to_end(list(resp.headers.items())), self.replica_id)
            async for chunk in resp.content.iter_any():
                yield chunk

    def __del__(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)


# --- the ingress ---------------------------------------------------------------------------


class _TooLarge(Exception):
    pass


class BuboIngress:
    """Ray Serve's HTTP entry: every path and method goes to a replica."""

    def __init__(self, replica: Any, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.replica = replica
        self.max_body_bytes = max_body_bytes

    async def _body(self, request: Any) -> bytes:
        chunks: list[bytes] = []
        n = 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > self.max_body_bytes:
                raise _TooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    def _error(self, path: str, err: ApiError) -> Any:
        from starlette.responses import Response

        return Response(error_body(path, err), status_code=err.status, headers=err.headers,
                        media_type="application/json")

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        path = request.url.path
        try:
            body = await self._body(request)
        except _TooLarge:
            return self._error(path, ApiError(413, "request_too_large",
                                              f"the request body is larger than the limit of "
                                              f"{self.max_body_bytes} bytes"))
        fwd = Forward(request.method, path, request.url.query, end_to_end(list(request.headers.items())), body,
                      prefix_key(path, body, request.headers.get("content-type", "")))
        gen: Any = None
        for attempt in range(ROUTE_ATTEMPTS):
            gen = self.replica.options(stream=True).forward.remote(fwd)
            try:
                first = await gen.__anext__()
                assert first == ACCEPTED
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure before a replica took it
                log.warning("bubo ray: attempt %d to route %s %s failed: %s", attempt + 1, request.method, path,
                            type(e).__name__)
                if attempt + 1 == ROUTE_ATTEMPTS:
                    return self._error(path, no_replica(type(e).__name__))
                await asyncio.sleep(0.2 * (attempt + 1))
        try:
            head = await gen.__anext__()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the replica went away while it held the request
            log.warning("bubo ray: replica lost under %s %s: %s", request.method, path, type(e).__name__)
            return self._error(path, replica_lost(type(e).__name__))
        assert isinstance(head, Head)
        headers = dict(head.headers)
        headers["X-Bubo-Replica"] = head.replica
        ctype = headers.get("Content-Type", headers.get("content-type", ""))

        async def rest() -> AsyncIterator[bytes]:
            try:
                async for chunk in gen:
                    yield chunk
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - lost mid-answer: the stream ends with the dialect's error
                log.warning("bubo ray: replica lost during %s %s: %s", request.method, path, type(e).__name__)
                yield stream_error_bytes(path, ctype, replica_lost(type(e).__name__))

        return StreamingResponse(rest(), status_code=head.status, headers=headers)
