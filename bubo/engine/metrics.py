"""Latency histograms of the engine (time to first token, queue wait); bubo/api/llamacpp/shapes.py
writes them as Prometheus histograms.

Written by the engine thread, read by /metrics on another: each observe is a handful of integer
increments under the GIL, and a reader may see one observation half-counted, never a torn one
that breaks the exposition format's invariants (counts are cumulative in the snapshot)."""

from __future__ import annotations

import bisect
import math

from bubo.engine.types import HistogramSnapshot

# seconds: from a cache hit on a short prompt (ms) to a long prompt queued behind others (minutes)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> HistogramSnapshot:
        """Cumulative counts per upper bound, the last bound infinite, with the sum and count."""
        counts = list(self.counts)
        out, total = [], 0
        for le, c in zip(self.buckets, counts):
            total += c
            out.append((le, total))
        total += counts[-1]
        out.append((math.inf, total))
        return HistogramSnapshot(out, self.sum, total)
