"""Rollout throughput versus N at a fixed total: the paper's memory-bound -> compute-bound claim.

For each engine (hf, vllm) and each N in {16, 64, 256, 512, 1024}, generate the SAME total number
of rollouts (B = total / N prompts, drawn from one fixed prompt list), with the same model and
sampling, and measure rollouts/s, tokens/s (median of `--repeats` runs) and peak memory (process
RSS high-water mark on CPU, reset before each cell through /proc/self/clear_refs;
torch.cuda.max_memory_allocated on GPU, which for vLLM excludes its preallocated KV pool). Prints
the table, the N=512 / N=16 ratio per
engine (the paper: 72.4 / 36.5 = 1.98 on H100, spec §5.5) and the vllm / hf ratio per N, with the
core count and /proc/loadavg before and after (other processes on the machine skew the figures).

Runs unchanged on a CUDA machine with `vllm` installed: the device is chosen from what is present.
The model is built from config with random weights (no download); `--shape qwen2.5-1.5b` gives
Qwen2.5-1.5B's shape. Its vocabulary is wider than the character tokenizer's, which only affects
decoded texts (ids beyond the tokenizer are dropped), not the compute measured.

Usage: python benchmarks/rollout_throughput.py --quick
       python benchmarks/rollout_throughput.py --shape qwen2.5-1.5b --max-response-tokens 1024
       python benchmarks/rollout_throughput.py --params params/shape_qwen2.5-1.5b.yaml \
           --vocab-size 151936 --max-response-tokens 1024      (the shape from a params file)
Deliberately ignored: the trainer side of a step, multi-GPU engines, real checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from brorl.engines.base import SamplingConfig  # noqa: E402
from brorl.engines import build_engine  # noqa: E402
from brorl.policy import build_policy, build_tokenizer, save_policy  # noqa: E402

SHAPES = {
    # name: (hidden, layers, heads, kv_heads, intermediate, vocab or None = tokenizer's)
    "tiny": (64, 2, 2, 1, 128, None),
    "small": (512, 4, 8, 2, 1376, None),
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151_936),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151_936),
}
"""Model shapes built from config; the Qwen2.5 rows follow their public config.json files."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="hf,vllm", help="comma list of hf, vllm")
    ap.add_argument("--n-values", default="16,64,256,512,1024", help="rollouts per prompt")
    ap.add_argument("--total-rollouts", type=int, default=2048, help="B*N, equal for every N")
    ap.add_argument("--max-response-tokens", type=int, default=64)
    ap.add_argument("--prompt-chars", type=int, default=32, help="prompt length (tokens)")
    ap.add_argument("--max-concurrent-rollouts", type=int, default=256,
                    help="hf chunk / vllm max_num_seqs")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--params", type=Path, default=None,
                    help="take the model shape from this params file's `model` section instead "
                         "(e.g. params/shape_qwen2.5-1.5b.yaml); the vocabulary from --vocab-size")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="vocabulary size with --params (default: the character tokenizer's)")
    ap.add_argument("--num-layers", type=int, default=None, help="override the shape's layer count")
    ap.add_argument("--temperature", type=float, default=1.2, help="ProRL v1: 1.2 (spec §7.1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (GPU default)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--cpu-kv-cache-gib", type=int, default=2)
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="vLLM on CPU: bind to cores 0..k-1 (match OMP_NUM_THREADS for hf)")
    ap.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile")
    ap.add_argument("--repeats", type=int, default=3, help="runs per cell; the median time is kept")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--quick", action="store_true", help="short CPU run: 1024 rollouts, 16 tokens")
    args = ap.parse_args(argv)
    if args.quick:
        args.total_rollouts, args.max_response_tokens, args.prompt_chars = 1024, 16, 16
    n_values = [int(n) for n in args.n_values.split(",")]
    bad = [n for n in n_values if args.total_rollouts % n]
    if bad:
        ap.error(f"--total-rollouts {args.total_rollouts} is not a multiple of N in {bad}; "
                 "the comparison needs B = total / N whole prompts.")
    args.n_values = n_values
    return args


def shape_of(args: argparse.Namespace) -> tuple[int, int, int, int, int, int | None]:
    """(hidden, layers, heads, kv_heads, intermediate, vocab or None) from --params or --shape."""
    if args.params is None:
        return SHAPES[args.shape]
    from brorl.params import load_params

    m = load_params(args.params).model
    return (m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.intermediate_size,
            args.vocab_size)


def build_model(args: argparse.Namespace, device: str):
    tokenizer = build_tokenizer()
    hidden, layers, heads, kv, inter, vocab = shape_of(args)
    model = build_policy(
        vocab_size=vocab or len(tokenizer), hidden_size=hidden,
        num_layers=args.num_layers or layers,
        num_heads=heads, num_kv_heads=kv, intermediate_size=inter,
        max_position_embeddings=args.prompt_chars + args.max_response_tokens + 16, seed=args.seed,
    )
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    return model.to(device=device, dtype=dtype), tokenizer


