"""Experiment parameters: the one pydantic schema of brorl, and the YAML loader.

Every experiment is one `ExperimentParams`, read from a YAML file under `params/`. A file may
start with `extends: other.yaml` or a list of files (paths relative to it): those are loaded
first, in order, and this file's keys are deep-merged over them, so the CI-sized files and the
ProRL/BroRL arms are small overlays. `key.sub=value` overrides (the CLI's `-S`) apply last. Unknown keys fail, naming the
file and the key; so do values out of range.

Sections are named after the pipeline stages. Each field's docstring gives its unit and, where the
value comes from the paper, the section of `shared/spec/paper.md` (spec) it comes from.
This module is the only one that knows the schema: brorl functions take plain arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    model_validator,
)

from brorl.algorithm.schedule import scaled_lr

if TYPE_CHECKING:
    from brorl.train.config import TrainerConfig


class ParamsError(ValueError):
    """A params file or override is invalid; the message names the file, the key and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimulateParams(_Section):
    """The token-level simulator of BroRL §4.1 (spec §3.1); open choices documented (spec §3.2)."""

    vocab_size: PositiveInt = 128_000
    """d, the vocabulary size (tokens). Spec §3.1: 128,000."""
    num_correct: PositiveInt = 10_000
    """|P|, tokens with reward R_c. Spec §3.1: 10,000."""
    correct_tokens: Literal["first", "random"] = "first"
    """Which tokens form P (spec §3.2, unstated in the paper): `first` = ids 1..|P| right after the
    anchor (the spec's re-run), `random` = a random subset per seed (the anchor excluded)."""
    correct_logit: float = 3.0
    """Initial logit of correct tokens ("seeding"; 0 turns seeding off). Spec §3.1: 3."""
    anchor_logit: float | None = 5.0
    """Logit of anchor token 0 (None: no anchor, z_0 starts at its class logit). Spec §3.1: 5."""
    anchor_is_correct: bool = False
    """Whether the anchor belongs to P (unstated; spec §3.2). False keeps Q_pos(0) = 0.6296."""
    freeze_anchor: bool = True
    """Hold z_0 at `anchor_logit` after every step ("fixing one anchor token"; spec §3.2)."""
    temperature: float = Field(1.0, gt=0)
    """tau in p = softmax(z / tau). Spec §3.1: 1."""
    reward_correct: float = 1.0
    """R_c, reward of a correct token. Spec §3.1: +1."""
    reward_wrong: float = -1.0
    """R_w, reward of an incorrect token. Spec §3.1: -1."""
    lr: float = Field(1e-3, gt=0)
    """AdamW learning rate eta. Spec §3.1: 1e-3."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1 (unstated; PyTorch default). Spec §3.2."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW beta2 (unstated; PyTorch default). Spec §3.2."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon (unstated; PyTorch default). Spec §3.2."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW decoupled weight decay (unstated; PyTorch default). Spec §3.2."""
    steps: PositiveInt = 1000
    """T, optimizer steps per run. Spec §3.1: 1000."""
    rollouts_per_prompt: list[PositiveInt] = [4, 8, 16, 512, 51_200]
    """N values swept, one curve each. Spec §3.1: {4, 8, 16, 512, 51200}."""
    num_seeds: PositiveInt = 8
    """Independent runs per N, reported as mean and spread (the paper gives none)."""
    seed: int = 0
    """Base seed; run (N, k) uses seed + k, so each N sees the same seeds."""
    log_every: PositiveInt = 10
    """Record metrics every this many steps (and at steps 0 and T)."""
    report_steps: list[PositiveInt] = [100, 500, 1000]
    """Steps shown in the results table (spec §3.3 uses 100, 500, 1000)."""

    @model_validator(mode="after")
    def _check_sizes(self) -> SimulateParams:
        anchor = 1 if self.anchor_logit is not None else 0
        if self.num_correct + anchor >= self.vocab_size:
            raise ValueError(
                f"num_correct ({self.num_correct}) plus the anchor must be below vocab_size "
                f"({self.vocab_size}): the simulator needs at least one incorrect token. "
                "Lower num_correct or raise vocab_size."
            )
        late = [s for s in self.report_steps if s > self.steps]
        if late:
            raise ValueError(
                f"report_steps {late} exceed steps ({self.steps}); list only steps the run reaches."
            )
        return self


