"""The sampler's row passes (csrc/sample/scan.c: max, sum of exponentials, top-k selection) at every
instruction-set level: tests/native/c/sampler_scan.c compares each level with the scalar one (the
same bits) and with double-precision references. Built natively, and for NEON cross-compiled with
Debian's aarch64 gcc and run under qemu-user (skipped when the tools are absent, outside CI), with
the library's own -std=gnu11 so that the compiler may contract the same expressions it would
there."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "tests/native/c/sampler_scan.c", ROOT / "csrc/sample/scan.c", ROOT / "csrc/cpu/cpu.c"]
FLAGS = ["-std=gnu11", "-O3", "-Wall", "-Wextra", "-Wno-unused-function", "-Werror",
         f"-I{ROOT / 'csrc/include'}", f"-I{ROOT / 'csrc'}"]


def _check(run):
    assert run.returncode == 0 and run.stdout.strip().endswith("0 failures"), run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_scan_levels_native(tmp_path):
    exe = tmp_path / "sampler_scan"
    subprocess.run(["gcc", *FLAGS, *map(str, SOURCES), "-lm", "-o", str(exe)], check=True)
    out = _check(subprocess.run([str(exe)], capture_output=True, text=True, timeout=120))
    assert "level scalar" in out


def test_scan_levels_neon(tmp_path):
    cc, qemu = "aarch64-linux-gnu-gcc", "qemu-aarch64"
    missing = [t for t in (cc, qemu) if shutil.which(t) is None]
    if missing and os.environ.get("CI"):
        pytest.fail(f"CI must have the arm64 cross tools, missing: {missing} (see .ci/run)")
    if missing:
        pytest.skip(f"arm64 cross tools not installed: {missing}")
    exe = tmp_path / "sampler_scan"
    subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-lm", "-static", "-o", str(exe)], check=True)
    out = _check(subprocess.run([qemu, "-L", "/usr/aarch64-linux-gnu", str(exe)], capture_output=True, text=True,
                                timeout=300))
    assert "level neon" in out
