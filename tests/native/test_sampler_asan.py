"""Build tests/native/c/sampler_asan.c with AddressSanitizer and UBSan straight from the sampler's
sources and run it: an out-of-bounds access, a leak or undefined behaviour fails the test."""

import pathlib
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.slow  # a sweep or a build: the whole suite runs it, the quick tier does not

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_sampler_under_sanitizers(tmp_path):
    exe = tmp_path / "sampler_asan"
    srcs = [ROOT / "tests/native/c/sampler_asan.c", *sorted((ROOT / "csrc/sample").glob("*.c")),
            ROOT / "csrc/util/err.c", ROOT / "csrc/cpu/cpu.c"]
    subprocess.run(["gcc", "-std=gnu11", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1",
                    f"-I{ROOT / 'csrc/include'}", f"-I{ROOT / 'csrc'}", *map(str, srcs), "-lm", "-o", str(exe)],
                   check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
