"""Build tests/native/c/grammar_asan.c with AddressSanitizer and UBSan straight from the grammar
engine's sources and run it: an out-of-bounds access, a leak or undefined behaviour fails the test."""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_grammar_under_sanitizers(tmp_path):
    exe = tmp_path / "grammar_asan"
    srcs = [ROOT / "tests/native/c/grammar_asan.c", *sorted((ROOT / "csrc/grammar").glob("*.c")),
            ROOT / "csrc/util/err.c"]
    subprocess.run(["gcc", "-std=gnu11", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1",
                    "-Wall", "-Wextra", "-Wno-unused-parameter",
                    f"-I{ROOT / 'csrc/include'}", f"-I{ROOT / 'csrc'}", *map(str, srcs), "-lm", "-o", str(exe)],
                   check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