class DataParams(_Section):
    """Problem data for the three families (spec §5, §7.1): sources, sizes and splits."""

    seed: int = 0
    """Seed of the generators, of reasoning-gym and of the split shuffle."""
    math_per_task: NonNegativeInt = 600
    """Generated math draws per task (compare, arithmetic, fractions, linear_equation); 0 leaves
    them out.
    Draws may repeat; splitting dedupes by prompt."""
    math_max_operand: PositiveInt = 9
    """Largest operand of the generated math tasks (9: one-digit facts a tiny model can learn)."""
    code_per_task: NonNegativeInt = 600
    """Generated code draws per template (7 one-line function templates); 0 leaves them out."""
    reasoning_per_task: NonNegativeInt = 600
    """Reasoning-gym items per task; 0 leaves reasoning-gym out."""
    reasoning_tasks: dict[str, dict[str, Any]] | None = None
    """Reasoning-gym task name -> config. None: the CPU default set of
    `brorl.data.reasoning.DEFAULT_REASONING_TASKS` (spell_backward, simple_equations,
    basic_arithmetic at tiny sizes: short prompts and answers a tiny model partly learns)."""
    math_jsonl: list[str] = []
    """Local JSONL files of math problems (`problem` + `answer`, the DeepScaleR / MATH shape)."""
    code_jsonl: list[str] = []
    """Local JSONL files of code problems (statement, signature, tests or APPS `input_output`)."""
    validation_fraction: float = Field(0.1, ge=0, lt=1)
    """Share of each task's deduplicated problems in the validation split."""
    test_fraction: float = Field(0.2, ge=0, lt=1)
    """Share of each task's deduplicated problems in the held-out test split (evaluation)."""
    path: str = "outputs/data/problems"
    """Folder of the saved `datasets.DatasetDict` (train / validation / test), repo-relative."""

    @model_validator(mode="after")
    def _check_fractions(self) -> DataParams:
        if self.validation_fraction + self.test_fraction >= 1:
            raise ValueError(
                f"validation_fraction + test_fraction = "
                f"{self.validation_fraction + self.test_fraction} leaves nothing to train on; "
                "keep their sum below 1 (e.g. 0.1 and 0.2)."
            )
        return self


class ModelParams(_Section):
    """The tiny Qwen2 policy built from config (CPU stand-in for the paper's 1.5B, spec §7.1)."""

    hidden_size: PositiveInt = 96
    """Model width (channels); must be a multiple of num_heads."""
    num_layers: PositiveInt = 2
    """Transformer blocks."""
    num_heads: PositiveInt = 4
    """Attention (query) heads."""
    num_kv_heads: PositiveInt = 2
    """Key/value heads (grouped-query attention, as Qwen2); must divide num_heads."""
    intermediate_size: PositiveInt = 288
    """MLP hidden width (channels)."""
    max_position_embeddings: PositiveInt = 512
    """Longest sequence, prompt plus response (tokens = characters)."""
    tie_word_embeddings: bool = True
    """Share input embedding and output layer weights (as Qwen2.5-1.5B)."""
    seed: int = 0
    """Seed of the weight initialisation."""


