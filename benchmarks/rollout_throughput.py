"""Rollout throughput versus N at a fixed total, each engine beside plain `generate`.

For each prompt set (`--prompts`: `data`, the CI data's rendered training prompts, and/or a
number, random prompts of that many tokens), each engine (hf, plain, vllm) and each N in
{16, 64, 256, 512, 1024}, generate the SAME total number of rollouts (B = total / N prompts, the
first B of the set), with the same model and sampling, and measure rollouts/s, tokens/s (median
of `--repeats` runs) and peak memory (process RSS high-water mark on CPU, reset before each cell
through /proc/self/clear_refs; torch.cuda.max_memory_allocated on GPU, which for vLLM excludes
its preallocated KV pool). `plain` is the naive baseline: transformers' `generate` with each
prompt repeated N times (TRL's path without vLLM), as many rows per call as the hf engine
decodes at once (`--max-concurrent-rollouts`, the rows of each printed per N), sampling at the
same temperature and top-p (no top-k), EOS ending a row.
Prints one table per prompt set with the engines side by side and hf / plain (and vllm / hf) per N,
the N=512 / N=16 ratio per engine (the paper: 72.4 / 36.5 = 1.98 on H100, BroRL Table 2), with the
core count and /proc/loadavg before and after (other processes on the machine skew the figures), and
records the tables (`benchmarks/record.py`, name `rollout_throughput`).

Every engine decodes `--max-concurrent-rollouts` rows per call (on CUDA the hf engine fewer
only where they would not fit the free memory); `--max-concurrent-rollouts auto` lets the hf
engine size its chunk from the free memory on CUDA (plain and vllm then take 256).
`--compile` sets the hf engine's `generate.compile` (`auto`: compiled on CUDA only).

Runs unchanged on a CUDA machine with `vllm` installed: the device is chosen from what is present.
The model is built from config with random weights (no download); `--shape qwen2.5-1.5b` gives
Qwen2.5-1.5B's shape; `--checkpoint` takes a model folder instead (real weights, varied
response lengths). Its vocabulary is wider than the character tokenizer's, which only affects
decoded texts (ids beyond the tokenizer are dropped), not the compute measured.

Usage: python benchmarks/rollout_throughput.py --engines hf,plain
       python benchmarks/rollout_throughput.py --quick
       python benchmarks/rollout_throughput.py --shape qwen2.5-1.5b --max-response-tokens 1024
       python benchmarks/rollout_throughput.py --params params/shape_qwen2.5-1.5b.yaml \
           --vocab-size 151936 --max-response-tokens 1024      (the shape from a params file)
       python benchmarks/rollout_throughput.py --checkpoint outputs/smollm2/model/checkpoint \
           --data-params params/smollm2_ci.yaml --n-values 16,256 --total-rollouts 256
           (a real checkpoint and its chat-templated training prompts; recorded apart, as
           rollout_throughput_checkpoint)
Deliberately ignored: the trainer side of a step, multi-GPU engines.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # brorl and benchmarks.record
from benchmarks.record import Table, announce, save  # noqa: E402
from benchmarks.step_memory import check_model_args  # noqa: E402
from brorl.engines import build_engine  # noqa: E402
from brorl.engines.base import (  # noqa: E402
    AUTO_ROWS,
    EngineConfig,  # noqa: E402
    SamplingConfig,
)
from brorl.engines.decode import prompt_width  # noqa: E402
from brorl.engines.hf import HfEngine  # noqa: E402
from brorl.policy import build_policy, build_tokenizer, load_policy, load_tokenizer, save_policy  # noqa: E402
from brorl.policy.prefix import left_pad  # noqa: E402
from brorl.policy.tokens import encode_prompts, model_stop_ids, pad_id  # noqa: E402

SHAPES = {
    # name: (hidden, layers, heads, kv_heads, intermediate, vocab or None = tokenizer's)
    "tiny": (64, 2, 2, 1, 128, None),
    "small": (512, 4, 8, 2, 1376, None),
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151_936),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151_936),
}
"""Model shapes built from config; the Qwen2.5 rows follow their public config.json files."""


def _rows(text: str) -> int | str:
    """`--max-concurrent-rollouts`: a row count or `auto`."""
    return text if text == "auto" else int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="hf,plain", help="comma list of hf, plain, vllm")
    ap.add_argument("--prompts", default=None,
                    help="comma list of prompt sets: data (the CI data's training prompts, "
                         "--data-params) or a number (random prompts of that many tokens); "
                         "default data,128 (data with --checkpoint)")
    ap.add_argument("--data-params", type=Path, default=Path("params/tiny_ci.yaml"),
                    help="params file whose `data` section makes the `data` prompt set")
    ap.add_argument("--n-values", default="16,64,256,512,1024", help="rollouts per prompt")
    ap.add_argument("--total-rollouts", type=int, default=2048, help="B*N, equal for every N")
    ap.add_argument("--max-response-tokens", type=int, default=64)
    ap.add_argument("--max-concurrent-rollouts", type=_rows, default=256,
                    help="hf chunk / plain rows per call / vllm max_num_seqs (equal rows per "
                         "call); auto: the hf chunk sized from free memory on CUDA, else 256")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="hf: generate.compile, the compiled decode step (auto: on CUDA only)")
    ap.add_argument("--stop-check-tokens", type=int, default=8,
                    help="hf: generate.stop_check_tokens, decode steps between stop checks")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="a model folder (config.json, weights, tokenizer; e.g. the model "
                         "stage's outputs/smollm2/model/checkpoint) instead of a shape with "
                         "random weights; its tokenizer renders the data prompts (its chat "
                         "template)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--params", type=Path, default=None,
                    help="take the model shape from this params file's `model` section instead "
                         "(e.g. params/shape_qwen2.5-1.5b.yaml); the vocabulary from --vocab-size")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="vocabulary size with --params (default: the character tokenizer's)")
    ap.add_argument("--num-layers", type=int, default=None, help="override the shape's layer count")
    ap.add_argument("--temperature", type=float, default=1.2,
                    help="ProRL v1: 1.2 (ProRL (arXiv 2505.24864) §3.2)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus top-p (1: off)")
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
    check_model_args(ap, args)
    args.prompts = args.prompts or ("data" if args.checkpoint else "data,128")
    if args.quick:
        args.total_rollouts, args.max_response_tokens, args.prompts = 1024, 16, "data"
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


def build_model(args: argparse.Namespace, device: str, max_len: int):
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if args.checkpoint is not None:
        return load_policy(args.checkpoint, dtype=dtype, device=device)
    tokenizer = build_tokenizer()
    hidden, layers, heads, kv, inter, vocab = shape_of(args)
    model = build_policy(
        vocab_size=vocab or len(tokenizer), hidden_size=hidden,
        num_layers=args.num_layers or layers,
        num_heads=heads, num_kv_heads=kv, intermediate_size=inter,
        max_position_embeddings=max_len, seed=args.seed,
    )
    return model.to(device=device, dtype=dtype), tokenizer


def make_prompts(count: int, chars: int, seed: int) -> list[str]:
    """`count` distinct printable prompts of `chars` characters (one token per character)."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789+-*= "
    return ["".join(rng.choice(alphabet) for _ in range(chars)) for _ in range(count)]


