"""The default thread count is the CPUs this process may run on (its affinity mask: `taskset`, a
container's cpuset, a pinned test worker), not every CPU of the machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bubo import cpus

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity masks on this OS")


def test_usable_is_the_affinity_mask():
    assert cpus.usable() == len(os.sched_getaffinity(0))


def test_a_process_pinned_to_one_cpu_defaults_to_one_thread(tmp_path):
    from reference.tiny import write_tiny_model

    path = write_tiny_model(tmp_path / "tiny.gguf", "llama")
    code = ("import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from bubo import cpus; from bubo._model import Model; from bubo.engine.engine import Engine; "
            "print(cpus.usable(), Model(sys.argv[1]).hparams['n_threads'], Engine(sys.argv[1]).n_threads)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1", "1"], out.stdout