class BaseParams(_Section):
    """Supervised warm-up to a middling base checkpoint (stand-in for ProRLv2's, spec §5.1, §7.2)."""

    max_steps: PositiveInt = 2000
    """Upper bound on optimizer steps (batches)."""
    eval_every: PositiveInt = 100
    """Steps between validation checks of the stopping rule."""
    batch_size: PositiveInt = 32
    """Problems per step, drawn family-balanced with replacement."""
    micro_batches: PositiveInt = 3
    """Length-sorted micro-batches per step, losses weighted by response tokens: the same
    gradient as one padded batch, with less padding (3 about matches the three families)."""
    family_shares: dict[Literal["math", "code", "reasoning"], float] | None = None
    """Relative share of each family in the batches (a missing family: 1); None: equal shares."""
    reached_share: float = Field(0.25, gt=0, le=1)
    """Multiplier of a family's share while its validation pass@1 is at or above
    target_pass_low (1: off): families already in the band wait for the others, so the stop
    comes before a fast one (code jumps from 0.2 to 0.9 within 400 steps) leaves the band."""
    lr: float = Field(3e-3, gt=0)
    """Peak AdamW learning rate, reached after the warm-up (tiny models take large rates)."""
    warmup_steps: NonNegativeInt = 20
    """Steps of linear learning-rate warm-up from lr / warmup_steps to lr."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """After the warm-up a cosine takes the rate from lr to min_lr_ratio x lr at max_steps
    (1: constant). A constant 3e-3 left validation pass@1 swinging by 20 points between checks."""
    seed: int = 0
    """Seed of the batch draws and of evaluation sampling."""
    target_pass_low: float = Field(0.2, ge=0, le=1)
    """The band's low end: held-out pass@1 per family the base should reach (`base/in_band`)."""
    target_pass_high: float = Field(0.6, ge=0, le=1)
    """The band's high end (`base/in_band`); above it RL has little to add."""
    band_margin: float = Field(0.05, ge=0, lt=0.5)
    """Validation uses the band narrowed by this at each end: training stops once every family's
    validation pass@1 reaches low + margin, and keeps the weights of the check nearest to
    [low + margin, high - margin] (`brorl.base.warm_up`). One sample of 100 problems per family
    has a standard error of about 0.045 near 0.3, so the margin keeps test scores in the band."""
    eval_per_family: PositiveInt = 40
    """Validation problems per family scored at each check (one sample each)."""
    test_samples: PositiveInt = 4
    """Samples per held-out test problem for the final pass@1 (the paper uses 16, spec §5.2)."""
    eval_temperature: float = Field(0.6, ge=0)
    """Sampling temperature of the final test evaluation (spec §5.2: 0.6)."""
    eval_top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus top-p of the final test evaluation (spec §5.2: 0.95)."""
    max_response_tokens: PositiveInt = 64
    """Longest generated response in evaluation (tokens = characters)."""
    path: str = "outputs/base/checkpoint"
    """Folder of the saved base checkpoint (a Hugging Face folder), repo-relative."""

    @model_validator(mode="after")
    def _check_band(self) -> BaseParams:
        bad = {f: v for f, v in (self.family_shares or {}).items() if not v > 0}
        if bad:
            raise ValueError(
                f"family_shares {bad} must be > 0: a share of 0 would never train that family "
                "while validation still waits for it; leave a family out for the default 1."
            )
        if self.target_pass_low + self.band_margin > self.target_pass_high - self.band_margin:
            raise ValueError(
                f"target_pass_low ({self.target_pass_low}) + band_margin ({self.band_margin}) "
                f"exceeds target_pass_high ({self.target_pass_high}) - band_margin: the narrowed "
                "band must be non-empty (e.g. 0.2 and 0.6 with a margin of 0.05)."
            )
        return self


class UpdateParams(_Section):
    """The RL update (spec §4.2, §7.2, §8); the functions live in `brorl/algorithm/`.

    Also the one home of B and N (`prompts_per_step`, `rollouts_per_prompt`): the sample and
    generate stages read them here, because the LR rule and the mini-batch split derive from them.
    Defaults are the ProRL arm; the BroRL arm overlays B=128, N=512 and nothing else.
    """

    prompts_per_step: PositiveInt = 512
    """B, prompts whose groups are trained per step (after filtering). Spec §4.1: ProRL 512, BroRL 128."""
    rollouts_per_prompt: PositiveInt = 16
    """N, rollouts per prompt. Spec §4.1: ProRL 16, BroRL 512."""
    base_lr: float = Field(2e-6, gt=0)
    """Learning rate at `base_samples_per_step` samples. ProRL v1's constant 2e-6 (spec §7.1);
    UNCONFIRMED for ProRLv2/BroRL (spec §4.3): our choice."""
    base_samples_per_step: PositiveInt = 8192
    """Samples per step (B*N) at which `base_lr` applies: the ProRL arm, 512 x 16 (spec §4.1)."""
    mini_batches_per_step: PositiveInt = 4
    """PPO mini-batches (optimizer steps) per RL step, equal in both arms (spec §8 rule 2).
    ProRL v1: 256 / 64 = 4 (spec §7.1); UNCONFIRMED for BroRL (spec §4.3): our choice."""
    epochs_per_step: PositiveInt = 1
    """Passes over the step's rollouts. UNCONFIRMED (spec §4.3): our choice, one pass."""
    clip_eps_low: float = Field(0.2, ge=0, lt=1)
    """PPO clip below: ratio >= 1 - eps_low. ProRLv2: 0.20 (spec §7.2)."""
    clip_eps_high: float = Field(0.28, ge=0)
    """PPO clip above (clip-higher): ratio <= 1 + eps_high. ProRLv2: 0.28 (spec §7.2)."""
    advantage_estimator: Literal["reinforce_pp_baseline", "grpo"] = "reinforce_pp_baseline"
    """REINFORCE++-baseline (ProRLv2/BroRL, spec §4.2) or GRPO (ProRL v1, spec §7.1)."""
    kl_coef: float = Field(1e-4, ge=0)
    """beta, weight of the KL to the reference (0: off). UNCONFIRMED (spec §7.2); NeMo-RL's
    ProRLv2 config uses 1e-4 (spec §7.3): our choice."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k2"
    """KL estimator per token; ProRLv2 uses k2 = 0.5 log(pi/ref)^2 (spec §7.2)."""
    kl_input_clamp: float = Field(20.0, gt=0)
    """Clamp of log(pi/ref) before the estimator. NeMo-RL: 20 (spec §7.3); ProRLv2 text: 10 (§7.2)."""
    kl_output_clamp: float = Field(10.0, gt=0)
    """Clamp of the per-token KL estimate. NeMo-RL: 10 (spec §7.3)."""
    tis_mode: Literal["none", "truncate", "icepop"] = "truncate"
    """Engine->trainer correction: truncated IS as the paper names it (spec §4.2); NeMo-RL uses
    `icepop` (spec §7.3); `none` turns it off."""
    tis_cap: float = Field(5.0, gt=0)
    """Upper bound of the engine->trainer ratio (truncate: cap; icepop: band top). UNCONFIRMED
    (spec §4.3); NeMo-RL: 5.0 (spec §7.3): our choice."""
    tis_min: float = Field(0.5, ge=0)
    """Lower end of the IcePop band (tokens below get weight 0). NeMo-RL: 0.5 (spec §7.3)."""
    entropy_coef: float = Field(0.0, ge=0)
    """Entropy bonus weight; 0: entropy is logged only (no bonus in the spec)."""
    reference_reset_every: PositiveInt | None = 200
    """Steps between resets of the reference to the current policy (None: never). ProRLv2 resets
    every 200-500 steps (spec §7.2); UNCONFIRMED for BroRL (spec §4.3): our choice, 200."""
    reset_optimizer_on_reference_reset: bool = False
    """Clear the optimizer state at a reference reset: ProRLv2 keeps it (False, spec §7.2),
    ProRL v1 re-initialised it (True, spec §7.1)."""

    @property
    def samples_per_step(self) -> int:
        """B * N, rollouts trained per step (before filtering this many are planned)."""
        return self.prompts_per_step * self.rollouts_per_prompt

    @property
    def lr(self) -> float:
        """base_lr * sqrt(samples_per_step / base_samples_per_step) (spec §4.1, §8 rule 3)."""
        return scaled_lr(self.base_lr, self.samples_per_step, self.base_samples_per_step)

    @property
    def mini_batch_rollouts(self) -> int:
        """Rollouts per PPO mini-batch: samples_per_step / mini_batches_per_step (spec §8 rule 2)."""
        return self.samples_per_step // self.mini_batches_per_step

    @model_validator(mode="after")
    def _check_update(self) -> UpdateParams:
        if self.samples_per_step % self.mini_batches_per_step:
            raise ValueError(
                f"prompts_per_step * rollouts_per_prompt = {self.samples_per_step} rollouts do not "
                f"split into mini_batches_per_step = {self.mini_batches_per_step} equal mini-batches; "
                "the count is fixed across arms (spec §8), so pick a divisor of B * N."
            )
        if self.tis_min >= self.tis_cap:
            raise ValueError(
                f"tis_min ({self.tis_min}) must be below tis_cap ({self.tis_cap}): they bound the "
                "kept band of engine->trainer ratios; e.g. 0.5 and 5.0."
            )
        return self


class FilterParams(_Section):
    """Dynamic sampling (DAPO; spec §4.2, §7.3): drop groups whose rewards are all equal, refill."""

    enabled: bool = True
    """Filter uniform groups and refill (spec §4.2). False trains on every drawn group."""
    max_draws: PositiveInt = 10
    """Most draws (generate + verify rounds) per step; then train on what was kept and flag it.
    NeMo-RL: `dynamic_sampling_max_gen_batches: 10` (spec §7.3)."""
    oversample: float = Field(1.0, ge=1)
    """Each draw asks for ceil(missing groups * oversample) prompts; the excess is dropped.
    NeMo-RL's `batch_multiplier` is 1.5 (spec §7.3); ours 1.0 wastes no rollouts: our choice."""
    correct_reward: float = 1.0
    """A uniform group at or above this reward counts as all-correct (`filter/groups_all_correct`)."""
    wrong_reward: float = 0.0
    """A uniform group at or below this reward counts as all-wrong (`filter/groups_all_wrong`)."""

    @model_validator(mode="after")
    def _check_filter(self) -> FilterParams:
        if self.wrong_reward >= self.correct_reward:
            raise ValueError(
                f"wrong_reward ({self.wrong_reward}) must be below correct_reward "
                f"({self.correct_reward}); they only classify discarded groups, e.g. 0 and 1."
            )
        return self


