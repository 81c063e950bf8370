"""Peak memory and rollouts/s of one whole BroRL step versus N (same prompts or rollouts per step).

For each N in `--n` (default 512, 1024, 2048, 4096) a FRESH process runs one step of a tiny
policy (or `--params`' shape) on CI-size data through the project's own loop (`Run.open` +
`Run.step`): generation with the hf engine, verification with the real family verifiers,
filtering, the PPO update. Each N has
its own process so that the peaks do not mix (CPython and glibc keep freed memory mapped).
The data (the `data` stage's `make_splits` of `params/brorl_ci.yaml`) and the random-weight
policy (`build_policy` of its `model` section) are written once into a temporary folder.

Measured per N (Linux /proc; `ru_maxrss` where /proc/self/clear_refs is missing):
- `process_peak`: the process's resident peak over its whole life (VmHWM), setup included;
- `step_peak`, `step_increment`: VmHWM reset to the current RSS just before the step
  (/proc/self/clear_refs), read after it; the increment is that peak minus the RSS before;
- `children_peak`: the largest resident peak of a reaped child (RUSAGE_CHILDREN: the forked
  verifier workers), and whether it was set during the step;
- rollouts/s: rollouts generated / the step's wall seconds (all stages).
It prints the table and the N / 512 ratios of the process peak and of the step increment (the
issue's bar: peak at N = 4096 <= 1.5 x peak at N = 512), with the core count and /proc/loadavg.

The filter is off by default (`filter.enabled: false`): a random policy writing 8 tokens never
answers, every group is uniform, and with the paper's keep rule no step would reach the update.
With it off every step trains all B x N rollouts (advantages 0, the same compute); `--filter`
turns it on. `--subset M` trains M rollouts per group (`update.train_subset`, PODS).
`--warm-steps K` runs K steps before the measured one, leaving out the first step's one-time
allocations (which stay mapped) from the increment.

On a CUDA machine the step runs there (the trainer picks the GPU) and `cuda_peak_mib` is
`torch.cuda.max_memory_allocated` over the step (reset just before it). `--params FILE` takes the
model's shape from that file's `model` section (e.g. `params/shape_qwen2.5-1.5b.yaml`, random
weights, vocabulary from `--vocab-size`); `--total-rollouts R` gives every N the same B x N = R
(B = R / N prompts, the paper's throughput comparison) instead of the same B.

Usage: python benchmarks/step_memory.py
       python benchmarks/step_memory.py --n 512,4096 --prompts 1 --subset 64
       python benchmarks/step_memory.py --n 16,512 --total-rollouts 512 --dtype bfloat16 \
           --params params/shape_qwen2.5-1.5b.yaml --vocab-size 151936 --max-response-tokens 128 \
           --micro-batch-rollouts 16 --warm-steps 1                     (GPU, Qwen2.5-1.5B's shape)
       python benchmarks/step_memory.py --checkpoint outputs/smollm2/model/checkpoint \
           --n 16,128 --total-rollouts 128 --max-response-tokens 64 --micro-batch-rollouts 64 \
           --max-tokens-per-micro-batch off,auto
           (a real checkpoint with params/smollm2.yaml's prompts and rewards; each N once with
           row-padded micro-batches and once by token budget; recorded as step_memory_checkpoint)
`--max-tokens-per-micro-batch` takes a comma list: each N runs once per value, and a table gives
each value's update throughput against `off` (the row-padded layout) at the same N.
Deliberately ignored: the vllm engine, evaluation and checkpoints (not part of a step).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import Table, announce, save, show  # noqa: E402

PARAMS = ROOT / "params" / "brorl_ci.yaml"
"""The CI BroRL arm: tiny model, CI data; B, N and sizes are overridden from the command line."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="512,1024,2048,4096", help="comma list of rollouts per prompt")
    ap.add_argument("--prompts", type=int, default=2, help="B, prompts per step (equal for all N)")
    ap.add_argument("--max-response-tokens", type=int, default=8)
    ap.add_argument("--subset", type=int, default=None,
                    help="update.train_subset M: train M rollouts per group (PODS)")
    ap.add_argument("--max-concurrent-rollouts", type=int, default=256, help="hf decode chunk")
    ap.add_argument("--micro-batch-rollouts", type=int, default=64, help="rows per forward")
    ap.add_argument("--filter", action="store_true", help="dynamic sampling on (default off)")
    ap.add_argument("--warm-steps", type=int, default=0,
                    help="steps run before the measured one (their one-time costs excluded)")
    ap.add_argument("--total-rollouts", type=int, default=None,
                    help="B = this / N prompts for each N (equal rollouts per step, not equal B)")
    ap.add_argument("--params", type=Path, default=None,
                    help="the model's shape from this params file's `model` section")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="vocabulary with --params (default: the character tokenizer's)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="train.dtype (bfloat16 on a GPU)")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="a model folder (e.g. the model stage's outputs/smollm2/model/checkpoint) "
                         "instead of a random policy: real weights, its chat-templated prompts "
                         "from --data-params, real rewards; recorded as step_memory_checkpoint")
    ap.add_argument("--data-params", type=Path, default=ROOT / "params" / "smollm2.yaml",
                    help="with --checkpoint: the params file whose data, prompt and sampling "
                         "settings the step runs with (default params/smollm2.yaml)")
    ap.add_argument("--max-tokens-per-micro-batch", default="auto",
                    help="update.max_tokens_per_micro_batch: auto, off (null: row-padded) or a "
                         "number; a comma list runs each N once per value")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.n_values = [int(n) for n in args.n.split(",")]
    args.budgets = args.max_tokens_per_micro_batch.split(",")
    args.budget = args.budgets[0]
    check_model_args(ap, args)
    bad = [n for n in args.n_values if args.total_rollouts and args.total_rollouts % n
           and args.child is None]
    if bad:
        ap.error(f"--total-rollouts {args.total_rollouts} is not a multiple of N in {bad}")
    return args


