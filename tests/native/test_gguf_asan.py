"""Build the C fuzz harness (tests/native/c/fuzz_gguf.c) with AddressSanitizer and UBSan, straight
from the reader's sources, and run it over seeds written here: any out-of-bounds read, leak,
undefined behaviour, failed invariant or unbounded allocation fails the test."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess

import gguf
import numpy as np
import pytest

import ggufbuild as gb

pytestmark = pytest.mark.slow  # a sweep or a build: the whole suite runs it, the quick tier does not

ROOT = pathlib.Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "native" / "c" / "fuzz_gguf.c"
RANDOM_CASES = 1_000_000
RNG_SEED = 20240607

SAN_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1"]
CFLAGS = ["-std=gnu11", "-fno-strict-aliasing", "-Wall", "-Wno-unused-parameter", "-Wno-unused-function",
          f"-I{ROOT / 'csrc' / 'include'}", f"-I{ROOT / 'csrc'}"]


def sources() -> list[pathlib.Path]:
    """The reader and what it links: the type traits (and the kernel families they register),
    CPU detection, the error helper."""
    srcs = [HARNESS]
    for sub in ("gguf", "util", "cpu", "quants"):
        srcs += sorted((ROOT / "csrc" / sub).glob("*.c"))
    return srcs


def compile_harness(out: pathlib.Path) -> pathlib.Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not on PATH; the ASan harness needs it")

    def cc(src: pathlib.Path) -> pathlib.Path:
        obj = out / (src.parent.name + "_" + src.stem + ".o")
        # the kernel families are linked for the traits' tables, never run by the reader: built
        # plainly, they take a second where sanitized at -O1 they take half a minute
        kernels = src.parent.name == "quants" and src.stem != "traits"
        subprocess.run([gcc, *CFLAGS, *(["-O0"] if kernels else SAN_FLAGS), "-c", str(src), "-o", str(obj)],
                       check=True, capture_output=True, text=True)
        return obj

    try:
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            objs = list(pool.map(cc, sources()))
        exe = out / "fuzz_gguf"
        subprocess.run([gcc, *SAN_FLAGS, *map(str, objs), "-lpthread", "-lm", "-o", str(exe)], check=True,
                       capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        pytest.fail(f"building the ASan harness failed:\n{' '.join(e.cmd)}\n{e.stderr}")
    return exe


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return compile_harness(tmp_path_factory.mktemp("asan"))


def write_corpus(corpus: pathlib.Path) -> None:
    corpus.mkdir()
    for name, raw, fields in gb.fuzz_seeds():
        (corpus / f"{name}.gguf").write_bytes(raw)
        (corpus / f"{name}.fields").write_text("".join(f"{f.offset} {f.size} {f.kind}\n" for f in fields))
    # one seed from the independent writer (no field map: byte-level mutations only)
    w = gguf.GGUFWriter(str(corpus / "writer.gguf"), "qwen2")
    w.add_array("tokenizer.ggml.tokens", ["a", "bc", ""])
    w.add_array("nested", [[1, 2], [3]])
    w.add_float32("f", 0.5)
    w.add_tensor("w", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("q", gguf.quants.quantize(np.ones((2, 32), np.float32), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_reader_under_asan(harness, tmp_path):
    exe = harness
    write_corpus(tmp_path / "corpus")
    env = dict(os.environ,
               ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:allocator_may_return_null=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    proc = subprocess.run([str(exe), "-n", str(RANDOM_CASES), "-s", str(RNG_SEED), str(tmp_path / "corpus")],
                          capture_output=True, text=True, env=env, timeout=600)
    report = proc.stdout + proc.stderr
    print(report)
    assert proc.returncode == 0, report[-6000:]
    assert "runtime error" not in report and "Sanitizer" not in report, report[-6000:]
    m = re.search(r"(\d+) seeds, (\d+) cases in [\d.]+ s: (\d+) loaded, (\d+) format errors, (\d+) unsupported, "
                  r"(\d+) other; allocation bound checked", report)
    assert m, report
    seeds, cases, loaded, format_errors, unsupported, other = map(int, m.groups())
    assert seeds == 7 and cases > RANDOM_CASES
    assert other == 0  # no NOMEM or INVALID: nothing asks for more memory than the file justifies
    assert loaded > cases // 20 and format_errors > cases // 4


@pytest.mark.models
def test_real_models_under_asan(harness):
    from bubo import store

    exe = harness
    paths = [str(store.pull(name)) for name in ("smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b")]
    proc = subprocess.run([str(exe), "-c", *paths], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"))
    report = proc.stdout + proc.stderr
    print(report)
    assert proc.returncode == 0, report[-6000:]
    assert report.count(" tensors, metadata ") == 3