class GenerateParams(_Section):
    """Rollout generation (spec §4.2, §6, §7.1): the engine and its sampling; B and N live in `update`."""

    engine: Literal["hf", "vllm"] = "hf"
    """`hf`: in-process transformers loop (`brorl.engines.hf`); `vllm`: vLLM's offline LLM kept
    alive across steps (`brorl.engines.vllm`). The paper's engine is not stated (spec §4.3; its
    throughput argument cites SGLang's prefix caching, spec §6); ProRL v1 evaluated with vLLM."""
    temperature: float = Field(1.2, ge=0)
    """Sampling temperature; 0 is greedy. ProRL v1: 1.2 (spec §7.1)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus top-p of rollouts; 1 turns it off. Not stated for ProRL or BroRL training (spec
    §4.3, §11 item 4): 1 is our choice."""
    max_response_tokens: PositiveInt = 64
    """Longest response (tokens); longer rollouts end with finish reason `length`. ProRL v1: 8k
    (spec §7.1); CPU-sized here."""
    max_concurrent_rollouts: PositiveInt = 256
    """Most rollouts decoded at once (hf: chunk size; vllm: `max_num_seqs`), so memory does not
    grow with N. vLLM's own default is 256 (anchors §8)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """vLLM weight/activation dtype; float32 on CPU (trainer log-probs then match within 1e-4)."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """vLLM on GPU: share of GPU memory for weights + KV cache (the trainer needs the rest)."""
    cpu_kv_cache_gib: PositiveInt = 1
    """vLLM on CPU: KV-cache size (GiB), `VLLM_CPU_KVCACHE_SPACE` (platform notes)."""
    enforce_eager: bool = False
    """vLLM: skip torch.compile / graph capture. On this CPU the engine then starts in ~13 s
    instead of ~50 s, at similar tiny-model throughput; keep False on GPU."""


class VerifyParams(_Section):
    """Verifiers and the code sandbox (spec §7.1 data table); `brorl.verifiers.verify_batch`."""

    workers: PositiveInt | None = None
    """Parallel verifier processes per family; None uses every available core."""
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit (s) per item: one math or reasoning check, or all tests of one code
    response. ProRL: code over 5 s total gets reward 0 (spec §7.1)."""
    cpu_s: PositiveInt = 5
    """Code sandbox RLIMIT_CPU (CPU seconds); matches the 5 s wall limit (spec §7.1)."""
    memory_mib: PositiveInt = 512
    """Code sandbox RLIMIT_AS (MiB of address space); the interpreter needs about 30. Our choice."""
    open_files: PositiveInt = 32
    """Code sandbox RLIMIT_NOFILE (open file descriptors). Our choice."""
    file_bytes: PositiveInt = 2**20
    """Code sandbox RLIMIT_FSIZE (bytes): the largest file it writes, stdout and stderr
    included. Our choice."""
    output_bytes: PositiveInt = 16 * 2**10
    """Bytes of the candidate's stdout and of its stderr read back for logs. Our choice."""


