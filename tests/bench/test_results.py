"""The benchmarks' result files and the report written from them (benchmarks/results.py,
benchmarks/report.py): a script's printed tables are saved as they were printed, and
docs/benchmarks.md is exactly what the saved files make."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


results = _load("results")

PRINTED = """building llama-bench (a few minutes)

### bubo / llama.cpp, 2 threads, Some CPU

| model | test | bubo t/s | llama.cpp t/s | ratio |
| --- | ---: | ---: | ---: | ---: |
| smollm2:135m | pp512 | 2128.06 | 502.24 | 4.24x |
| smollm2:135m | tg128 | 419.04 | 179.16 | 2.34x |

**drafted against plain**

| task | ratio |
| --- | ---: |
| edit | 2.49x |
"""


def test_printed_tables_are_parsed_with_their_headings():
    tables = results.parse_tables(PRINTED)
    assert [t["title"] for t in tables] == ["bubo / llama.cpp, 2 threads, Some CPU", "drafted against plain"]
    assert tables[0]["columns"] == ["model", "test", "bubo t/s", "llama.cpp t/s", "ratio"]
    assert tables[0]["rows"][1] == ["smollm2:135m", "tg128", "419.04", "179.16", "2.34x"]
    assert tables[1]["rows"] == [["edit", "2.49x"]]


def test_saving_keeps_what_was_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_llamacpp.py", "-t", "2"])
    with results.saving("bench_llamacpp", True):
        print(PRINTED)
    assert "4.24x" in capsys.readouterr().out  # still printed
    files = sorted((tmp_path / "bench_llamacpp").glob("*.json"))
    assert len(files) == 2
    record = json.loads(files[0].read_text())
    assert record["command"] == "python benchmarks/bench_llamacpp.py -t 2" and record["cpu"] == results.cpu_name()
    assert {r["title"] for r in map(lambda f: json.loads(f.read_text()), files)} == {
        "bubo / llama.cpp, 2 threads, Some CPU", "drafted against plain"}
    # the same table saved again replaces its file (git keeps the history)
    with results.saving("bench_llamacpp", True):
        print(PRINTED.replace("4.24x", "4.30x"))
    assert len(list((tmp_path / "bench_llamacpp").glob("*.json"))) == 2
    assert not list(tmp_path.rglob("*.tmp"))
    with results.saving("bench_llamacpp", False):  # without --save nothing is written
        print(PRINTED.replace("Some CPU", "Another"))
    assert len(list((tmp_path / "bench_llamacpp").glob("*.json"))) == 2


def test_the_report_is_what_the_result_files_make():
    p = subprocess.run([sys.executable, str(BENCH / "report.py"), "--check"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    doc = (BENCH.parent / "docs" / "benchmarks.md").read_text()
    for f in (BENCH / "results").rglob("*.json"):
        record = json.loads(f.read_text())
        assert f"### {record['title']}" in doc and record["cpu"] in doc
        assert all(("| " + " | ".join(row) + " |") in doc for row in record["rows"])


def test_every_benchmark_that_saves_is_in_the_report():
    report = _load("report")
    described = {name for name, _, _ in report.BENCHMARKS}
    for script in BENCH.glob("*.py"):
        text = script.read_text()
        if "results.saving(" in text:
            name = text.split('results.saving("', 1)[1].split('"', 1)[0]
            assert name in described, f"{script.name} saves {name!r}, which report.py does not describe"
            assert '"--save"' in text, script.name


def _cpuinfo(vendor: str, name: str, family: int, model: int, flags: str) -> str:
    cpu = (f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
           f"model name\t: {name}\nflags\t\t: fpu sse2 {flags}\n\n")
    return cpu.format(0) + cpu.format(1)


def test_a_table_names_the_core_and_the_level():
    """"AMD EPYC" alone is a Zen 3 with AVX2 or a Zen 5 with AVX-512: the label says which."""
    label = results.cpu_label
    assert label(_cpuinfo("AuthenticAMD", "AMD EPYC", 25, 1, "avx2 fma")) == "AMD EPYC (Zen 3, AVX2)"
    assert label(_cpuinfo("AuthenticAMD", "AMD EPYC", 25, 17, "avx2 avx512f avx512_vnni")) \
        == "AMD EPYC (Zen 4, AVX-512 VNNI)"
    assert label(_cpuinfo("AuthenticAMD", "AMD EPYC", 26, 2, "avx2 avx512f avx512_vnni")) \
        == "AMD EPYC (Zen 5, AVX-512 VNNI)"
    assert label(_cpuinfo("GenuineIntel", "Intel(R) Xeon(R) Processor", 6, 143,
                          "avx2 avx512f avx512_vnni amx_tile")) == "Intel(R) Xeon(R) Processor (AVX-512 VNNI, AMX)"
    assert label(_cpuinfo("AuthenticAMD", "AMD EPYC 7551", 23, 1, "avx2")) == "AMD EPYC 7551 (Zen, AVX2)"
    assert label(_cpuinfo("AuthenticAMD", "AMD EPYC 7B12", 23, 49, "avx2")) == "AMD EPYC 7B12 (Zen 2, AVX2)"
    assert label(_cpuinfo("AuthenticAMD", "AMD Future", 26, 0x90, "avx2 avx512f")) == "AMD Future (AVX-512)"
    assert label(_cpuinfo("GenuineIntel", "Some CPU", 6, 1, "sse4_2")) == "Some CPU"
    assert label("") == "unknown CPU"