def data_prompts(params: Path, tokenizer) -> list[str]:
    """The training prompts of the data `params` describes, rendered as the trainer renders
    them (`brorl.families.prompts.render_prompt`), in the split's order."""
    from brorl.data import DataConfig, make_splits
    from brorl.families.prompts import render_prompt
    from brorl.params import load_params

    problems = make_splits(DataConfig.from_params(load_params(params).data))["train"]
    return [render_prompt(p, tokenizer) for p in problems]


def prompt_sets(args: argparse.Namespace, tokenizer) -> dict[str, list[str]]:
    """Name -> prompts, enough for the smallest N (`--prompts`)."""
    count = args.total_rollouts // min(args.n_values)
    sets = {}
    for name in args.prompts.split(","):
        if name == "data":
            prompts = data_prompts(args.data_params, tokenizer)
            if len(prompts) < count:
                raise SystemExit(f"{args.data_params} makes {len(prompts)} training prompts; "
                                 f"N={min(args.n_values)} needs {count}: raise --n-values' "
                                 "smallest N or lower --total-rollouts.")
            sets["data"] = prompts[:count]
        else:
            sets[f"{int(name)}-token"] = make_prompts(count, int(name), args.seed)
    return sets


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


class PlainGenerate:
    """The naive baseline: transformers' `generate` on each prompt repeated N times, `rows` rows
    per call, sampling as the engines do (temperature, top-p, no top-k); a row ends at any stop
    id. Returns the response lengths, the figures the benchmark needs."""

    def __init__(self, model, tokenizer, rows: int) -> None:
        self.model, self.tokenizer, self.rows = model, tokenizer, rows
        self.stop_ids = list(model_stop_ids(model, tokenizer))
        self.pad_id = pad_id(tokenizer)

    @torch.inference_mode()
    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig):
        from types import SimpleNamespace

        repeated = [ids for ids in encode_prompts(self.tokenizer, prompts) for _ in range(n)]
        device = next(self.model.parameters()).device
        torch.manual_seed(sampling.seed)
        lengths = []
        for start in range(0, len(repeated), self.rows):
            ids, mask, _ = left_pad(repeated[start:start + self.rows])
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=mask.long().to(device),
                do_sample=sampling.temperature > 0, temperature=sampling.temperature or None,
                top_p=sampling.top_p, top_k=0, max_new_tokens=sampling.max_response_tokens,
                eos_token_id=self.stop_ids, pad_token_id=self.pad_id)
            new = out[:, ids.shape[1]:].cpu()
            stops = torch.isin(new, torch.tensor(self.stop_ids))
            first = torch.where(stops.any(1), stops.int().argmax(1) + 1, new.shape[1])
            lengths.append(first)
        lengths = torch.cat(lengths)
        return SimpleNamespace(num_rollouts=len(repeated), response_lengths=lengths)


