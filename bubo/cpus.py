"""The CPUs this process may run on: the default thread count of everything that computes."""

from __future__ import annotations

import os


def usable() -> int:
    """The CPUs in this process's affinity mask (a `taskset`, a container's cpuset, a test worker
    pinned to its share), else every CPU; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity masks here (macOS)
        return os.cpu_count() or 1


def name_thread(name: str) -> None:
    """Give the calling OS thread a name (at most 15 bytes) that `top -H` and
    /proc/PID/task/TID/comm show: the engine's threads are "bubo-engine" and "bubo-pool", so
    that the CPU time of the server's HTTP work and of its engine can be told apart. Linux only;
    elsewhere nothing."""
    import sys

    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15])  # PR_SET_NAME
    except (OSError, AttributeError, TypeError, ValueError):
        pass  # a C library without prctl: the thread keeps its name