def make_prompts(count: int, chars: int, seed: int) -> list[str]:
    """`count` distinct printable prompts of `chars` characters (one token per character)."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789+-*= "
    return ["".join(rng.choice(alphabet) for _ in range(chars)) for _ in range(count)]


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    elif os.path.exists("/proc/self/clear_refs"):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def peak_mib(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_engine(name: str, model, tokenizer, args: argparse.Namespace, folder: Path):
    if name == "vllm":
        save_policy(model, tokenizer, folder)
    return build_engine(
        name, model=model, tokenizer=tokenizer, model_path=folder,
        max_concurrent_rollouts=args.max_concurrent_rollouts, seed=args.seed, dtype=args.dtype,
        max_model_len=args.prompt_chars + args.max_response_tokens + 16,
        gpu_memory_utilization=args.gpu_memory_utilization, cpu_kv_cache_gib=args.cpu_kv_cache_gib,
        enforce_eager=args.enforce_eager, cpu_threads=args.cpu_threads,
    )


def measure(engine, name: str, prompts: list[str], n: int, args, device: str) -> dict:
    sampling = SamplingConfig(
        temperature=args.temperature, max_response_tokens=args.max_response_tokens, seed=args.seed
    )
    if device == "cuda":
        torch.cuda.synchronize()
    reset_peak(device)
    times = []
    for _ in range(args.repeats):  # same seed each time: identical work, so the median is fair
        start = time.perf_counter()
        batch = engine.generate(prompts, n, sampling)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    tokens = int(batch.response_lengths.sum())
    return {
        "engine": name, "n": n, "prompts": len(prompts), "rollouts": batch.num_rollouts,
        "tokens": tokens, "seconds": round(seconds, 3),
        "rollouts_per_s": round(batch.num_rollouts / seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1), "peak_mib": round(peak_mib(device), 1),
        "seconds_all": [round(t, 3) for t in times],
    }


def report(rows: list[dict], device: str) -> None:
    mem = "peak CUDA MiB" if device == "cuda" else "peak RSS MiB"
    print(f"\n{'engine':6} {'N':>5} {'B':>5} {'rollouts':>8} {'tokens':>8} {'s':>7} "
          f"{'rollouts/s':>10} {'tokens/s':>10} {mem:>13}")
    for r in rows:
        print(f"{r['engine']:6} {r['n']:5d} {r['prompts']:5d} {r['rollouts']:8d} {r['tokens']:8d} "
              f"{r['seconds']:7.2f} {r['rollouts_per_s']:10.1f} {r['tokens_per_s']:10.1f} "
              f"{r['peak_mib']:13.1f}")
    by = {(r["engine"], r["n"]): r for r in rows}
    for engine in sorted({r["engine"] for r in rows}):
        if (engine, 512) in by and (engine, 16) in by:
            ratio = by[engine, 512]["rollouts_per_s"] / by[engine, 16]["rollouts_per_s"]
            print(f"{engine}: N=512 / N=16 rollouts/s = {ratio:.2f} "
                  "(paper, H100: 72.4/36.5 = 1.98)")
    for n in sorted({r["n"] for r in rows}):
        if ("vllm", n) in by and ("hf", n) in by:
            ratio = by["vllm", n]["rollouts_per_s"] / by["hf", n]["rollouts_per_s"]
            print(f"N={n}: vllm / hf rollouts/s = {ratio:.2f}")


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    print(f"device={device} cpu_count={os.cpu_count()} affinity={len(os.sched_getaffinity(0))} "
          f"torch_threads={torch.get_num_threads()} shape={args.params or args.shape} "
          f"dtype={args.dtype} "
          f"total={args.total_rollouts} T={args.max_response_tokens} P={args.prompt_chars}")
    print("loadavg before:", Path("/proc/loadavg").read_text().strip())
    if device == "cuda":
        print("gpu:", torch.cuda.get_device_name(0))
    model, tokenizer = build_model(args, device)
    prompts = make_prompts(args.total_rollouts // min(args.n_values), args.prompt_chars, args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.engines.split(","):  # hf first: vLLM's KV pool would inflate hf's RSS
            engine = make_engine(name, model, tokenizer, args, Path(tmp) / "policy")
            # warm-up at full concurrency and full length, so compilation and allocation (the KV
            # cache grows to its full length) stay out of the timings of the first cell
            warm = max(1, min(len(prompts), args.max_concurrent_rollouts // 16))
            engine.generate(prompts[:warm], 16,
                            SamplingConfig(max_response_tokens=args.max_response_tokens))
            for n in args.n_values:
                batch_prompts = prompts[: args.total_rollouts // n]
                rows.append(measure(engine, name, batch_prompts, n, args, device))
                print(json.dumps(rows[-1]), flush=True)
            del engine
    print("loadavg after:", Path("/proc/loadavg").read_text().strip())
    report(rows, device)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
