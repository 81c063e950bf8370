"""The run sections: `train` (the RL run), `compare` (the two arms), `tracking` (MLflow, outputs).

`brorl.train.config.TrainerConfig.from_params` reads `train` with the sections of `brorl.params.rl`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from brorl.params.section import Section


def own_checkpoints(run_dir: str) -> str:
    """The default `train.checkpoint_dir` of a run writing `run_dir`: `<run_dir>/checkpoints`."""
    return f"{run_dir.rstrip('/')}/checkpoints"


ZeroStage = Literal[0, 1, 2]
"""DeepSpeed ZeRO stage (`TrainParams.zero_stage`); stage 3 is not offered."""
EvalSplit = Literal["validation", "test", "holdout"]
"""A split an evaluation scores (`TrainParams.eval_splits`)."""


class TrainParams(Section):
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
    zero_stage: ZeroStage = 2
    """DeepSpeed ZeRO stage. Our choice: 2 (optimizer states and gradients partitioned). Stage 3
    is not offered: the rollout engine and the HF checkpoint need whole parameters."""
    dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    """Training precision; bfloat16 is for GPUs (about 20x slower on this CPU, platform notes).
    `auto`: bfloat16 on CUDA, float32 on CPU (one params file for both)."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW weight decay. Not stated (ProRL (arXiv 2505.24864) §3.2 gives only AdamW): torch's
    default, our choice."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1 (torch default)."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW beta2 (torch default)."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon (torch default)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient-norm clip per optimizer step (verl and OpenRLHF default 1.0): our choice."""
    peak_tflops: PositiveFloat | None = None
    """Peak TFLOP/s of one device, the 100% of `perf/mfu` and `perf/score_mfu`. None: the
    CUDA device's data-sheet bfloat16 peak where `brorl.system.devices` knows it; on other devices
    (a CPU) the MFU is left out."""
    warmup_steps: NonNegativeInt = 0
    """Linear LR warm-up in optimizer steps; 0: constant LR as ProRL v1 (ProRL (arXiv 2505.24864)
    §3.2)."""
    seed: int = 0
    """Seed of the prompt order, the rollout sampling and the mini-batch shuffle (what a study's
    seeds vary); never of the evaluation (`eval_seed`)."""
    continue_stream: bool = True
    """When `init_checkpoint` holds a `run.json` (written by an earlier run's end), continue its
    prompt stream and per-step seeds instead of restarting them (the BroRL paper leaves the
    continuation's data order open: our choice, so the arms never replay the warm-up's prompts).
    False: start at step 0 of a fresh stream."""
    checkpoint_dir: str | None = None
    """Folder of `step_XXXXXX/` checkpoints and the `latest` pointer. Unset (or null):
    `<run_dir>/checkpoints`, filled in as the params load, so a run given a new `run_dir` never
    resumes another run's checkpoints and the recorded params name the folder."""
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
    """Budget: rollouts generated (refills included), never exceeded: each draw is capped at
    floor(remaining / N) prompts and the run stops once fewer than N remain, so a budget
    divisible by N ends exactly on it; None: no limit."""
    min_steps: PositiveInt | None = None
    """Steps the run takes however soon its rollout budget is spent: past the budget its draws
    are no longer capped and the run stops at `min_steps` (evaluated at the step that spent the
    budget and at the last step). A study's arm scored at equal rollouts and at equal optimizer
    steps reaches both points whatever share of its groups the filter drops. None: the budget
    alone stops the run. Our choice, not the paper's."""
    max_seconds: float | None = Field(None, gt=0)
    """Budget: stop once the run's training stages took this long (s, summed over sessions;
    evaluation and checkpoints excluded); None: none. Wall-clock time: where it stops the run,
    the step it stops at (so every result) depends on the machine and its load; the rollout and
    step budgets do not."""
    plateau_patience: PositiveInt | None = None
    """Stop after this many validation evaluations without a new best `val/score_mean` (the
    `prorl_warmup` stage's saturation rule); needs "validation" in `eval_splits`, so the
    stopping point is never chosen on the test instances that later score the arms. None:
    never stop early."""
    eval_every: PositiveInt = 5
    """Steps between held-out evaluations (also at step 0 and at the step that spends a budget)."""
    eval_splits: list[EvalSplit] = Field(["test"], min_length=1)
    """Splits each evaluation scores (one record per split): `test` for reported results,
    `validation` for model selection and the plateau rule (never test: selection bias),
    `holdout` for a study's test split drawn from its pool's difficulty band
    (`brorl.study.pool`)."""
    eval_steps: list[PositiveInt] = []
    """Steps evaluated besides every `eval_every`-th (e.g. a study's equal-steps point in a run
    whose `eval_every` is its whole length)."""
    eval_split_samples: dict[EvalSplit, PositiveInt] = {}
    """Samples per instance of a split when not `eval_samples` (e.g. 64 on a study's hold-out
    split for pass@k up to k = 64, 8 on its full test split)."""
    eval_per_family: PositiveInt = 20
    """Instances per family of each evaluated split (the same instances every time)."""
    eval_seed: int = 0
    """Seed that draws the evaluation instances per family and seeds the evaluation sampling:
    every seed of a study is scored on the same instances with the same sampling seed. It is
    not `seed`. Our choice."""
    eval_samples: PositiveInt = 4
    """k, samples per instance: pass@1 is the mean correctness over them (avg@k), unbiased pass@k
    beside it (BroRL App. D uses 16; 4 on CPU)."""
    eval_temperature: float = Field(0.6, ge=0)
    """Evaluation sampling temperature (BroRL App. D: 0.6)."""
    eval_top_p: float = Field(0.95, gt=0, le=1)
    """Evaluation nucleus top-p (BroRL App. D: 0.95)."""

    @model_validator(mode="before")
    @classmethod
    def _checkpoints_in_run_dir(cls, data: Any) -> Any:
        """An unset `checkpoint_dir` becomes `<run_dir>/checkpoints` (the run's own folder)."""
        if isinstance(data, dict) and data.get("checkpoint_dir") is None:
            run_dir = data.get("run_dir", cls.model_fields["run_dir"].default)
            if isinstance(run_dir, str):  # else run_dir's own check names the bad value
                data = {**data, "checkpoint_dir": own_checkpoints(run_dir)}
        return data

    @model_validator(mode="after")
    def _check_train(self) -> TrainParams:
        if len(set(self.eval_splits)) != len(self.eval_splits):
            raise ValueError(f"train.eval_splits {self.eval_splits} names a split twice; list "
                             "each of validation, test, holdout at most once.")
        if self.min_steps is not None and (self.max_rollouts is None
                                           or self.min_steps > self.steps):
            raise ValueError(
                f"train.min_steps = {self.min_steps} needs train.max_rollouts set and at most "
                f"train.steps = {self.steps} (it keeps a run going past its rollout budget); "
                "set max_rollouts and steps >= min_steps, or min_steps: null.")
        if self.plateau_patience is not None and "validation" not in self.eval_splits:
            raise ValueError(
                f"train.plateau_patience = {self.plateau_patience} needs 'validation' in "
                f"train.eval_splits (got {self.eval_splits}): the plateau rule watches "
                "val/score_mean only, never test scores; add validation to eval_splits or set "
                "plateau_patience: null.")
        return self


