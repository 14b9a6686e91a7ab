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
