"""The trainer's settings as one frozen record of plain values.

`brorl.params.ExperimentParams.trainer_config()` builds it from the `update`, `filter`,
`generate`, `verify` and `train` sections; the trainer never sees the pydantic schema. Field
meanings and their sources in the paper are documented on those params fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class LossConfig:
    """Arguments of `brorl.algorithm.losses.policy_loss` besides the tensors."""

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    tis_mode: Literal["none", "truncate", "icepop"] = "truncate"
    tis_cap: float = 5.0
    tis_min: float = 0.5
    kl_coef: float = 1e-4
    kl_estimator: Literal["k1", "k2", "k3"] = "k2"
    kl_input_clamp: float = 20.0
    kl_output_clamp: float = 10.0
    entropy_coef: float = 0.0

    def options(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrainerConfig:
    """Everything `Trainer` reads: the run, the update, sampling, filtering, DeepSpeed, checkpoints."""

    init_checkpoint: str
    checkpoint_dir: str
    steps: int = 20
    seed: int = 0
    # update (spec §4, §8)
    prompts_per_step: int = 512
    rollouts_per_prompt: int = 16
    lr: float = 2e-6
    mini_batches_per_step: int = 4
    epochs_per_step: int = 1
    micro_batch_rollouts: int = 64
    advantage_estimator: Literal["reinforce_pp_baseline", "grpo"] = "reinforce_pp_baseline"
    loss: LossConfig = field(default_factory=LossConfig)
    reference_reset_every: int | None = 200
    reset_optimizer_on_reference_reset: bool = False
    # dynamic sampling
    filter_enabled: bool = True
    filter_max_draws: int = 10
    filter_oversample: float = 1.0
    correct_reward: float = 1.0
    wrong_reward: float = 0.0
    # generation
    engine: Literal["hf", "vllm"] = "hf"
    temperature: float = 1.2
    top_p: float = 1.0
    max_response_tokens: int = 64
    max_concurrent_rollouts: int = 256
    generate_dtype: str = "float32"
    gpu_memory_utilization: float = 0.5
    cpu_kv_cache_gib: int = 1
    enforce_eager: bool = False
    # verification
    verify_workers: int | None = None
    verify_timeout_s: float = 5.0
    sandbox: dict[str, Any] = field(default_factory=dict)
    # optimisation (DeepSpeed)
    zero_stage: Literal[0, 1, 2] = 2
    dtype: Literal["float32", "bfloat16"] = "float32"
    weight_decay: float = 0.01
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    # checkpoints
    checkpoint_every: int = 10
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:
        if self.micro_batch_rollouts < 1:
            raise ValueError(f"micro_batch_rollouts must be >= 1, got {self.micro_batch_rollouts}.")
        if self.rollouts_per_prompt < 2:
            raise ValueError(
                f"rollouts_per_prompt = {self.rollouts_per_prompt}: group baselines need N >= 2 "
                "(update.rollouts_per_prompt)."
            )