def check_model_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A benchmark's `--checkpoint` must be a model folder, and not given beside `--params`
    (both name the model); one line and exit 2 otherwise."""
    if args.checkpoint is not None and not (args.checkpoint / "config.json").is_file():
        ap.error(f"--checkpoint {args.checkpoint}: no config.json there; pass a model folder "
                 "(make real's outputs/smollm2/model/checkpoint, or `brorl model`'s)")
    if args.checkpoint is not None and getattr(args, "params", None) is not None:
        ap.error("--checkpoint and --params both give the model: pass one")


def prompts_for(args: argparse.Namespace, n: int) -> int:
    """B for N = `n`: `--total-rollouts` / N if given, else `--prompts`."""
    return args.total_rollouts // n if args.total_rollouts else args.prompts


def base_params(args: argparse.Namespace) -> Path:
    """The params file a step runs with: `PARAMS` (tiny policy), or `--data-params` with a
    `--checkpoint`."""
    return PARAMS if args.checkpoint is None else args.data_params


def overrides(args: argparse.Namespace, n: int, workdir: Path) -> list[str]:
    """`key=value` overrides of `base_params` for one step of B x N in `workdir`."""
    policy = args.checkpoint.resolve() if args.checkpoint is not None else workdir / "policy"
    out = [f"data.path={workdir / 'data'}", f"train.init_checkpoint={policy}",
           f"train.run_dir={workdir / f'run_{n}'}",
           f"train.checkpoint_dir={workdir / f'run_{n}' / 'checkpoints'}",
           f"update.prompts_per_step={prompts_for(args, n)}", f"update.rollouts_per_prompt={n}",
           f"generate.max_response_tokens={args.max_response_tokens}",
           f"generate.max_concurrent_rollouts={args.max_concurrent_rollouts}",
           f"train.micro_batch_rollouts={args.micro_batch_rollouts}",
           f"filter.enabled={str(args.filter).lower()}", "train.max_rollouts=null",
           "train.steps=1000", "train.eval_every=1000", "train.checkpoint_every=1000",
           "train.save_rollouts=false", f"train.dtype={args.dtype}",
           "update.max_tokens_per_micro_batch="
           + ("null" if args.budget == "off" else args.budget)]
    if args.subset is not None:
        out.append(f"update.train_subset={args.subset}")
    return out


def prepare(workdir: Path, shape: Path | None = None, vocab_size: int | None = None,
            data: Path = PARAMS, policy: bool = True) -> None:
    """The data splits of params file `data` (the CI ones by default) and, with `policy`, a
    random-weight policy (the CI tiny one, or the `model` section of params file `shape` with
    `vocab_size`), as the `data` stage and `build_policy` make them, under `workdir`."""
    import datasets
    import transformers

    from brorl.data import DataConfig, make_splits, save_splits
    from brorl.params import load_params
    from brorl.policy import build_policy, build_tokenizer, save_policy

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    save_splits(make_splits(DataConfig.from_params(load_params(data).data)), workdir / "data")
    if not policy:
        return
    params = load_params(PARAMS)
    tokenizer = build_tokenizer()
    model_params = load_params(shape).model if shape else params.model
    model = build_policy(vocab_size=vocab_size or len(tokenizer), **model_params.tiny_sizes)
    save_policy(model, tokenizer, workdir / "policy")


def status_kib(field: str) -> int | None:
    """A `/proc/self/status` field in KiB (VmRSS, VmHWM), None where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child(args: argparse.Namespace) -> dict:
    """One step of B x N (`args.child`) in this process; its figures in MiB and seconds."""
    from brorl.params import load_params
    from brorl.train import Direct, Run

    n = args.child
    run = Run.open(load_params(base_params(args), overrides(args, n, args.workdir)), ROOT,
                   resume=False)
    for _ in range(args.warm_steps):
        run.step(Direct())
    setup_peak = status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    exact = reset_peak()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = status_kib("VmRSS") or 0
    started = time.perf_counter()
    metrics = run.step(Direct())
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    cuda_peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    step_peak = status_kib("VmHWM") if exact else resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rollouts = int(metrics["generate/rollouts"])
    mib = 1 / 1024
    return {
        "n": n, "prompts": prompts_for(args, n), "rollouts": rollouts,
        "trained": int(metrics.get("update/trained_rollouts", 0)),  # 0: update skipped
        "seconds": round(seconds, 2), "rollouts_per_s": round(rollouts / seconds, 1),
        "process_peak_mib": round(max(setup_peak, step_peak) * mib, 1),
        "step_peak_mib": round(step_peak * mib, 1), "rss_before_mib": round(before * mib, 1),
        "step_increment_mib": round((step_peak - before) * mib, 1),
        "children_peak_mib": round(children * mib, 1),
        "children_peak_in_step": children > children_before, "exact_peak": exact,
        "cuda_peak_mib": None if cuda_peak is None else round(cuda_peak, 1),
        "stage_seconds": {k.removeprefix("time/"): round(v, 2) for k, v in metrics.items()
                          if k.startswith("time/")},
        "budget": args.budget, "update_s": round(metrics.get("update/seconds", 0.0), 2),
        "score_s": round(metrics.get("update/score_seconds", 0.0), 2),
        "tokens_per_s": round(metrics.get("perf/tokens_per_s", 0.0), 1),
        "padding_share": round(metrics.get("perf/padding_share", 0.0), 3),
        "mfu": metrics.get("perf/mfu"),
    }


