"""The RL stage sections: `update`, `filter`, `generate` and `verify` (BroRL §3.1, §4.2.1).

`brorl.train.config.TrainerConfig.from_params` turns them, with `train`, into the trainer's
settings. The derived sizes (B * N, the sqrt-scaled LR, the mini-batch) are properties here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from brorl.algorithm.schedule import scaled_lr
from brorl.params.section import Section

Allocation = Literal["fixed", "adaptive"]
"""How a draw spends its B x N rollouts (`UpdateParams.allocation`)."""
AdvantageEstimator = Literal["reinforce_pp_baseline", "grpo"]
"""`reinforce_pp_baseline`: ProRLv2/BroRL (BroRL §3.1); `grpo`: ProRL v1 (ProRL (arXiv
2505.24864) §2); `brorl.algorithm.advantages`."""
KLEstimator = Literal["k1", "k2", "k3"]
"""k1 = log(pi/ref); k2 = 0.5 log(pi/ref)^2 (the ProRLv2 blog post);
k3 = ref/pi - 1 - log(ref/pi) (`brorl.algorithm.losses.kl_penalty`)."""
TISMode = Literal["none", "truncate", "icepop"]
"""none; truncate: w = min(ratio, cap); icepop: w = ratio inside [tis_min, cap], else 0
(`brorl.algorithm.losses`)."""
KeepRule = Literal["binary", "any_difference"]
"""Which groups dynamic sampling keeps (`FilterParams.keep_rule`, `brorl.algorithm.filtering`)."""
EngineKind = Literal["hf", "vllm"]
"""The rollout engine (`GenerateParams.engine`, `brorl.engines.build_engine`)."""
CompileSetting = Literal["auto", "on", "off"]
"""The hf engine's compiled decode step (`GenerateParams.compile`,
`brorl.engines.decode.use_compile`)."""


class UpdateParams(Section):
    """The RL update (BroRL §3.1, §4.2.1; the ProRLv2 blog post); the functions live in
    `brorl/algorithm/`.

    Also the one home of B and N (`prompts_per_step`, `rollouts_per_prompt`): the sample and
    generate stages read them here, because the LR rule and the mini-batch split derive from them.
    Defaults are the ProRL arm; the BroRL arm overlays B=128, N=512 and nothing else.
    """

    prompts_per_step: PositiveInt = 512
    """B, prompts whose groups are trained per step (after filtering). BroRL Table 1: ProRL 512,
    BroRL 128."""
    rollouts_per_prompt: int = Field(16, ge=2)
    """N, rollouts per prompt, at least 2 (the group baseline needs two: with one, every
    advantage is 0 and the binary keep rule keeps nothing). BroRL Table 1: ProRL 16, BroRL 512."""
    train_subset: PositiveInt | None = None
    """M, rollouts per group the update trains on, 2 <= M < N; None trains on all N. Each kept
    group's N rollouts are verified and its M of largest reward variance are kept (PODS,
    Xu et al. 2025, `brorl.algorithm.downsample`); advantages are computed on the M. The LR
    follows the rollouts trained: the sqrt rule and the mini-batch split use B * M
    (`trained_per_step`), so the update's cost stops growing with N. Not in the BroRL paper."""
    allocation: Allocation = "fixed"
    """How a draw spends its B x N rollouts. `fixed`: N per prompt (the paper). `adaptive`: a
    first round of `first_round` per prompt, then the rest of the draw's B x N to the prompts
    whose groups it makes most informative (Knapsack RL's value, capped at
    `max_rollouts_per_prompt` per prompt; `brorl.algorithm.allocation`, docs/algorithm.md).
    The same rollouts per step as `fixed`; groups then differ in size. Not in the BroRL paper."""
    first_round: PositiveInt | None = None
    """n0 of `adaptive`: rollouts per prompt before the allocation, 2 <= n0 < N; None: N / 4
    (at least 2), our choice. Unused with `fixed`."""
    max_rollouts_per_prompt: PositiveInt | None = None
    """Cap of `adaptive`: most rollouts one prompt gets in all, >= N; None: 4 N, our choice
    (Knapsack RL caps too, so one hard prompt cannot take a whole step). Unused with `fixed`."""
    base_lr: float = Field(2e-6, gt=0)
    """Learning rate at `base_samples_per_step` samples. ProRL v1's constant 2e-6 (ProRL (arXiv
    2505.24864) §3.2); not stated for ProRLv2/BroRL: our choice."""
    base_samples_per_step: PositiveInt = 8192
    """Samples per step (B*N) at which `base_lr` applies: the ProRL arm, 512 x 16 (BroRL
    Table 1)."""
    mini_batches_per_step: PositiveInt = 4
    """PPO mini-batches (optimizer steps) per RL step, equal in both arms (BroRL §4.2.1).
    ProRL v1: 256 / 64 = 4 (ProRL (arXiv 2505.24864) §3.2); not stated for BroRL: our choice."""
    epochs_per_step: PositiveInt = 1
    """Passes over the step's rollouts. Not stated in the paper: our choice, one pass."""
    max_tokens_per_micro_batch: PositiveInt | Literal["auto"] | None = "auto"
    """Most positions one forward/backward (and one scoring forward) computes: a prompt's rows
    packed end to end (shared-prefix models) or rows of similar response length together, so
    little compute goes to padding (`brorl.train.micro`, as verl's `use_dynamic_bsz` /
    `ppo_max_token_len_per_gpu`); `train.micro_batch_rollouts` still caps the sequences (packed
    lanes, or rows). `auto`: 16384 on CUDA (verl's default), 4096 on CPU. null: micro-batches of
    `train.micro_batch_rollouts` rows grouped by prompt, right-padded (the row-padded layout).
    The loss and its normalisation over the mini-batch are the same either way. Our choice."""
    clip_eps_low: float = Field(0.2, ge=0, lt=1)
    """PPO clip below: ratio >= 1 - eps_low. ProRLv2: 0.20 (the ProRLv2 blog post)."""
    clip_eps_high: float = Field(0.28, ge=0)
    """PPO clip above (clip-higher): ratio <= 1 + eps_high. ProRLv2: 0.28 (the ProRLv2 blog
    post)."""
    advantage_estimator: AdvantageEstimator = "reinforce_pp_baseline"
    """REINFORCE++-baseline (ProRLv2/BroRL, BroRL §3.1) or GRPO (ProRL v1, ProRL (arXiv
    2505.24864) §2)."""
    kl_coef: float = Field(1e-4, ge=0)
    """beta, weight of the KL to the reference (0: off). Stated neither in the BroRL paper nor
    in the ProRLv2 blog post; NeMo-RL's ProRLv2 example config uses 1e-4: our choice."""
    kl_estimator: KLEstimator = "k2"
    """KL estimator per token; ProRLv2 uses k2 = 0.5 log(pi/ref)^2 (the ProRLv2 blog post)."""
    kl_input_clamp: float = Field(20.0, gt=0)
    """Clamp of log(pi/ref) before the estimator. NeMo-RL's ProRLv2 example config: 20; the ProRLv2
    blog post: 10."""
    kl_output_clamp: float = Field(10.0, gt=0)
    """Clamp of the per-token KL estimate. NeMo-RL's ProRLv2 example config: 10."""
    tis_mode: TISMode = "truncate"
    """Engine->trainer correction: truncated IS as the paper names it (BroRL §3.1); NeMo-RL's
    ProRLv2 example config uses `icepop`; `none` turns it off. Needs `generate.top_p: 1`
    (checked in `ExperimentParams`): the trainer scores log-probs without top-p."""
    tis_cap: float = Field(5.0, gt=0)
    """Upper bound of the engine->trainer ratio (truncate: cap; icepop: band top). Not stated in
    the paper; NeMo-RL's ProRLv2 example config: 5.0: our choice."""
    tis_min: float = Field(0.5, ge=0)
    """Lower end of the IcePop band (tokens below get weight 0). NeMo-RL's ProRLv2 example
    config: 0.5."""
    entropy_coef: float = Field(0.0, ge=0)
    """Entropy bonus weight; 0: entropy is logged only (none of the sources uses a bonus)."""
    reference_reset_every: PositiveInt | None = 200
    """Steps between resets of the reference to the current policy (None: never). ProRLv2 resets
    every 200-500 steps (the ProRLv2 blog post); not stated for BroRL: our choice, 200."""
    reset_optimizer_on_reference_reset: bool = False
    """Clear the optimizer state at a reference reset: ProRLv2 keeps it (False, the ProRLv2 blog
    post), ProRL v1 re-initialised it (True, ProRL (arXiv 2505.24864) §2.3.1)."""

    @property
    def samples_per_step(self) -> int:
        """B * N, rollouts generated per step once filtering kept B groups (planned)."""
        return self.prompts_per_step * self.rollouts_per_prompt

    @property
    def trained_per_step(self) -> int:
        """Rollouts the update trains per step (planned): B * M with `train_subset`, else B * N."""
        return self.prompts_per_step * (self.train_subset or self.rollouts_per_prompt)

    @property
    def first_round_rollouts(self) -> int:
        """n0 of the adaptive allocation: `first_round`, or max(2, N // 4)."""
        return self.first_round or max(2, self.rollouts_per_prompt // 4)

    @property
    def rollouts_cap(self) -> int:
        """Most rollouts per prompt of the adaptive allocation: `max_rollouts_per_prompt`, or 4N."""
        return self.max_rollouts_per_prompt or 4 * self.rollouts_per_prompt

    @property
    def lr(self) -> float:
        """base_lr * sqrt(trained_per_step / base_samples_per_step) (BroRL §4.2.1)."""
        return scaled_lr(self.base_lr, self.trained_per_step, self.base_samples_per_step)

    @property
    def mini_batch_rollouts(self) -> int:
        """Rollouts per PPO mini-batch: trained_per_step / mini_batches_per_step (BroRL
        §4.2.1)."""
        return self.trained_per_step // self.mini_batches_per_step

    @model_validator(mode="after")
    def _check_update(self) -> UpdateParams:
        m, n = self.train_subset, self.rollouts_per_prompt
        if m is not None and not 2 <= m < n:
            raise ValueError(
                f"update.train_subset = {m} must be at least 2 and below rollouts_per_prompt = "
                f"{n}: it is the M of the N rollouts per group that the update trains on (one "
                "rollout has no group baseline, M = N selects nothing); set 2..N-1, or null to "
                "train on all N."
            )
        n0, cap = self.first_round_rollouts, self.rollouts_cap
        if self.allocation == "adaptive" and m is not None:
            raise ValueError(
                "update.allocation = 'adaptive' with update.train_subset: the adaptive groups "
                "differ in size, and the subset takes M of every group's N; use one of them.")
        if self.allocation == "adaptive" and not 2 <= n0 < n:
            raise ValueError(
                f"update.first_round = {n0} must be at least 2 (a first-round pass rate needs "
                f"two rollouts) and below rollouts_per_prompt = {n} (the rest is what the "
                "adaptive allocation spends); e.g. N / 4.")
        if self.allocation == "adaptive" and cap < n:
            raise ValueError(
                f"update.max_rollouts_per_prompt = {cap} is below rollouts_per_prompt = {n}: a "
                "draw's B x N rollouts would not fit; set at least N (e.g. 4 N).")
        if self.trained_per_step % self.mini_batches_per_step:
            trained = "train_subset" if m is not None else "rollouts_per_prompt"
            raise ValueError(
                f"prompts_per_step * {trained} = {self.trained_per_step} rollouts trained per step "
                f"do not split into mini_batches_per_step = {self.mini_batches_per_step} equal "
                "mini-batches; the count is fixed across arms (BroRL §4.2.1), so pick a divisor "
                "of the rollouts trained, B * N (B * M with train_subset)."
            )
        if self.tis_min >= self.tis_cap:
            raise ValueError(
                f"tis_min ({self.tis_min}) must be below tis_cap ({self.tis_cap}): they bound the "
                "kept band of engine->trainer ratios; e.g. 0.5 and 5.0."
            )
        return self


class FilterParams(Section):
    """Dynamic sampling (DAPO; BroRL §3.1, NeMo-RL's ProRLv2 example config): drop groups the
    keep rule fails, refill."""

    enabled: bool = True
    """Filter groups by `keep_rule` and refill (BroRL §3.1). False trains on every drawn group
    (the pass rates are still logged)."""
    keep_rule: KeepRule = "binary"
    """`binary`: keep a group iff 0 < #correct < N, correct = reward >= `correct_reward` (the
    paper's rule, BroRL §3.1, Table 2). `any_difference`: keep a group whose rewards are not all
    equal, so partial credit (code, reasoning) keeps a group with no correct rollout: our
    option. Both pass rates are logged whichever is active."""
    max_draws: PositiveInt = 10
    """Most draws (generate + verify rounds) per step; then train on what was kept and flag it.
    NeMo-RL's ProRLv2 example config: `dynamic_sampling_max_gen_batches: 10`."""
    oversample: float = Field(1.0, ge=1)
    """Each draw asks for ceil(missing groups * oversample) prompts; the excess is dropped.
    NeMo-RL's ProRLv2 example config has `batch_multiplier` 1.5; ours 1.0 wastes no rollouts:
    our choice."""
    correct_reward: float = 1.0
    """A rollout with at least this reward is correct (the binary rule's M_i = M_correct,
    BroRL §3.1); a uniform group at or above it counts as all-correct
    (`filter/groups_all_correct`). 1.0: full credit, as the evaluation's pass@1
    (`brorl.evaluation.scoring`)."""
    wrong_reward: float = 0.0
    """A uniform group at or below this reward counts as all-wrong (`filter/groups_all_wrong`)."""

    @model_validator(mode="after")
    def _check_filter(self) -> FilterParams:
        if self.wrong_reward >= self.correct_reward:
            raise ValueError(
                f"wrong_reward ({self.wrong_reward}) must be below correct_reward "
                f"({self.correct_reward}); they classify rollouts and dropped groups, e.g. 0 and 1."
            )
        return self


class GenerateParams(Section):
    """Rollout generation (BroRL §3.1, §4.2.4; ProRL (arXiv 2505.24864) §3.2): the engine and its
    sampling; B and N live in `update`."""

    engine: EngineKind = "hf"
    """`hf`: in-process transformers loop (`brorl.engines.hf`); `vllm`: vLLM's offline LLM kept
    alive across steps (`brorl.engines.vllm`). The paper's engine is not stated (its
    throughput argument, BroRL §4.2.4, cites SGLang's prefix caching); ProRL v1 evaluated with
    vLLM (ProRL (arXiv 2505.24864) §3.4)."""
    temperature: float = Field(1.2, ge=0)
    """Sampling temperature; 0 is greedy. ProRL v1: 1.2 (ProRL (arXiv 2505.24864) §3.2)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus top-p of rollouts; 1 turns it off. Not stated for ProRL or BroRL training:
    1 is our choice; below 1 requires `update.tis_mode: none`."""
    max_response_tokens: PositiveInt = 64
    """Longest response (tokens); longer rollouts end with finish reason `length`. ProRL v1: 8k
    (ProRL (arXiv 2505.24864) §3.2); CPU-sized here."""
    max_concurrent_rollouts: PositiveInt | Literal["auto"] = "auto"
    """Most rollouts decoded at once (hf: chunk size, on every device, and on CUDA never more
    than the free memory holds; vllm: `max_num_seqs`), so memory does not grow with N. `auto`:
    hf on CUDA sizes the chunk from the free memory, hf off CUDA and vllm take 256 (vLLM's own
    `max_num_seqs` default)."""
    compile: CompileSetting = "auto"
    """hf: compile the fixed-shape decode step (`torch.compile(fullgraph=True)`; on CUDA
    captured as CUDA graphs, one per bucket of rows) or run it eagerly. `auto`: on on CUDA, off
    on CPU, where a cold compile takes 20-30 s per bucket and only the tiny model's step was
    faster, 1.3x (`brorl.engines.decode.use_compile`). With CUDA graphs the decode buffers stay
    allocated between calls (graphs replay on fixed addresses), also while the update runs: give
    `max_concurrent_rollouts` a number where the update needs that memory. Quote "on" and "off"
    in YAML, which reads them bare as booleans. Our choice."""
    stop_check_tokens: PositiveInt = 8
    """hf: decode steps between the host's checks of which rows have stopped (the step itself
    never reads back to the host); a finished chunk idles at most this many steps. Our choice."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """vLLM weight/activation dtype; float32 on CPU (trainer log-probs then match within 1e-4).
    `auto`: bfloat16 on CUDA, float32 on CPU (one params file for both)."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """vLLM on GPU: share of GPU memory for weights + KV cache (the trainer needs the rest)."""
    cpu_kv_cache_gib: PositiveInt = 1
    """vLLM on CPU: KV-cache size (GiB), `VLLM_CPU_KVCACHE_SPACE` (platform notes)."""
    enforce_eager: bool = False
    """vLLM: skip torch.compile / graph capture. On this CPU the engine then starts in ~13 s
    instead of ~50 s, at similar tiny-model throughput; keep False on GPU."""


class VerifyParams(Section):
    """Verifiers and the code sandbox (ProRL (arXiv 2505.24864) App. E, Table 4);
    `brorl.families.verify_batch`."""

    workers: PositiveInt | None = None
    """Parallel verifier processes per family; None uses every available core."""
    timeout_s: float = Field(5.0, gt=0)
    """Time limit (s) per item: one math or reasoning check, or all tests of one code response,
    counted as wall time less the time its processes waited for a CPU, so that load never
    changes a verdict (`brorl.verifiers.clock`; a starved item ends at 12 times it of wall time
    as `stalled`). ProRL: code over 5 s total gets reward 0 (ProRL (arXiv 2505.24864) App. E)."""
    cpu_s: PositiveInt = 5
    """Code sandbox RLIMIT_CPU (CPU seconds); matches the 5 s time limit (ProRL (arXiv
    2505.24864) App. E)."""
    memory_mib: PositiveInt = 512
    """Code sandbox RLIMIT_AS (MiB of address space); the interpreter needs about 30. Our choice."""
    open_files: PositiveInt = 32
    """Code sandbox RLIMIT_NOFILE (open file descriptors). Our choice."""
    file_bytes: PositiveInt = 2**20
    """Code sandbox RLIMIT_FSIZE (bytes): the largest file it writes, stdout and stderr
    included. Our choice."""
    output_bytes: PositiveInt = 16 * 2**10
    """Bytes of the candidate's stdout and of its stderr read back for logs. Our choice."""
