"""TRL's side of `benchmarks/vs_trl.py`: its `GRPOTrainer` set up like brorl's step and timed by
stage (the module docstring of vs_trl.py lists what is matched and what still differs).

`trl_child` runs in a fresh process (`vs_trl.py --child trl`): it builds the trainer from the
same params, data and policy folder as brorl's side, swaps in brorl's AdamW, wraps the reward
function and the trainer's stages with a `StepClock`, trains warm-up plus timed RL steps and
returns the same JSON row as brorl's side (`vs_trl.summarise`).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.vs_trl import data_dir, load_side_params, summarise


class StepClock:
    """Seconds (and counters) by part, cut into RL steps at `boundary()`."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        self.cuts: list[tuple[float, dict[str, float]]] = []
        self.scoring_phase = False
        """True inside `_generate_and_score_completions`: log-prob forwards there are scoring."""

    def add(self, part: str, value: float) -> None:
        self.parts[part] += value

    def boundary(self) -> None:
        """End the current RL step: keep its time stamp and parts, start the next one empty."""
        self.cuts.append((time.perf_counter(), dict(self.parts)))
        self.parts = defaultdict(float)

    def timed(self, fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        """`fn` with its seconds added to `part`."""
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.add(part, time.perf_counter() - started)
        return wrapper

    def steps(self) -> list[dict[str, float]]:
        """One record per RL step: `wall` (between its boundaries) and its parts."""
        return [{"wall": end - start, **parts}
                for (start, _), (end, parts) in zip(self.cuts, self.cuts[1:])]


def trl_batch_shape(p: int, n: int, mini_batches: int, micro: int) -> tuple[int, int]:
    """(per_device_train_batch_size, gradient_accumulation_steps): the largest divisor of the
    mini-batch P x N / mini_batches not above `micro`, and the micro-batches per mini-batch."""
    rows = p * n // mini_batches
    size = max(d for d in range(1, min(rows, micro) + 1) if rows % d == 0)
    return size, rows // size


def trl_dataset(config: Any, data: Path, steps: int, tokenizer: Any) -> tuple[Any, dict]:
    """The prompts brorl draws for `steps` steps, in order (its sampler, its seed), rendered
    as brorl renders them; and the problems by id for the reward."""
    from datasets import Dataset

    from brorl.data import load_split
    from brorl.families.prompts import render_prompt
    from brorl.train.sampler import PromptSampler

    problems = load_split(data, "train")
    chosen = PromptSampler(problems, config.seed).take(config.prompts_per_step * steps)
    table = Dataset.from_dict({"prompt": [render_prompt(q, tokenizer) for q in chosen],
                               "problem_id": [q.id for q in chosen]})
    return table, {q.id: q for q in problems}


def trl_reward(config: Any, problems: dict, clock: StepClock) -> Callable[..., list[float]]:
    """TRL reward function calling brorl's verifier exactly as `Trainer.verify` does."""
    from brorl.families import verify_batch

    verify = functools.partial(verify_batch, config=config.verify)

    def brorl_verifier(prompts: list, completions: list[str], problem_id: list[str],
                       **_: Any) -> list[float]:
        rewards = [v.reward for v in verify([problems[i] for i in problem_id], completions)]
        clock.add("reward_sum", sum(rewards))
        clock.add("reward_n", len(rewards))
        return rewards

    return brorl_verifier


def trl_config(config: Any, args: argparse.Namespace, output_dir: Path) -> Any:
    """`GRPOConfig` with brorl's settings (see the module docstring)."""
    from trl import GRPOConfig

    c, loss = config, config.loss
    size, accumulation = trl_batch_shape(c.prompts_per_step, c.rollouts_per_prompt,
                                         c.mini_batches_per_step, c.micro_batch_rollouts)
    steps = (args.warm_steps + args.steps) * c.mini_batches_per_step * c.epochs_per_step
    scale = {"reinforce_pp_baseline": "batch", "grpo": "group"}[c.advantage_estimator]
    return GRPOConfig(
        output_dir=str(output_dir), use_cpu=True, report_to="none", seed=c.seed,
        bf16=False, fp16=False, gradient_checkpointing=False, disable_tqdm=True,
        logging_strategy="no", save_strategy="no", shuffle_dataset=False,
        dataloader_num_workers=0, max_steps=steps,
        num_generations=c.rollouts_per_prompt,
        generation_batch_size=c.prompts_per_step * c.rollouts_per_prompt,
        per_device_train_batch_size=size, gradient_accumulation_steps=accumulation,
        num_iterations=c.epochs_per_step,
        learning_rate=c.lr, adam_beta1=c.adam_betas[0], adam_beta2=c.adam_betas[1],
        adam_epsilon=c.adam_eps, weight_decay=c.weight_decay, max_grad_norm=c.max_grad_norm,
        lr_scheduler_type="constant_with_warmup" if c.warmup_steps else "constant",
        warmup_steps=c.warmup_steps,
        temperature=c.temperature, top_p=c.top_p, top_k=0,
        max_completion_length=c.max_response_tokens,
        beta=loss.kl_coef, use_bias_correction_kl=False,
        epsilon=loss.clip_eps_low, epsilon_high=loss.clip_eps_high, loss_type="dapo",
        scale_rewards=scale, entropy_coef=loss.entropy_coef,
    )


def instrument(trainer: Any, clock: StepClock, rl_optimizer_steps: int) -> None:
    """Wrap the trainer's methods (this process only) so `clock` gets each part's seconds, the
    trained rows and the losses, and add the callback that cuts RL steps."""
    from transformers import TrainerCallback

    trainer._generate = clock.timed(trainer._generate, "generation")
    trainer._calculate_rewards = clock.timed(trainer._calculate_rewards, "verification")
    trainer._clip_grad_norm = clock.timed(trainer._clip_grad_norm, "update")
    logps = trainer._get_per_token_logps_and_entropies
    scored = clock.timed(logps, "scoring")
    trainer._get_per_token_logps_and_entropies = functools.wraps(logps)(
        lambda *a, **k: (scored if clock.scoring_phase else logps)(*a, **k))
    generate_and_score = trainer._generate_and_score_completions

    @functools.wraps(generate_and_score)
    def scoring_phase(*a: Any, **k: Any) -> Any:
        clock.scoring_phase = True
        try:
            return generate_and_score(*a, **k)
        finally:
            clock.scoring_phase = False

    trainer._generate_and_score_completions = scoring_phase
    trainer._prepare_inputs = clock.timed(trainer._prepare_inputs, "prepare_inputs")
    training_step = trainer.training_step

    @functools.wraps(training_step)
    def update(*a: Any, **k: Any) -> Any:
        started, inner = time.perf_counter(), clock.parts["prepare_inputs"]
        out = training_step(*a, **k)
        clock.add("update", time.perf_counter() - started - (clock.parts["prepare_inputs"] - inner))
        return out

    trainer.training_step = update
    compute_loss = trainer.compute_loss

    @functools.wraps(compute_loss)
    def counted(model: Any, inputs: dict, *a: Any, **k: Any) -> Any:
        loss = compute_loss(model, inputs, *a, **k)
        clock.add("rows", float(inputs["completion_ids"].shape[0]))
        clock.add("loss_sum", float(loss.detach()))
        clock.add("response_tokens", float(inputs["completion_mask"].sum()))
        return loss

    trainer.compute_loss = counted

    class RLSteps(TrainerCallback):
        """Cuts an RL step after every `rl_optimizer_steps` optimizer steps; times `step()`."""

        started = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            clock.parts = defaultdict(float)
            clock.boundary()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.started = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            clock.add("update", time.perf_counter() - self.started)

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.global_step % rl_optimizer_steps == 0:
                clock.boundary()

    trainer.add_callback(RLSteps())


def trl_child(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up and timed steps of TRL's `GRPOTrainer` in this process; their JSON row."""
    import datasets
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOTrainer

    from brorl.train.config import TrainerConfig

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    params = load_side_params(args, "trl")
    config = TrainerConfig.from_params(params)
    policy = args.workdir / "policy"
    tokenizer = PreTrainedTokenizerFast.from_pretrained(policy)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # as brorl's `load_policy`
    total = args.warm_steps + args.steps
    table, problems = trl_dataset(config, data_dir(args.workdir, args.prompt_tokens), total,
                                  tokenizer)
    clock = StepClock()
    trainer = GRPOTrainer(model=str(policy), reward_funcs=trl_reward(config, problems, clock),
                          args=trl_config(config, args, args.workdir / f"trl_out_{args.child_n}"),
                          train_dataset=table, processing_class=tokenizer)
    trainer.optimizer = torch.optim.AdamW(  # as brorl's Trainer: one group, decay on all
        trainer.model.parameters(), lr=config.lr, betas=config.adam_betas, eps=config.adam_eps,
        weight_decay=config.weight_decay)
    rl_optimizer_steps = config.mini_batches_per_step * config.epochs_per_step
    instrument(trainer, clock, rl_optimizer_steps)
    trainer.train()
    steps = clock.steps()
    if len(steps) != total:
        raise RuntimeError(f"TRL ran {len(steps)} RL steps, expected {total}: check max_steps.")
    timed = steps[args.warm_steps:]
    rows = sum(s.get("rows", 0.0) for s in timed) / len(timed)
    return summarise("trl", args, timed, {
        "trained": rows / config.epochs_per_step,
        "loss": sum(s.get("loss_sum", 0.0) for s in timed) / len(timed) / rl_optimizer_steps,
        "reward_mean": round(sum(s.get("reward_sum", 0.0) for s in timed)
                             / max(sum(s.get("reward_n", 0.0) for s in timed), 1), 4),
        "response_tokens": round(sum(s.get("response_tokens", 0.0) for s in timed)
                                 / max(sum(s.get("rows", 0.0) for s in timed), 1), 2),
        "optimizer_steps": float(rl_optimizer_steps), "lr": config.lr,
        "per_device_train_batch_size": trainer.args.per_device_train_batch_size,
        "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps,
        "steps_per_generation": trainer.args.steps_per_generation,
        "scored_old_logps": trainer.args.gradient_accumulation_steps
        % (trainer.args.steps_per_generation * trainer.num_iterations) != 0})
