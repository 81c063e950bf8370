"""One whole RL step of brorl against TRL's `GRPOTrainer`, side by side, at the same P x N.

For each N in `--n` (default 16, 64, 512) with P prompts per step (`--prompts`; default the
paper's ProRL 8 x 16, 4 x 64, and BroRL 2 x 512), each side runs `--warm-steps` RL steps and then
`--steps` timed ones in a FRESH process (so neither side's memory, threads or allocator state
touches the other; the sides alternate: brorl N=16, TRL N=16, brorl N=64, ...), on the same
random-weight tiny policy and CI data (written once into a temporary folder, as
`benchmarks/step_memory.py` does), the same prompts in the same order, the same reward function
and the same update settings. Printed per (N, side): rollouts/s (P x N x timed steps / their
wall seconds) and the mean seconds per step of
- generation: brorl `time/generate_rollouts` (hf engine: each prompt prefilled once, chunks of
  `generate.max_concurrent_rollouts`); TRL `_generate` (prompt tokenisation, one `model.generate`
  over all P x N rows, decoding);
- verification: brorl `time/verify`; TRL `_calculate_rewards`. Both call the same function,
  `brorl.families.verify_batch` with the trainer's workers, time limit and sandbox limits;
- scoring (old and reference log-probs): brorl `update/score_seconds`; TRL the calls of
  `_get_per_token_logps_and_entropies` made inside `_generate_and_score_completions`;
- update (PPO forward, backward, clipping, optimizer): brorl `time/ppo_update` minus
  `update/score_seconds`; TRL `training_step` minus its `_prepare_inputs` (where generation and
  scoring happen), plus `_clip_grad_norm` and `optimizer.step()` (timed by callbacks);
- other: the step's wall seconds minus the four (brorl: prompt sampling, filter bookkeeping;
  TRL: padding, advantages, metrics, shuffling, data loading, scheduler, callbacks).
A TRL step is one generation batch: `mini_batches_per_step x epochs_per_step` optimizer steps,
delimited by `on_step_end` of its last optimizer step. Then the ratio brorl / TRL of rollouts/s
per N. Print the core count and /proc/loadavg beside the figures: other processes skew them.

brorl side: `Run.open(load_params(params/brorl_ci.yaml, overrides))` + `Run.step(Direct())`,
with the filter off (`filter.enabled: false`: TRL has no dynamic sampling, so both sides train
all P x N rollouts), diagnostics off, no evaluation, checkpoint or saved rollouts within the
steps, and `update.prompts_per_step` = P, `update.rollouts_per_prompt` = N,
`generate.max_response_tokens` = `--max-response-tokens`.

TRL side (`GRPOConfig`, read from the same loaded params through `TrainerConfig.from_params`):
`num_generations` = N, `generation_batch_size` = P x N, `per_device_train_batch_size` = the
largest divisor of the mini-batch (P x N / `mini_batches_per_step`) not above
`train.micro_batch_rollouts`, `gradient_accumulation_steps` = mini-batch / that, so TRL makes
`mini_batches_per_step` optimizer steps per generation batch, as brorl; `num_iterations` =
`epochs_per_step`; `learning_rate` = brorl's `update.lr` (after the sqrt rule), constant
(`warmup_steps` as brorl's); AdamW with brorl's betas, eps and weight decay, built the way brorl
builds it (one parameter group, weight decay on every parameter) and set as the trainer's
optimizer; `max_grad_norm`; `temperature`, `top_p`, `top_k` = 0; `max_completion_length`;
`beta` = `kl_coef` (the model is given as the saved folder, from which TRL loads its reference);
`epsilon` / `epsilon_high` = `clip_eps_low` / `clip_eps_high`; `loss_type="dapo"` (token-level
normalisation); `entropy_coef`; `use_bias_correction_kl=False` (brorl does not weight the KL by
the ratio); `scale_rewards="batch"` for brorl's `reinforce_pp_baseline`, `"group"` for `grpo`;
float32, no gradient checkpointing, no dropout change, no logging or saving, `shuffle_dataset`
off. Its dataset's "prompt" column holds the prompts brorl renders (`render_prompt`, plain text)
for the problems brorl's `PromptSampler` draws with the same seed, P per step in the same order;
a "problem_id" column lets the reward function find the problem.

Long prompts (`--prompt-tokens K`): every problem's prompt text in the prepared data is
rewritten as a deterministic filler (`FILLER` repeated, cut) followed by the problem, so that the
rendered prompt is K tokens (the tokenizer is character-level; prompts already at least K long
are kept). Both sides read that data (brorl through `data.path`, TRL through the same sampler),
so the prompts are identical; the verifiers read answers and tests, not the prompt text.

Known differences that remain (the measured work is otherwise the same):
- advantages: brorl's REINFORCE++-baseline is (R - group mean) / std over the batch of the
  group-centred rewards (population std, eps 1e-8); TRL's "batch" scaling divides by the batch
  std of the raw rewards (unbiased, + 1e-4). With `grpo` both use the group std (TRL + 1e-4,
  brorl + 1e-6). Same cost, different values.
- engine -> trainer correction: brorl applies truncated IS (`tis_mode`, min(pi_old / pi_engine,
  cap)) from the engine's sampling log-probs; TRL's correction exists only with vLLM, so the TRL
  side has none (the hf `generate` path returns no log-probs).
- KL: brorl k2 = 0.5 log(pi/ref)^2 with input/output clamps (`kl_estimator`); TRL always k3,
  unclamped. The reference forward, its cost, is the same.
- old log-probs: brorl always scores them; TRL only when `gradient_accumulation_steps` is not a
  multiple of `steps_per_generation x num_iterations`, i.e. with `mini_batches_per_step` > 1 (the
  params' 4): with 1 mini-batch TRL skips that forward and brorl does not.
- token normaliser of the loss: brorl the exact token count of each mini-batch; TRL the
  generation batch's token count x GA / steps_per_generation (the mean per mini-batch).
- generation: brorl's hf engine prefills each prompt once and decodes its N rows on that cache,
  in chunks of `max_concurrent_rollouts`, with its own counter-based sampler; TRL repeats the
  prompt N times and decodes all P x N rows in one `model.generate` (transformers' sampler).
  Responses differ (different random streams) but follow the same distribution, so lengths are
  alike; the table reports mean response lengths.
- scoring and update forwards: brorl runs each distinct prompt once per micro-batch and its
  rows' responses on that cache (`brorl.policy.prefix`); TRL runs prompt + completion for every
  row (left-padded prompts, right-padded completions). This and the generation difference are
  the shared-prompt effect that `--prompt-tokens` makes visible.
- optimizer wrapping: brorl steps through DeepSpeed (ZeRO stage `train.zero_stage`, gradient
  clipping inside `engine.step()`); TRL through accelerate and `torch.nn.utils.clip_grad_norm_`.
- TRL samples with `top_k` = 0 and transformers' `GenerationConfig`; brorl's engine with
  `SamplingConfig` (temperature, top_p): the same distribution.

Usage: python benchmarks/vs_trl.py
       python benchmarks/vs_trl.py --checkpoint outputs/smollm2/model/checkpoint --n 16,512 \
           --prompts 8,1 --steps 1 --max-response-tokens 64
           (a real checkpoint, params/smollm2.yaml's chat-templated prompts and rewards for both
           sides; recorded as vs_trl_checkpoint)
       python benchmarks/vs_trl.py --n 512 --prompt-tokens 128
       python benchmarks/vs_trl.py --n 16,64 --prompts 2,1 --steps 1 --max-response-tokens 8
Deliberately ignored: vLLM on either side, several processes, GPU memory, evaluation and
checkpoints (not part of a step).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from brorl.system.environment import apply_defaults  # noqa: E402

apply_defaults()  # offline, project-local environment defaults, before prefect or mlflow load
from benchmarks.record import Table, announce, save, show  # noqa: E402
from benchmarks.step_memory import PARAMS, check_model_args, prepare  # noqa: E402

DEFAULT_PROMPTS = {16: 8, 64: 4, 512: 2}
"""P per N by default: the paper's ProRL 8 x 16 and BroRL 2 x 512 shapes (CPU-sized, params/),
and 4 x 64 between them."""
FILLER = "Context: the question below is part of a benchmark of long prompts; read it and answer. "
"""Deterministic text put before each problem's prompt to reach `--prompt-tokens`."""
SIDES = ("brorl", "trl")
PARTS = ("generation", "verification", "scoring", "update", "other")
"""The step's time split, in the table's order (see the module docstring)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="16,64,512", help="comma list of N, rollouts per prompt")
    ap.add_argument("--prompts", default=None,
                    help="P per N: one value for all, or a comma list aligned with --n "
                         f"(default {DEFAULT_PROMPTS})")
    ap.add_argument("--prompt-tokens", type=int, default=None,
                    help="make every prompt about K tokens (default: the data's own prompts)")
    ap.add_argument("--steps", type=int, default=3, help="timed RL steps per side and N")
    ap.add_argument("--warm-steps", type=int, default=1, help="untimed RL steps before them")
    ap.add_argument("--max-response-tokens", type=int, default=16)
    ap.add_argument("--micro-batch-rollouts", type=int, default=None,
                    help="train.micro_batch_rollouts (default: the params'); TRL's per-device "
                         "batch follows it")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="a model folder (e.g. the model stage's outputs/smollm2/model/checkpoint) "
                         "instead of the random tiny policy, for both sides: real weights, "
                         "--data-params' chat-templated prompts and rewards; recorded as "
                         "vs_trl_checkpoint")
    ap.add_argument("--data-params", type=Path, default=ROOT / "params" / "smollm2.yaml",
                    help="with --checkpoint: the params file both sides run with (data, prompt "
                         "rendering, sampling, update settings; default params/smollm2.yaml)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--child", choices=SIDES, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-n", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-p", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.n_values = [int(n) for n in args.n.split(",")]
    args.p_values = prompts_per_n(ap, args.n_values, args.prompts)
    if args.steps < 1 or args.warm_steps < 0:
        ap.error("--steps must be >= 1 and --warm-steps >= 0.")
    check_model_args(ap, args)
    return args


def base_params(args: argparse.Namespace) -> Path:
    """The params file both sides run with: `PARAMS`, or `--data-params` with a checkpoint."""
    return PARAMS if args.checkpoint is None else args.data_params


def prompts_per_n(ap: argparse.ArgumentParser, n_values: list[int],
                  prompts: str | None) -> list[int]:
    """P for each N: `--prompts` (one value, or one per N), else `DEFAULT_PROMPTS`."""
    if prompts is None:
        missing = [n for n in n_values if n not in DEFAULT_PROMPTS]
        if missing:
            ap.error(f"no default P for N in {missing}; pass --prompts (one value or one per N).")
        return [DEFAULT_PROMPTS[n] for n in n_values]
    values = [int(p) for p in prompts.split(",")]
    if len(values) == 1:
        return values * len(n_values)
    if len(values) != len(n_values):
        ap.error(f"--prompts has {len(values)} values for {len(n_values)} N; "
                 "give one value, or one per N.")
    return values


# -- the shared data ---------------------------------------------------------------------------
def data_dir(workdir: Path, prompt_tokens: int | None) -> Path:
    return workdir / ("data" if prompt_tokens is None else f"data_{prompt_tokens}")


def lengthen(problem: Any, tokens: int, tokenizer: Any) -> Any:
    """`problem` with `FILLER` (repeated, cut) before its prompt so its rendered prompt has
    `tokens` tokens (one per character); unchanged if it is already that long. Id kept."""
    from dataclasses import replace

    from brorl.families.prompts import render_prompt

    need = tokens - len(tokenizer(render_prompt(problem, tokenizer))["input_ids"])
    if need <= 0:
        return problem
    filler = (FILLER * (need // len(FILLER) + 1))[:need]
    return replace(problem, prompt=filler + problem.prompt)


def write_long_data(workdir: Path, tokens: int) -> None:
    """Every split of `workdir/data` with prompts of `tokens` tokens, into `data_<tokens>`."""
    import datasets
    from transformers import PreTrainedTokenizerFast

    from brorl.data import load_split, save_splits

    tokenizer = PreTrainedTokenizerFast.from_pretrained(workdir / "policy")
    names = list(datasets.load_from_disk(str(workdir / "data")))
    splits = {name: [lengthen(p, tokens, tokenizer) for p in load_split(workdir / "data", name)]
              for name in names}
    save_splits(splits, data_dir(workdir, tokens))


def prompt_lengths(workdir: Path, prompt_tokens: int | None) -> tuple[float, int, int]:
    """(mean, min, max) rendered prompt tokens of the training split both sides draw from."""
    from transformers import PreTrainedTokenizerFast

    from brorl.data import load_split
    from brorl.families.prompts import render_prompt

    tokenizer = PreTrainedTokenizerFast.from_pretrained(workdir / "policy")
    sizes = [len(tokenizer(render_prompt(p, tokenizer))["input_ids"])
             for p in load_split(data_dir(workdir, prompt_tokens), "train")]
    return sum(sizes) / len(sizes), min(sizes), max(sizes)


def check_positions(tokens: int, workdir: Path) -> None:
    """Stop early if the longest prompt plus response exceeds the policy's positions."""
    config = json.loads((workdir / "policy" / "config.json").read_text())
    limit = config["max_position_embeddings"]
    if tokens > limit:
        raise SystemExit(f"the longest prompt plus --max-response-tokens is {tokens} tokens, over "
                         f"the policy's max_position_embeddings = {limit}; lower --prompt-tokens "
                         "or --max-response-tokens.")