class TrainParams(_Section):
    """The RL run (`brorl.train.Trainer`): start point, length, DeepSpeed, checkpoints.

    B, N, the LR rule and the loss live in `update`; sampling in `generate`; dynamic sampling in
    `filter`. This section holds what only the trainer reads.
    """

    init_checkpoint: str = "outputs/base/checkpoint"
    """HF folder the policy (and the first reference) starts from: the base stage's output, an
    earlier run's `policy/` folder, or any local checkpoint (e.g. a 1.5B model on GPU)."""
    steps: PositiveInt = 20
    """RL steps (optimizer steps = steps x mini_batches_per_step)."""
    micro_batch_rollouts: PositiveInt = 64
    """Rollouts per forward/backward on each rank; a mini-batch is accumulated from these, so
    memory is bounded by this knob, not by B x N (gradient accumulation)."""
    zero_stage: Literal[0, 1, 2] = 2
    """DeepSpeed ZeRO stage. Our choice: 2 (optimizer states and gradients partitioned). Stage 3
    is not offered: the rollout engine and the HF checkpoint need whole parameters."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Training precision; bfloat16 is for GPUs (about 20x slower on this CPU, platform notes)."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW weight decay. UNCONFIRMED (spec §7.1 gives only AdamW): torch's default, our choice."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1 (torch default)."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW beta2 (torch default)."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon (torch default)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient-norm clip per optimizer step (verl and OpenRLHF default 1.0): our choice."""
    warmup_steps: NonNegativeInt = 0
    """Linear LR warm-up in optimizer steps; 0: constant LR as ProRL v1 (spec §7.1)."""
    seed: int = 0
    """Seed of the prompt order, the rollout sampling and the mini-batch shuffle."""
    checkpoint_dir: str = "outputs/train/checkpoints"
    """Folder of `step_XXXXXX/` checkpoints and the `latest` pointer."""
    checkpoint_every: PositiveInt = 10
    """Steps between checkpoints; the last step is always saved."""
    keep_checkpoints: PositiveInt = 2
    """Checkpoints kept on disk (oldest removed first)."""
    algorithm: Literal["prorl", "brorl"] = "prorl"
    """The arm's label: the MLflow tag `algorithm` and the comparison report's row name."""
    run_dir: str = "outputs/train"
    """Folder of the run's other outputs: rollouts (Parquet), evaluations, summary, MLflow run id."""
    save_rollouts: bool = True
    """Write every verified draw's rollouts to `<run_dir>/rollouts/step_XXXXXX_drawK.parquet`."""
    max_rollouts: PositiveInt | None = None
    """Budget: stop once this many rollouts were generated (refills included); None: no limit."""
    max_seconds: float | None = Field(None, gt=0)
    """Budget: stop once the run's steps took this long (s, summed over sessions); None: none."""
    plateau_patience: PositiveInt | None = None
    """Stop after this many evaluations without a new best held-out mean pass@1 (the
    `prorl_warmup` stage's saturation rule); None: never stop early."""
    eval_every: PositiveInt = 5
    """Steps between held-out evaluations (also at step 0 and at the end)."""
    eval_per_family: PositiveInt = 20
    """Held-out test problems per family in each evaluation (the same instances every time)."""
    eval_samples: PositiveInt = 4
    """Samples per problem for pass@1 (spec §5.2 uses 16; 4 on CPU)."""
    eval_temperature: float = Field(0.6, ge=0)
    """Evaluation sampling temperature (spec §5.2: 0.6)."""
    eval_top_p: float = Field(0.95, gt=0, le=1)
    """Evaluation nucleus top-p (spec §5.2: 0.95)."""