def make_engine(name: str, model, tokenizer, args: argparse.Namespace, folder: Path,
                max_len: int):
    if name == "plain":
        return PlainGenerate(model, tokenizer, fixed_rows(args))
    if name == "vllm":
        save_policy(model, tokenizer, folder)
    config = EngineConfig(
        kind=name, max_concurrent_rollouts=args.max_concurrent_rollouts, compile=args.compile,
        stop_check_tokens=args.stop_check_tokens, dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, cpu_kv_cache_gib=args.cpu_kv_cache_gib,
        enforce_eager=args.enforce_eager, seed=args.seed)
    return build_engine(config, model=model, tokenizer=tokenizer, model_path=folder,
                        max_model_len=max_len, cpu_threads=args.cpu_threads)


def rows_per_call(engine, name: str, prompts: list[str], n: int, args, device: str) -> int:
    """Rows one engine call decodes at once (the hf engine's chunk is sized on CUDA)."""
    if isinstance(engine, HfEngine):
        from brorl.engines.hf import cuda_free_bytes

        longest = max(len(ids) for ids in encode_prompts(engine.tokenizer, prompts))
        free = cuda_free_bytes(torch.device(device)) if device == "cuda" else None
        tokens = prompt_width(longest) + args.max_response_tokens
        return engine.chunk_rows(len(prompts) * n, tokens, free)
    return min(fixed_rows(args), len(prompts) * n)


def fixed_rows(args: argparse.Namespace) -> int:
    """Rows per call of plain `generate` (and vllm's `max_num_seqs`): the knob, `AUTO_ROWS` for
    auto."""
    knob = args.max_concurrent_rollouts
    return AUTO_ROWS if knob == "auto" else knob


def measure(engines: dict, prompts: list[str], n: int, args, device: str) -> list[dict]:
    """One cell per engine: `--repeats` runs each, the engines taking turns run by run (same
    seed each time: identical work, so the median is fair)."""
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p,
                              max_response_tokens=args.max_response_tokens, seed=args.seed)
    times: dict[str, list[float]] = {name: [] for name in engines}
    peaks: dict[str, float] = {}
    batches = {}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            if device == "cuda":
                torch.cuda.synchronize()
            reset_peak(device)
            start = time.perf_counter()
            batches[name] = engine.generate(prompts, n, sampling)
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
            peaks[name] = max(peaks.get(name, 0.0), peak_mib(device))
    rows = []
    for name, engine in engines.items():
        seconds, batch = statistics.median(times[name]), batches[name]
        tokens = int(batch.response_lengths.sum())
        rows.append({
            "engine": name, "n": n, "prompts": len(prompts), "rollouts": batch.num_rollouts,
            "rows_per_call": rows_per_call(engine, name, prompts, n, args, device),
            "tokens": tokens, "seconds": round(seconds, 3),
            "rollouts_per_s": round(batch.num_rollouts / seconds, 1),
            "tokens_per_s": round(tokens / seconds, 1), "peak_mib": round(peaks[name], 1),
            "seconds_all": [round(t, 3) for t in times[name]],
        })
    return rows