def overrides(args: argparse.Namespace, side: str, n: int, p: int) -> list[str]:
    """`key=value` overrides of `PARAMS` for P x N steps with neither filter nor side work."""
    w = args.workdir
    run = w / f"{side}_{n}"
    out = [f"data.path={data_dir(w, args.prompt_tokens)}", f"train.init_checkpoint={w / 'policy'}",
           f"train.run_dir={run}", f"train.checkpoint_dir={run / 'checkpoints'}",
           f"update.prompts_per_step={p}", f"update.rollouts_per_prompt={n}",
           f"generate.max_response_tokens={args.max_response_tokens}",
           "filter.enabled=false", "diagnostics.enabled=false", "train.save_rollouts=false",
           "train.max_rollouts=null", "train.max_seconds=null", "train.plateau_patience=null",
           f"train.steps={10**6}", f"train.eval_every={10**6}",
           f"train.checkpoint_every={10**6}"]
    if args.micro_batch_rollouts is not None:
        out.append(f"train.micro_batch_rollouts={args.micro_batch_rollouts}")
    return out


def load_side_params(args: argparse.Namespace, side: str) -> Any:
    from brorl.params import load_params

    return load_params(base_params(args), overrides(args, side, args.child_n, args.child_p))


def summarise(side: str, args: argparse.Namespace, steps: list[dict[str, float]],
              extra: dict[str, Any]) -> dict[str, Any]:
    """The JSON row of one (side, N): rollouts/s over the timed steps, mean seconds per part."""
    n, p = args.child_n, args.child_p
    wall = sum(s["wall"] for s in steps)
    row: dict[str, Any] = {"side": side, "n": n, "prompts": p, "timed_steps": len(steps),
                           "rollouts_per_s": round(p * n * len(steps) / wall, 2),
                           "step_s": round(wall / len(steps), 3)}
    mean = {part: sum(s.get(part, 0.0) for s in steps) / len(steps) for part in PARTS[:-1]}
    row.update({f"{part}_s": round(seconds, 3) for part, seconds in mean.items()})
    row["other_s"] = round(wall / len(steps) - sum(mean.values()), 3)
    row.update(extra)
    return row


