"""The trainer's settings (`TrainerConfig`) and the run's policy (`RunConfig`: length, budgets,
schedules, evaluation) as frozen records of plain values, each with its one conversion from params.

`TrainerConfig.from_params` builds the trainer's from the `update`, `filter`, `generate`, `verify`
and `train` sections (`LossConfig.from_params` from `update`, `EngineConfig.from_params` from
`generate`: the records the loss and the rollout engine take, each beside its consumer in
`brorl.algorithm.losses` and `brorl.engines.base`); the trainer never sees the pydantic schema.
No field has a default: the defaults live in `brorl.params` only, so a field this conversion
forgets fails with a TypeError instead of taking a stale copy. Field meanings and their
sources in the paper are documented on the params fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from brorl.algorithm.losses import LossConfig
from brorl.engines.base import EngineConfig
from brorl.evaluation.protocol import EvalProtocol
from brorl.system.devices import resolve_dtype
from brorl.train.diagnostics import DiagnosticsConfig
from brorl.verifiers.config import VerifyConfig

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.params.rl import AdvantageEstimator, Allocation, KeepRule
    from brorl.params.run import ZeroStage


AUTO_MICRO_TOKENS = {"cuda": 16384, "cpu": 4096}
"""`update.max_tokens_per_micro_batch: auto` per device kind (verl's `ppo_max_token_len_per_gpu`
default on CUDA; on CPU a micro-batch of a 135M model's 4096 positions keeps the matmuls large)."""


def resolve_micro_tokens(value: int | str | None) -> int | None:
    """`update.max_tokens_per_micro_batch` as a number, or None (null: the row-padded layout);
    `auto` by the device kind (`AUTO_MICRO_TOKENS`)."""
    if value != "auto":
        return None if value is None else int(value)
    import torch

    return AUTO_MICRO_TOKENS["cuda" if torch.cuda.is_available() else "cpu"]


@dataclass(frozen=True)
class TrainerConfig:
    """Everything `Trainer` reads: the run, the update, sampling, filtering, DeepSpeed, checkpoints."""

    init_checkpoint: str
    """train.init_checkpoint: HF folder the policy and the first reference start from."""
    checkpoint_dir: str
    """train.checkpoint_dir: folder of `step_XXXXXX/` checkpoints and `latest`."""
    seed: int
    """train.seed: seed of prompt order, rollout sampling and mini-batch shuffle."""
    continue_stream: bool
    """train.continue_stream: continue the stream and seeds of a `run.json` in `init_checkpoint`."""
    # update (BroRL §3.1, §4.2.1)
    prompts_per_step: int
    """update.prompts_per_step: B."""
    rollouts_per_prompt: int
    """update.rollouts_per_prompt: N."""
    train_subset: int | None
    """update.train_subset: M, rollouts per group trained (max reward variance); None: all N."""
    allocation: Allocation
    """update.allocation: N per prompt, or a first round then the rest where it teaches most."""
    first_round: int
    """update.first_round_rollouts: n0 of the adaptive allocation."""
    rollouts_cap: int
    """update.rollouts_cap: most rollouts per prompt of the adaptive allocation."""
    lr: float
    """update.lr: base_lr scaled by sqrt(rollouts trained per step / base_samples_per_step)
    (BroRL §4.2.1): B*N, or B*M with `train_subset`."""
    mini_batches_per_step: int
    """update.mini_batches_per_step: optimizer steps per RL step."""
    epochs_per_step: int
    """update.epochs_per_step: passes over the step's rollouts."""
    micro_batch_rollouts: int
    """train.micro_batch_rollouts: rollouts per forward/backward."""
    max_tokens_per_micro_batch: int | None
    """update.max_tokens_per_micro_batch resolved (`resolve_micro_tokens`); None: row-padded."""
    advantage_estimator: AdvantageEstimator
    """update.advantage_estimator."""
    loss: LossConfig
    """The loss options of the `update` section (`LossConfig.from_params`)."""
    reference_reset_every: int | None
    """update.reference_reset_every: steps between reference resets (None: never)."""
    reset_optimizer_on_reference_reset: bool
    """update.reset_optimizer_on_reference_reset."""
    # dynamic sampling
    filter_enabled: bool
    """filter.enabled: drop the groups `keep_rule` fails and refill."""
    keep_rule: KeepRule
    """filter.keep_rule: 0 < #correct < N (the paper) or rewards not all equal."""
    filter_max_draws: int
    """filter.max_draws: most generate + verify rounds per step."""
    filter_oversample: float
    """filter.oversample: prompts asked per missing group."""
    correct_reward: float
    """filter.correct_reward: a rollout at or above it is correct."""
    wrong_reward: float
    """filter.wrong_reward: a uniform group at or below it is all-wrong."""
    # generation
    engine: EngineConfig
    """The rollout engine's settings (`EngineConfig.from_params`)."""
    temperature: float
    """generate.temperature: rollout sampling temperature."""
    top_p: float
    """generate.top_p: rollout nucleus top-p."""
    max_response_tokens: int
    """generate.max_response_tokens: longest response (tokens)."""
    # verification
    verify: VerifyConfig
    """How the rollouts are judged (`VerifyConfig.from_params` of the `verify` section)."""
    # optimisation (DeepSpeed)
    zero_stage: ZeroStage
    """train.zero_stage: DeepSpeed ZeRO stage."""
    dtype: Literal["float32", "bfloat16"]
    """train.dtype: training precision."""
    weight_decay: float
    """train.weight_decay: AdamW weight decay."""
    adam_betas: tuple[float, float]
    """(train.adam_beta1, train.adam_beta2)."""
    adam_eps: float
    """train.adam_eps."""
    max_grad_norm: float
    """train.max_grad_norm: gradient-norm clip per optimizer step."""
    peak_tflops: float | None
    """train.peak_tflops: the device's peak for `perf/mfu` (None: its data sheet's, if known)."""
    warmup_steps: int
    """train.warmup_steps: linear LR warm-up (optimizer steps)."""
    # checkpoints (their schedule is the run's: `RunConfig`)
    keep_checkpoints: int
    """train.keep_checkpoints: checkpoints kept on disk."""

    @classmethod
    def from_params(cls, params: ExperimentParams) -> TrainerConfig:
        """The trainer's settings of one experiment; `lr` is `update.lr` (the sqrt rule)."""
        u, f, g, t = params.update, params.filter, params.generate, params.train
        return cls(
            init_checkpoint=t.init_checkpoint, checkpoint_dir=t.checkpoint_dir,
            seed=t.seed, continue_stream=t.continue_stream, prompts_per_step=u.prompts_per_step,
            rollouts_per_prompt=u.rollouts_per_prompt, train_subset=u.train_subset,
            allocation=u.allocation, first_round=u.first_round_rollouts,
            rollouts_cap=u.rollouts_cap, lr=u.lr,
            mini_batches_per_step=u.mini_batches_per_step, epochs_per_step=u.epochs_per_step,
            micro_batch_rollouts=t.micro_batch_rollouts,
            max_tokens_per_micro_batch=resolve_micro_tokens(u.max_tokens_per_micro_batch),
            advantage_estimator=u.advantage_estimator,
            loss=LossConfig.from_params(u), reference_reset_every=u.reference_reset_every,
            reset_optimizer_on_reference_reset=u.reset_optimizer_on_reference_reset,
            filter_enabled=f.enabled, keep_rule=f.keep_rule, filter_max_draws=f.max_draws,
            filter_oversample=f.oversample,
            correct_reward=f.correct_reward, wrong_reward=f.wrong_reward,
            engine=EngineConfig.from_params(params), temperature=g.temperature, top_p=g.top_p,
            max_response_tokens=g.max_response_tokens,
            verify=VerifyConfig.from_params(params.verify),
            zero_stage=t.zero_stage, dtype=resolve_dtype(t.dtype), weight_decay=t.weight_decay,
            adam_betas=(t.adam_beta1, t.adam_beta2), adam_eps=t.adam_eps,
            max_grad_norm=t.max_grad_norm, peak_tflops=t.peak_tflops, warmup_steps=t.warmup_steps,
            keep_checkpoints=t.keep_checkpoints,
        )

    def __post_init__(self) -> None:
        if self.micro_batch_rollouts < 1:
            raise ValueError(f"micro_batch_rollouts must be >= 1, got {self.micro_batch_rollouts}.")
        if self.rollouts_per_prompt < 2:
            raise ValueError(
                f"rollouts_per_prompt = {self.rollouts_per_prompt}: group baselines need N >= 2 "
                "(update.rollouts_per_prompt)."
            )
        m = self.train_subset
        if m is not None and not 2 <= m < self.rollouts_per_prompt:
            raise ValueError(
                f"train_subset = {m}: the rollouts trained per group must be 2..N-1 with N = "
                f"{self.rollouts_per_prompt}, or None for all N (update.train_subset)."
            )


@dataclass(frozen=True)
class RunConfig:
    """The run's policy: length, budgets, schedules, evaluation, where outputs go."""

    name: str
    run_dir: str
    data_path: str
    steps: int
    max_rollouts: int | None
    min_steps: int | None
    max_seconds: float | None
    plateau_patience: int | None
    eval_every: int
    checkpoint_every: int
    save_rollouts: bool
    eval_splits: tuple[str, ...]
    eval_protocol: EvalProtocol
    diagnostics: DiagnosticsConfig
    root: str
    """The checkout, which the paths in the run's files are relative to."""
    eval_steps: tuple[int, ...]
    """Steps evaluated besides every `eval_every`-th (`train.eval_steps`)."""

    @classmethod
    def from_params(cls, params: ExperimentParams, root: Path) -> RunConfig:
        """The `train` section's run policy; `run_dir` resolved against `root`."""
        t = params.train
        return cls(
            name=params.name, run_dir=str(root / t.run_dir), root=str(root),
            data_path=params.data.path, steps=t.steps, max_rollouts=t.max_rollouts,
            min_steps=t.min_steps, max_seconds=t.max_seconds,
            plateau_patience=t.plateau_patience, eval_every=t.eval_every,
            eval_steps=tuple(t.eval_steps),
            checkpoint_every=t.checkpoint_every, save_rollouts=t.save_rollouts,
            eval_splits=tuple(t.eval_splits), eval_protocol=EvalProtocol.from_params(params),
            diagnostics=DiagnosticsConfig.from_params(params))