def table(setting: str, rows: list[dict], device: str, model: str = "") -> Table:
    """The engines side by side per N, with hf / plain (and vllm / hf) rollouts/s."""
    by = {(r["engine"], r["n"]): r for r in rows}
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    columns = ["N", "B"] + [f"{e} rollouts/s" for e in engines]
    ratios = [(a, b) for a, b in (("hf", "plain"), ("vllm", "hf")) if a in engines and b in engines]
    columns += [f"{a} / {b}" for a, b in ratios]
    columns += [f"{e} rows/call" for e in engines]
    mem = "peak CUDA MiB" if device == "cuda" else "peak RSS MiB"
    columns += [f"{e} {mem}" for e in engines]
    out = []
    for n in dict.fromkeys(r["n"] for r in rows):
        cells = [by[e, n] for e in engines]
        out.append([n, cells[0]["prompts"]] + [c["rollouts_per_s"] for c in cells]
                   + [round(by[a, n]["rollouts_per_s"] / by[b, n]["rollouts_per_s"], 2)
                      for a, b in ratios]
                   + [c["rows_per_call"] for c in cells] + [c["peak_mib"] for c in cells])
    notes = []
    for e in engines:
        if (e, 512) in by and (e, 16) in by:
            ratio = by[e, 512]["rollouts_per_s"] / by[e, 16]["rollouts_per_s"]
            notes.append(f"{e}: N=512 / N=16 rollouts/s = {ratio:.2f} "
                         "(paper, H100: 72.4/36.5 = 1.98)")
    return Table(f"Rollouts/s, {setting} prompts{model}", columns, out, notes)


def print_table(t: Table) -> None:
    widths = [max(len(str(c)), *(len(str(r[i])) for r in t.rows)) for i, c in enumerate(t.columns)]
    print(f"\n{t.title}")
    print("  ".join(str(c).rjust(w) for c, w in zip(t.columns, widths)))
    for row in t.rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(row, widths)))
    for note in t.notes:
        print(note)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    before = announce(f"device={device} torch_threads={torch.get_num_threads()} "
                      f"model={args.checkpoint or args.params or args.shape} dtype={args.dtype} "
                      f"engines={args.engines} prompts={args.prompts} total={args.total_rollouts} "
                      f"T={args.max_response_tokens} rows/call={args.max_concurrent_rollouts}")
    if device == "cuda":
        print("gpu:", torch.cuda.get_device_name(0))
    tokenizer = load_tokenizer(args.checkpoint) if args.checkpoint else build_tokenizer()
    sets = prompt_sets(args, tokenizer)
    longest = max(len(p) for prompts in sets.values() for p in prompts)  # characters >= tokens
    max_len = longest + args.max_response_tokens + 16
    model, tokenizer = build_model(args, device, max_len)
    names = args.engines.split(",")
    rows: dict[str, list[dict]] = {setting: [] for setting in sets}
    with tempfile.TemporaryDirectory() as tmp:
        # hf and plain take turns cell by cell (the same spell of the machine); vllm runs after
        # them, its KV pool would otherwise inflate their RSS
        groups = [[e for e in names if e != "vllm"], [e for e in names if e == "vllm"]]
        for group in filter(None, groups):
            engines = {e: make_engine(e, model, tokenizer, args, Path(tmp) / "policy", max_len)
                       for e in group}
            for setting, prompts in sets.items():
                # warm-up at full concurrency and full length, with the measured temperature and
                # top-p (the compiled hf step's constants), so compilation and allocation stay
                # out of the timings of the first cell
                warm = max(1, min(len(prompts), fixed_rows(args) // 16))
                for engine in engines.values():
                    engine.generate(prompts[:warm], 16, SamplingConfig(
                        temperature=args.temperature, top_p=args.top_p, seed=0,
                        max_response_tokens=args.max_response_tokens))
                for n in args.n_values:
                    cells = measure(engines, prompts[: args.total_rollouts // n], n, args, device)
                    for cell in cells:
                        print(json.dumps({"prompts_set": setting, **cell}), flush=True)
                    rows[setting] += cells
            del engines
    after = Path("/proc/loadavg").read_text().strip()
    print("loadavg after:", after)
    model_name = f", {type(model).__name__} from {args.checkpoint}" if args.checkpoint else ""
    tables = [table(setting, cells, device, model_name) for setting, cells in rows.items()]
    for t in tables:
        t.notes.append(f"loadavg before {before}; after {after}; torch threads "
                       f"{torch.get_num_threads()}; T={args.max_response_tokens}, "
                       f"temperature {args.temperature}, {args.total_rollouts} rollouts a cell")
        print_table(t)
    save("rollout_throughput_checkpoint" if args.checkpoint else "rollout_throughput", tables)
    flat = [{"prompts_set": s, **c} for s, cells in rows.items() for c in cells]
    if args.json:
        args.json.write_text(json.dumps(flat, indent=1))
    return flat


if __name__ == "__main__":
    main()
