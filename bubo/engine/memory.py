"""Memory: what the machine can give the KV cache, and how big a context is by default.

The memory guard (bubo/engine/engine.py) checks each request's KV bytes against memory_budget():
the machine's total memory (or its cgroup v2 limit, the smaller) less what this process holds is
the most a request could ever get; MemAvailable (or the cgroup's headroom) less a safety margin
is what it can get now. /proc/meminfo and the cgroup's files are read once per question.

The KV cache's storage types and their bytes per value live here too: the context's default
size is the trained context capped so its cache takes at most KV_MEMORY_SHARE of the memory
available at load.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bubo._model import KVCache

log = logging.getLogger("bubo.engine")

# the KV cache may take at most this share of the memory available at start when n_ctx is not given
KV_MEMORY_SHARE = 0.5
# the KV cache's storage types (K and V rows) and bytes per value
KV_TYPES: dict[str, float] = {"f16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
# q4_0 does not hold quality for K rows: against the f16 cache, a mean KL-divergence of 0.17
# (smollm2:135m) and 1.9 (qwen2.5-coder:0.5b) on 2 x 512 tokens of text, where q8_0 K gives 0.006
# and 0.017, and q4_0 V 0.020 and 0.010 (tests/native/test_kv_types.py prints them)
KV_TYPES_K = ("f16", "f32", "q8_0")
# memory the guard leaves to everything else (page cache, other processes, this one's buffers)
MEM_SAFETY_MARGIN = 512 * 1024 * 1024
# a cache at most this share of the memory free at load is taken whole then (reserve_small_cache)
KV_RESERVE_FRACTION = 0.25
DEFAULT_N_CTX = 4096  # a model that does not say its trained context


def check_cache_type(name: str, what: str, k: bool, given: str | None = None) -> str:
    """name if the KV cache stores K (k) or V rows as it, else ValueError naming what was given
    (given: the whole phrase to say instead of "what name") and the choices."""
    given = given or f"{what} {name}"
    if k and name == "q4_0":
        raise ValueError(f"{given}: K rows lose too much as q4_0 (the answers change: a mean KL-divergence "
                         "of 0.2-1.9 against f16 on the catalog models); give f16, f32 or q8_0 (q4_0 is for V rows)")
    if name not in (KV_TYPES_K if k else KV_TYPES):
        raise ValueError(f"{given}: not a KV cache type here; give one of "
                         f"{', '.join(KV_TYPES_K if k else KV_TYPES)}")
    return name


def meminfo() -> dict[str, int]:
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


def cgroup_limit() -> tuple[int, int] | None:
    """(memory.max, memory.current) of this process's cgroup v2, when it has a limit."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return (int(limit), current) if limit.isdigit() else None


def rss() -> int:
    """Bytes this process holds in memory now."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _sysconf_bytes(pages: str) -> int | None:
    try:
        return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory(info: dict[str, int] | None = None) -> int | None:
    """Bytes the machine can give now (MemAvailable; info: /proc/meminfo already read)."""
    info = meminfo() if info is None else info
    free = info.get("MemAvailable")
    return free if free is not None else _sysconf_bytes("SC_AVPHYS_PAGES")


def memory_budget(available_override: int | None = None) -> tuple[int | None, int | None]:
    """(ceiling, available) in bytes for new KV cache: ceiling is the machine's total memory (or
    its cgroup's limit, the smaller) less what this process holds, the most a request could ever
    get; available is what the machine has free now (MemAvailable, or the cgroup's headroom) less
    MEM_SAFETY_MARGIN. available_override replaces the free figure (a debug hook). None: unknown."""
    info = meminfo()
    total = info.get("MemTotal")
    if total is None:
        total = _sysconf_bytes("SC_PHYS_PAGES")
    free = available_override if available_override is not None else available_memory(info)
    cg = cgroup_limit()
    if cg is not None:
        limit, current = cg
        total = min(total, limit) if total is not None else limit
        if available_override is None:
            free = min(free, limit - current) if free is not None else limit - current
    ceiling = max(total - rss(), 0) if total is not None else None
    available = max(free - MEM_SAFETY_MARGIN, 0) if free is not None else None
    return ceiling, available


def memory_short(need: int) -> bool:
    """The cache would have to take need bytes from the OS and the memory available now is short
    (the scheduler's question before it grows the cache)."""
    if need == 0:
        return False
    available = memory_budget(None)[1]
    return available is not None and need > available


def reserve_small_cache(kv: KVCache, n_ctx: int, available_override: int | None = None) -> None:
    """A context whose whole cache is a small part of the memory free now is taken from the OS at
    once: the prefix cache then keeps freed conversations until the context is in use, rather than
    evicting one to make room for the next while the pool is still growing (several conversations
    stay cached, as a router sending each to its replica expects). A larger one grows with use,
    under the memory guard."""
    available = memory_budget(available_override)[1]
    if available is None or kv.nbytes > available * KV_RESERVE_FRACTION:
        return
    try:
        kv.reserve(n_ctx)
    except MemoryError:
        log.info("KV cache: not taken ahead of use (the OS refused); it grows with use")


def context_size(md: dict[str, Any], requested: int | None,
                 bytes_per_value: float = KV_TYPES["f16"]) -> tuple[int | None, int]:
    """(trained context, context to use): the request if given (even past the trained one, as
    llama-server allows; memory is checked per request), else the trained context capped so the
    KV cache (bytes_per_value, K and V on average) takes at most KV_MEMORY_SHARE of the memory
    available now."""
    arch = md.get("general.architecture", "")
    train = md.get(f"{arch}.context_length")
    train = int(train) if isinstance(train, int) and train > 0 else None
    if requested == 0:  # llama-server's -c 0: the trained context, whatever the memory
        return train, train or DEFAULT_N_CTX
    if requested is not None:
        return train, requested
    n_ctx = train or DEFAULT_N_CTX
    n_layer = int(md.get(f"{arch}.block_count") or 0)
    n_head = int(md.get(f"{arch}.attention.head_count") or 0)
    n_head_kv = md.get(f"{arch}.attention.head_count_kv") or n_head
    n_head_kv = int(n_head_kv if isinstance(n_head_kv, int) else max(n_head_kv))
    head_dim = md.get(f"{arch}.attention.key_length") or (
        int(md.get(f"{arch}.embedding_length") or 0) // n_head if n_head else 0)
    per_token = int(2 * n_layer * n_head_kv * int(head_dim) * bytes_per_value)
    avail = available_memory()
    if per_token > 0 and avail:
        fit = int(avail * KV_MEMORY_SHARE) // per_token
        n_ctx = max(min(n_ctx, fit // 256 * 256), 256)
    return train, n_ctx