class CompareParams(_Section):
    """The ProRL-vs-BroRL comparison (`flows/compare.py`): arms, shared start, equal budget."""

    arms: dict[str, str] = {"prorl": "params/prorl.yaml", "brorl": "params/brorl.yaml"}
    """Arm name -> its params file (relative to the repository root)."""
    train_arms: bool = False
    """True: the flow trains each arm (resuming any earlier progress) before the report; False:
    it reports on the arms' finished runs (the DVC `prorl` and `brorl` stages train them)."""
    init_checkpoint: str | None = None
    """Start of both arms (set as their `train.init_checkpoint`); None: the arms' own, which
    must then be equal."""
    budget_rollouts: PositiveInt | None = None
    """Each arm's budget in generated rollouts (set as `train.max_rollouts`); None: the arms'
    own, which must then be equal."""
    budget_seconds: float | None = Field(None, gt=0)
    """Each arm's wall-clock budget (set as `train.max_seconds`); None: the arms' own."""
    report_dir: str = "outputs/compare"
    """Folder of the report (Markdown, JSON, PNG plots)."""


class TrackingParams(_Section):
    """Where runs are recorded (MLflow) and where outputs go."""

    experiment: str = "brorl"
    """MLflow experiment name."""
    tracking_uri: str | None = None
    """MLflow tracking URI; None means $MLFLOW_TRACKING_URI, else the project's SQLite store."""
    output_dir: str = "outputs"
    """Folder for large run outputs (checkpoints, rollouts, figures): DVC-cached, git-ignored.
    Relative paths are taken from the repository root."""
    metrics_dir: str = "metrics"
    """Folder for small DVC metrics files (`dvc metrics show`), kept in git."""
    plots_dir: str = "plots"
    """Folder for DVC plot data (`dvc plots show`), kept in git."""