def run_child(args: argparse.Namespace, n: int, workdir: Path) -> dict:
    """`child` for N = `n` in a fresh interpreter; its JSON row."""
    cmd = [sys.executable, __file__, "--child", str(n), "--workdir", str(workdir),
           "--max-tokens-per-micro-batch", args.budget, "--data-params", str(args.data_params),
           "--prompts", str(args.prompts), "--max-response-tokens", str(args.max_response_tokens),
           "--max-concurrent-rollouts", str(args.max_concurrent_rollouts),
           "--micro-batch-rollouts", str(args.micro_batch_rollouts),
           "--warm-steps", str(args.warm_steps)]
    cmd += ["--subset", str(args.subset)] if args.subset is not None else []
    cmd += ["--total-rollouts", str(args.total_rollouts)] if args.total_rollouts else []
    cmd += ["--dtype", args.dtype]
    cmd += ["--filter"] if args.filter else []
    cmd += ["--checkpoint", str(args.checkpoint)] if args.checkpoint is not None else []
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"N={n} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(rows: list[dict]) -> list[Table]:
    """Per N and micro-batch budget: the step's size, seconds, memory, split and the update's
    throughput; then each N against N = 512, and each budget against `off` (row-padded)."""
    step = Table("One whole RL step per N, each in a fresh process",
                 ["N", "B", "micro-batch tokens", "rollouts", "trained", "s", "rollouts/s",
                  "process MiB", "before MiB", "step peak MiB", "step +MiB", "children MiB",
                  "CUDA peak MiB", "split (s)"],
                 [[r["n"], r["prompts"], r["budget"], r["rollouts"], r["trained"],
                   round(r["seconds"], 1), round(r["rollouts_per_s"], 1),
                   round(r["process_peak_mib"], 1), round(r["rss_before_mib"], 1),
                   round(r["step_peak_mib"], 1), round(r["step_increment_mib"], 1),
                   f"{r['children_peak_mib']:.1f}" + ("" if r["children_peak_in_step"] else
                                                      " (setup)"),
                   round(r["cuda_peak_mib"]) if r["cuda_peak_mib"] else "-",
                   ", ".join(f"{k} {v:.2f}" for k, v in r["stage_seconds"].items())]
                  for r in rows])
    update = Table("The update of that step (`perf/*`, `update/*` metrics)",
                   ["N", "micro-batch tokens", "update s", "of it scoring s", "tokens/s",
                    "padding share", "MFU"],
                   [[r["n"], r["budget"], r["update_s"], r["score_s"], r["tokens_per_s"],
                     r["padding_share"], "-" if r["mfu"] is None else f"{r['mfu']:.3f}"]
                    for r in rows])
    tables = [step, update]
    first = rows[0]["budget"]
    same = [r for r in rows if r["budget"] == first]
    base = next((r for r in same if r["n"] == 512), same[0])

    def ratio(row: dict, key: str) -> str:
        return f"{row[key] / base[key]:.2f}" if base[key] else "n/a"

    if len(same) > 1:
        tables.append(Table(
            f"Each N against N = {base['n']} (micro-batch tokens {first})",
            ["N", "process peak", "step increment", "children peak", "rollouts/s", "CUDA peak"],
            [[r["n"], ratio(r, "process_peak_mib"), ratio(r, "step_increment_mib"),
              ratio(r, "children_peak_mib"), ratio(r, "rollouts_per_s"),
              ratio(r, "cuda_peak_mib") if base["cuda_peak_mib"] else "-"]
             for r in same if r is not base]))
    padded = {r["n"]: r for r in rows if r["budget"] == "off"}
    against = [[r["n"], r["budget"], f"{r['tokens_per_s'] / padded[r['n']]['tokens_per_s']:.2f}",
                f"{padded[r['n']]['update_s'] / r['update_s']:.2f}" if r["update_s"] else "n/a",
                f"{padded[r['n']]['padding_share']:.3f} -> {r['padding_share']:.3f}"]
               for r in rows if r["budget"] != "off" and r["n"] in padded
               and padded[r["n"]]["tokens_per_s"]]
    if against:
        tables.append(Table("Token-budget micro-batches against row-padded ones (`off`), same N",
                            ["N", "micro-batch tokens", "update tokens/s ratio",
                             "update speed-up", "padding share"], against))
    return tables


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args)), flush=True)
        return []
    announce(f"device={'cuda' if torch.cuda.is_available() else 'cpu'} dtype={args.dtype} "
             f"model={args.checkpoint or args.params or PARAMS} total={args.total_rollouts} "
             f"B={args.prompts} micro-batch tokens={args.max_tokens_per_micro_batch} "
             f"T={args.max_response_tokens} chunk={args.max_concurrent_rollouts} "
             f"micro={args.micro_batch_rollouts} subset={args.subset} filter={args.filter}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="step_memory_") as tmp:
        prepare(Path(tmp), args.params, args.vocab_size, data=base_params(args),
                policy=args.checkpoint is None)
        for budget in args.budgets:
            args.budget = budget
            for n in args.n_values:
                rows.append(run_child(args, n, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
    print("loadavg after:", Path("/proc/loadavg").read_text().strip())
    tables = report(rows)
    show(tables)
    save("step_memory_checkpoint" if args.checkpoint else "step_memory", tables)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