# -- brorl ---------------------------------------------------------------------------------
def brorl_child(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up and timed steps of brorl's own loop in this process; their JSON row."""
    from brorl.train import Direct, Run

    params = load_side_params(args, "brorl")
    run = Run.open(params, ROOT, resume=False)
    for _ in range(args.warm_steps):
        run.step(Direct())
    steps, checks = [], defaultdict(list)
    for _ in range(args.steps):
        started = time.perf_counter()
        m = run.step(Direct())
        wall = time.perf_counter() - started
        score = m.get("update/score_seconds", 0.0)
        steps.append({"wall": wall, "generation": m["time/generate_rollouts"],
                      "verification": m["time/verify"], "scoring": score,
                      "update": m["time/ppo_update"] - score})
        for key in ("update/trained_rollouts", "update/loss", "verify/reward_mean",
                    "generate/response_length_mean", "update/optimizer_steps"):
            checks[key].append(m.get(key, float("nan")))
    mean = {k: sum(v) / len(v) for k, v in checks.items()}
    return summarise("brorl", args, steps, {
        "trained": mean["update/trained_rollouts"], "loss": mean["update/loss"],
        "reward_mean": round(mean["verify/reward_mean"], 4),
        "response_tokens": round(mean["generate/response_length_mean"], 2),
        "optimizer_steps": mean["update/optimizer_steps"], "lr": params.update.lr,
        "score_seconds_reported": "update/score_seconds" in m})


# -- TRL's side: benchmarks/trl_side.py ----------------------------------------------------


# -- the parent ----------------------------------------------------------------------------
def run_child(args: argparse.Namespace, side: str, n: int, p: int, workdir: Path) -> dict:
    """One (side, N) in a fresh interpreter; its JSON row."""
    cmd = [sys.executable, __file__, "--child", side, "--child-n", str(n), "--child-p", str(p),
           "--workdir", str(workdir), "--steps", str(args.steps),
           "--warm-steps", str(args.warm_steps),
           "--max-response-tokens", str(args.max_response_tokens)]
    cmd += ["--prompt-tokens", str(args.prompt_tokens)] if args.prompt_tokens else []
    if args.checkpoint is not None:
        cmd += ["--checkpoint", str(args.checkpoint), "--data-params", str(args.data_params)]
    if args.micro_batch_rollouts is not None:
        cmd += ["--micro-batch-rollouts", str(args.micro_batch_rollouts)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{side} N={n} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(rows: list[dict], prompt_tokens: float) -> list[Table]:
    """The runs' tables: each side's stage seconds per N, brorl/TRL per N, and the sharing table."""
    steps = Table("One RL step per side and N (median over the timed steps)",
                  ["N", "P", "side", "rollouts/s", "gen s", "verify s", "score s", "update s",
                   "other s", "step s", "trained", "resp tok", "reward", "loss"],
                  [[r["n"], r["prompts"], r["side"], round(r["rollouts_per_s"], 1),
                    round(r["generation_s"], 2), round(r["verification_s"], 2),
                    round(r["scoring_s"], 2), round(r["update_s"], 2), round(r["other_s"], 2),
                    round(r["step_s"], 2), int(r["trained"]), round(r["response_tokens"], 1),
                    round(r["reward_mean"], 3), f"{r['loss']:.2e}"] for r in rows])
    ratios = []
    for n in dict.fromkeys(r["n"] for r in rows):
        side = {r["side"]: r for r in rows if r["n"] == n}
        if set(side) == set(SIDES):
            ratio = side["brorl"]["rollouts_per_s"] / side["trl"]["rollouts_per_s"]
            ratios.append([n, side["brorl"]["prompts"], f"{ratio:.2f}x"])
    versus = Table("brorl / TRL rollouts per second of the whole step", ["N", "P", "brorl / TRL"],
                   ratios)
    return [steps, versus, *sharing(rows, prompt_tokens)]


STAGES = {"generation": "generation_s", "scoring": "scoring_s", "update": "update_s"}


def sharing(rows: list[dict], prompt_tokens: float) -> list[Table]:
    """Per side and stage: seconds per rollout at each N against the smallest N, beside the
    limit of sharing the prompt. A stage that runs each prompt once per group costs about
    P/N + T token passes per rollout (P prompt tokens, T response tokens), so the most N can gain
    over N0 is (P/N0 + T) / (P/N + T); `% of limit` is the measured gain over that."""
    n_values = sorted(dict.fromkeys(r["n"] for r in rows))
    if len(n_values) < 2:
        return []
    n0 = n_values[0]
    table = Table(f"Prompt sharing: gain per rollout over N={n0} against its limit (P = "
                  f"{prompt_tokens:.1f} prompt tokens)",
                  ["side", "stage", *(f"N={n}" for n in n_values[1:])], [])
    for side in SIDES:
        by_n = {r["n"]: r for r in rows if r["side"] == side}
        if n0 not in by_n:
            continue
        for stage, key in STAGES.items():
            cells = []
            for n in n_values[1:]:
                if n not in by_n:
                    cells.append("-")
                    continue
                base, row = by_n[n0], by_n[n]
                per = [r[key] / (r["n"] * r["prompts"]) for r in (base, row)]
                t = (base["response_tokens"] + row["response_tokens"]) / 2
                limit = (prompt_tokens / n0 + t) / (prompt_tokens / n + t)
                gain = per[0] / per[1] if per[1] > 0 else float("nan")
                cells.append(f"{gain:.2f}x of {limit:.2f}x = {100 * gain / limit:.0f}%")
            table.rows.append([side, stage, *cells])
        table.rows.append([side, "whole step", *(
            f"{by_n[n]['rollouts_per_s'] / by_n[n0]['rollouts_per_s']:.2f}x" if n in by_n else "-"
            for n in n_values[1:])])
    return [table]


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.child is not None:
        if args.child == "trl":
            from benchmarks.trl_side import trl_child

            row = trl_child(args)
        else:
            row = brorl_child(args)
        print(json.dumps(row), flush=True)
        return []
    if importlib.util.find_spec("trl") is None:
        raise SystemExit("vs_trl.py: TRL is not installed; install the benchmark extra first: "
                         ".venv/bin/pip install -c requirements/constraints.txt -e '.[bench]'")
    announce(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} "
             f"N={args.n_values} P={args.p_values} T={args.max_response_tokens} "
             f"prompt_tokens={args.prompt_tokens} warm={args.warm_steps} steps={args.steps}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        workdir = Path(tmp)
        prepare(workdir, data=base_params(args), policy=args.checkpoint is None)
        if args.checkpoint is not None:  # both sides load "the policy folder"
            (workdir / "policy").symlink_to(args.checkpoint.resolve(), target_is_directory=True)
        if args.prompt_tokens is not None:
            write_long_data(workdir, args.prompt_tokens)
        mean, low, high = prompt_lengths(workdir, args.prompt_tokens)
        print(f"prompt tokens (train split): mean {mean:.1f}, min {low}, max {high}")
        check_positions(high + args.max_response_tokens, workdir)
        for n, p in zip(args.n_values, args.p_values):
            for side in SIDES:
                rows.append(run_child(args, side, n, p, workdir))
                print(json.dumps(rows[-1]), flush=True)
    print("loadavg after:", Path("/proc/loadavg").read_text().strip())
    tables = report(rows, mean)
    show(tables)
    name = "vs_trl_checkpoint" if args.checkpoint is not None else "vs_trl"
    save(name if args.prompt_tokens is None else f"{name}_prompt{args.prompt_tokens}", tables)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