class DiagnosticsParams(Section):
    """Knowledge shrinkage on the live policy (`brorl.train.diagnostics`, BroRL §4.1, Fig. 3):
    probes scored before and after each PPO update, logged as `diag/*` (docs/metrics.md).
    Their seconds are kept out of the training time (`time/diagnostics`)."""

    enabled: bool = True
    """Score the probes around every update. Forward passes only (no randomness drawn), so a
    run's training is the same with or without them."""
    probes_per_family: PositiveInt = 8
    """Held-out probes per family: validation problems with a reference response, drawn by
    `seed` (the same probes all run long, and in every run with that seed). Our choice: a few
    dozen in all."""
    step_probes: NonNegativeInt = 16
    """Most of the step's own drawn prompts scored per class, solved (some rollout correct: the
    correct path was sampled) and unsolved (none was), in draw order; 0: none. Our choice."""
    decompose: bool = False
    """Also split the first-order change of the held-out Q_pos into the parts driven by the
    step's correct and incorrect rollouts (gradient dot products; two extra backward passes
    over the step's rollouts: +41% (ProRL) and +57% (BroRL) on a CPU-default step, measured by
    `benchmarks/diagnostics_cost.py --decompose`). Off by default for its cost."""
    seed: int = 0
    """Seed that draws the held-out probes. Our choice."""


class CompareParams(Section):
    """The ProRL-vs-BroRL comparison (`flows/compare.py`): arms, shared start, equal budget."""

    arms: dict[str, str | dict[str, Any]] = {"prorl": "params/prorl.yaml",
                                             "brorl": "params/brorl.yaml"}
    """Arm name -> its params file (relative to the repository root), or the keys the arm sets
    over this comparison's own params (e.g. `{update: {rollouts_per_prompt: 64}, train:
    {algorithm: brorl, run_dir: outputs/mine/brorl}}`), so that one file holds the data, the
    model, both arms and the report (docs/real_model.md). A file's arm must read this
    comparison's data and start from its checkpoint (`brorl.params.compare_arms`)."""
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
    """Each arm's budget in training seconds (set as `train.max_seconds`; evaluation and
    checkpoints excluded; wall-clock time, so where it ends an arm the results depend on the
    machine and its load); None: the arms' own."""
    baseline: str = "prorl"
    """The arm every other arm is tested against (each paired difference is arm - baseline,
    whatever the order of `arms`); must be a key of `arms`."""
    report_dir: str | None = None
    """Folder of the report (Markdown, JSON, PNG plots); None: `<tracking.output_dir>/<name>/
    compare`, filled in as the params load, so a new params file never writes another
    comparison's report (`ExperimentParams`)."""

    @model_validator(mode="after")
    def _check_baseline(self) -> CompareParams:
        if len(self.arms) < 2:
            raise ValueError(f"compare.arms {sorted(self.arms)} needs at least two arms (arm name "
                             "-> params file): a comparison of one arm tests nothing.")
        if self.baseline not in self.arms:
            raise ValueError(
                f"compare.baseline {self.baseline!r} is not a key of compare.arms "
                f"{sorted(self.arms)}: name the arm the others are tested against (e.g. prorl)."
            )
        return self


class TrackingParams(Section):
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
