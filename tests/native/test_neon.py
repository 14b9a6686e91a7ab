"""NEON kernels, on this x86-64 machine: cross-compile the C core with Debian's aarch64 gcc and
run tests/native/c/test_neon.c under qemu-user, which compares every NEON variant in the kernel
table with the scalar reference. CI installs the cross tools (.ci/run); elsewhere the test skips
when they are absent, and says so."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a sweep or a build: the whole suite runs it, the quick tier does not

ROOT = Path(__file__).resolve().parents[2]
CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"

SOURCES = sorted(
    str(p) for d in ("util", "cpu", "quants", "ops") for p in (ROOT / "csrc" / d).glob("*.c")
)


def _tools_missing():
    missing = [t for t in (CC, QEMU) if shutil.which(t) is None]
    if missing and os.environ.get("CI"):
        pytest.fail(f"CI must have the arm64 cross tools, missing: {missing} (see .ci/run)")
    if missing:
        pytest.skip(f"arm64 cross tools not installed: {missing} "
                    "(apt-get install gcc-aarch64-linux-gnu qemu-user)")


@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+dotprod"])
def test_neon_kernels_match_scalar(tmp_path, march):
    _tools_missing()
    exe = tmp_path / "test_neon"
    cmd = [CC, "-std=c11", "-O2", f"-march={march}", "-Wall", "-I", str(ROOT / "csrc/include"),
           "-I", str(ROOT / "csrc"), str(ROOT / "tests/native/c/test_neon.c"), *SOURCES,
           "-o", str(exe), "-lm", "-lpthread", "-static"]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([QEMU, "-L", SYSROOT, str(exe)], capture_output=True, text=True, timeout=600)
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 failures" in run.stdout
    # every supported type was reached (a NEON-less type fails above by name)
    assert run.stdout.count("to_float+vec_dot neon") >= 13, run.stdout
    assert run.stdout.count("vec_dot_tile neon") >= 13, run.stdout
    assert run.stdout.count("ok attention neon") == 2, run.stdout
    assert "ok encoder ops neon" in run.stdout, run.stdout