class ExperimentParams(_Section):
    """One experiment: every section of the pipeline. Unset sections keep their defaults."""

    name: str = "experiment"
    """Short experiment name, used in run names and output folders."""
    simulate: SimulateParams = SimulateParams()
    data: DataParams = DataParams()
    model: ModelParams = ModelParams()
    base: BaseParams = BaseParams()
    update: UpdateParams = UpdateParams()
    filter: FilterParams = FilterParams()
    generate: GenerateParams = GenerateParams()
    verify: VerifyParams = VerifyParams()
    train: TrainParams = TrainParams()
    compare: CompareParams = CompareParams()
    tracking: TrackingParams = TrackingParams()

    def trainer_config(self) -> TrainerConfig:
        """The plain `brorl.train.TrainerConfig` of this experiment (LR by the sqrt rule)."""
        from brorl.train.config import LossConfig, TrainerConfig

        u, f, g, v, t = self.update, self.filter, self.generate, self.verify, self.train
        return TrainerConfig(
            init_checkpoint=t.init_checkpoint, checkpoint_dir=t.checkpoint_dir, steps=t.steps,
            seed=t.seed, prompts_per_step=u.prompts_per_step,
            rollouts_per_prompt=u.rollouts_per_prompt, lr=u.lr,
            mini_batches_per_step=u.mini_batches_per_step, epochs_per_step=u.epochs_per_step,
            micro_batch_rollouts=t.micro_batch_rollouts, advantage_estimator=u.advantage_estimator,
            loss=LossConfig(
                clip_eps_low=u.clip_eps_low, clip_eps_high=u.clip_eps_high, tis_mode=u.tis_mode,
                tis_cap=u.tis_cap, tis_min=u.tis_min, kl_coef=u.kl_coef,
                kl_estimator=u.kl_estimator, kl_input_clamp=u.kl_input_clamp,
                kl_output_clamp=u.kl_output_clamp, entropy_coef=u.entropy_coef,
            ),
            reference_reset_every=u.reference_reset_every,
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


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml_tree(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The merged mapping of `path` and the files it `extends`, before validation."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ParamsError(f"{path}: `extends` forms a cycle ({chain}); remove one link.")
    if not path.is_file():
        raise ParamsError(f"{path}: params file not found; pass a file under params/.")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: top level must be a mapping of sections, got {type(raw).__name__}.")
    parents = raw.pop("extends", None) or []
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ParamsError(f"{path}: `extends` must be a file name or a list of them, got {parents!r}.")
    tree: dict[str, Any] = {}
    for parent in parents:  # later parents override earlier ones, this file overrides all
        tree = _deep_merge(tree, read_yaml_tree(path.parent / parent, (*_seen, path)))
    return _deep_merge(tree, raw)


def apply_override(tree: dict[str, Any], override: str) -> dict[str, Any]:
    """Return `tree` with one `dotted.key=value` override applied (value parsed as YAML)."""
    if "=" not in override:
        raise ParamsError(f"override {override!r}: expected KEY=VALUE, e.g. simulate.steps=200.")
    key, _, text = override.partition("=")
    parts = key.strip().split(".")
    value = yaml.safe_load(text)
    nested: Any = value
    for part in reversed(parts):
        nested = {part: nested}
    return _deep_merge(tree, nested)


def _describe(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid params:"]
    for e in err.errors():
        where = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key; check its spelling against brorl/params.py.")
        else:
            lines.append(f"  {where}: {e['msg']} (got {e.get('input')!r}).")
    return "\n".join(lines)


def load_params(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentParams:
    """Load, merge, override and validate a params file."""
    tree = read_yaml_tree(path)
    for override in overrides:
        tree = apply_override(tree, override)
    source = str(path) + (f" with overrides {list(overrides)}" if overrides else "")
    try:
        return ExperimentParams.model_validate(tree)
    except ValidationError as err:
        raise ParamsError(_describe(err, source)) from None
