"""The trainer's settings as one frozen record of plain values, and its one conversion from params.

`TrainerConfig.from_params` builds it from the `update`, `filter`, `generate`, `verify` and
`train` sections (`LossConfig.from_params` from `update`); the trainer never sees the pydantic
schema. No field has a default: the defaults live in `brorl.params` only, so a field this
conversion forgets fails with a TypeError instead of taking a stale copy. Field meanings and their
sources in the paper are documented on the params fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from brorl.params import ExperimentParams, UpdateParams


@dataclass(frozen=True)
class LossConfig:
    """Arguments of `brorl.algorithm.losses.policy_loss` besides the tensors."""

    clip_eps_low: float
    clip_eps_high: float
    tis_mode: Literal["none", "truncate", "icepop"]
    tis_cap: float
    tis_min: float
    kl_coef: float
    kl_estimator: Literal["k1", "k2", "k3"]
    kl_input_clamp: float
    kl_output_clamp: float
    entropy_coef: float

    @classmethod
    def from_params(cls, update: UpdateParams) -> LossConfig:
        """The loss options of the `update` section (same names)."""
        u = update
        return cls(clip_eps_low=u.clip_eps_low, clip_eps_high=u.clip_eps_high,
                   tis_mode=u.tis_mode, tis_cap=u.tis_cap, tis_min=u.tis_min, kl_coef=u.kl_coef,
                   kl_estimator=u.kl_estimator, kl_input_clamp=u.kl_input_clamp,
                   kl_output_clamp=u.kl_output_clamp, entropy_coef=u.entropy_coef)

    def options(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrainerConfig:
    """Everything `Trainer` reads: the run, the update, sampling, filtering, DeepSpeed, checkpoints."""

    init_checkpoint: str
    checkpoint_dir: str
    steps: int
    seed: int
    # update (spec §4, §8)
    prompts_per_step: int
    rollouts_per_prompt: int
    lr: float
    mini_batches_per_step: int
    epochs_per_step: int
    micro_batch_rollouts: int
    advantage_estimator: Literal["reinforce_pp_baseline", "grpo"]
    loss: LossConfig
    reference_reset_every: int | None
    reset_optimizer_on_reference_reset: bool
    # dynamic sampling
    filter_enabled: bool
    filter_max_draws: int
    filter_oversample: float
    correct_reward: float
    wrong_reward: float
    # generation
    engine: Literal["hf", "vllm"]
    temperature: float
    top_p: float
    max_response_tokens: int
    max_concurrent_rollouts: int
    generate_dtype: str
    gpu_memory_utilization: float
    cpu_kv_cache_gib: int
    enforce_eager: bool
    # verification
    verify_workers: int | None
    verify_timeout_s: float
    sandbox: dict[str, Any]
    # optimisation (DeepSpeed)
    zero_stage: Literal[0, 1, 2]
    dtype: Literal["float32", "bfloat16"]
    weight_decay: float
    adam_betas: tuple[float, float]
    adam_eps: float
    max_grad_norm: float
    warmup_steps: int
    # checkpoints
    checkpoint_every: int
    keep_checkpoints: int

    @classmethod
    def from_params(cls, params: ExperimentParams) -> TrainerConfig:
        """The trainer's settings of one experiment; `lr` is `update.lr` (the sqrt rule)."""
        u, f, g, v, t = params.update, params.filter, params.generate, params.verify, params.train
        return cls(
            init_checkpoint=t.init_checkpoint, checkpoint_dir=t.checkpoint_dir, steps=t.steps,
            seed=t.seed, prompts_per_step=u.prompts_per_step,
            rollouts_per_prompt=u.rollouts_per_prompt, lr=u.lr,
            mini_batches_per_step=u.mini_batches_per_step, epochs_per_step=u.epochs_per_step,
            micro_batch_rollouts=t.micro_batch_rollouts, advantage_estimator=u.advantage_estimator,
            loss=LossConfig.from_params(u), reference_reset_every=u.reference_reset_every,
            reset_optimizer_on_reference_reset=u.reset_optimizer_on_reference_reset,
            filter_enabled=f.enabled, filter_max_draws=f.max_draws, filter_oversample=f.oversample,
            correct_reward=f.correct_reward, wrong_reward=f.wrong_reward,
            engine=g.engine, temperature=g.temperature, top_p=g.top_p,
            max_response_tokens=g.max_response_tokens,
            max_concurrent_rollouts=g.max_concurrent_rollouts, generate_dtype=g.dtype,
            gpu_memory_utilization=g.gpu_memory_utilization, cpu_kv_cache_gib=g.cpu_kv_cache_gib,
            enforce_eager=g.enforce_eager,
            verify_workers=v.workers, verify_timeout_s=v.timeout_s,
            sandbox={"cpu_s": v.cpu_s, "memory_bytes": v.memory_mib * 2**20,
                     "open_files": v.open_files, "file_bytes": v.file_bytes,
                     "output_bytes": v.output_bytes},
            zero_stage=t.zero_stage, dtype=t.dtype, weight_decay=t.weight_decay,
            adam_betas=(t.adam_beta1, t.adam_beta2), adam_eps=t.adam_eps,
            max_grad_norm=t.max_grad_norm, warmup_steps=t.warmup_steps,
            checkpoint_every=t.checkpoint_every, keep_checkpoints=t.keep_checkpoints,
        )

    def __post_init__(self) -> None:
        if self.micro_batch_rollouts < 1:
            raise ValueError(f"micro_batch_rollouts must be >= 1, got {self.micro_batch_rollouts}.")
        if self.rollouts_per_prompt < 2:
            raise ValueError(
                f"rollouts_per_prompt = {self.rollouts_per_prompt}: group baselines need N >= 2 "
                "(update.rollouts_per_prompt)."
            )
