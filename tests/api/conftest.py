"""A real `python -m bubo serve` process on a free loopback port.

    def test_x(server):            # session scope: one server for the whole suite
        urllib.request.urlopen(server.url + "/health")

start_server(*flags, env=...) starts another one (with --api-key, say); use it as a context
manager. The server picks the port itself (--port 0) and logs it, so there is no race on a
port chosen by the test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from bubo import store

from engines import THREADS

MODEL = "smollm2:135m"
START_TIMEOUT_S = 120.0  # a cold start may rebuild the editable install first
_URL = re.compile(r"listening on (http://[^\s\"]+)")


class Process:
    """A server process, until its output says where it listens (the first group of url_pattern);
    its output is kept in .log. stop(): SIGTERM, then SIGKILL after stop_timeout_s."""

    def __init__(self, cmd: list[str], *, env: dict[str, str] | None = None, url_pattern: re.Pattern[str] = _URL,
                 start_timeout_s: float = START_TIMEOUT_S, stop_timeout_s: float = 10.0,
                 start_new_session: bool = False):
        full_env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=full_env, bufsize=1, start_new_session=start_new_session)
        self.log: list[str] = []
        self.stop_timeout_s = stop_timeout_s
        self.url = self._read_url(url_pattern, start_timeout_s)
        # keep draining the output: a full pipe would block the server's logging
        threading.Thread(target=self._drain, daemon=True).start()

    def _read_url(self, pattern: re.Pattern[str], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.append(line)
            m = pattern.search(line)
            if m:
                return m.group(1)
        self.stop()
        raise RuntimeError("the server did not start:\n" + "".join(self.log[-60:]))

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Server(Process):
    def __init__(self, *flags: str, env: dict[str, str] | None = None, model: str | None = MODEL,
                 ctx: int = 2048, threads: int = THREADS):
        """model None: the flags name the models (router mode: several -m, --models-dir, ...)."""
        models: list[str] = []
        if model is not None:
            path = store.pull(model)  # before the clock starts: a download is not a slow server
            models = ["-m", str(path), "--served-model-name", model]
        cmd = [sys.executable, "-m", "bubo", "serve", *models,
               "--host", "127.0.0.1", "--port", "0", "-c", str(ctx), "-t", str(threads), *flags]
        super().__init__(cmd, env=env)
        self.first_ready_status: int | None = None

    def ready_status(self, headers: dict[str, str] | None = None) -> int:
        req = urllib.request.Request(self.url + "/ready", headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def wait_ready(self, headers: dict[str, str] | None = None) -> Server:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            status = self.ready_status(headers)
            if self.first_ready_status is None:
                self.first_ready_status = status
            if status == 200:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the server did not become ready:\n" + "".join(self.log))


def start_server(*flags: str, env: dict[str, str] | None = None, **kw) -> Server:
    return Server(*flags, env=env, **kw)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The shared server: smollm2:135m, -c 2048, -t THREADS, one slot (-np 1), --debug-hooks (loopback), ready."""
    s = Server("--debug-hooks", "-np", "1")
    try:
        yield s.wait_ready()
    finally:
        s.stop()


@pytest.fixture(scope="session")
def base_url(server: Server) -> str:
    return server.url
