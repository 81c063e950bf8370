"""The `study` section: ProRL against BroRL, and depth against breadth at equal compute, from one
frozen start, on a prompt pool with headroom, over several seeds (docs/study.md holds the
pre-registered plan).

A study is a set of arms, each a set of runs (one per seed) that continue the study's start
policy with the study file's params and the arm's own `update` keys (N, B, and e.g. the LR's
anchor). Before the runs, the study's own warm-up trains on until its validation curve is shown
flat (`StudyWarmup`: a TOST on the slope) or a cap, and its pool stage picks the RL prompts and
a hold-out split of the same difficulty from the train split by the start policy's estimated
pass rate (`StudyPool`); `frozen` keeps that start from ever being drawn again. Each run stops
at the equal rollout budget or at the equal step count (`StudyArm.stop`) and is evaluated at
both points, so every arm is compared at equal rollouts and at equal optimizer steps. `contrasts` are
the pre-registered comparisons: seed-level tests with t intervals, Holm within the confirmatory
family (`confirmatory`) and within the rest, a TOST at `margin` only where a contrast says so
(`premise`) (`brorl.study.analysis`).

`brorl.study.plan` expands the section into runs and each run's `ExperimentParams`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator

from brorl.params.section import Section

ARM_NAME = re.compile(r"[a-z][a-z0-9]*")
"""An arm's name: its runs are `<arm>_s<seed>` (folders and DVC keys)."""
SHAPE_KEYS = ("prompts_per_step", "rollouts_per_prompt")
POINTS = ("steps", "budget")
"""Where a run is scored besides its start: after `equal_steps` RL steps, at `budget_rollouts`."""


class StudyArm(Section):
    """One arm: `update` keys over the study file's `update` section, its seeds, where it ends."""

    update: dict[str, Any]
    """`update` keys of the arm, at least `prompts_per_step` and `rollouts_per_prompt`; e.g.
    `base_samples_per_step: 1024` anchors the sqrt rule at BroRL's 2 x 512, so its LR is
    `base_lr` (ProRL's). Checked against the whole `update` section at load time."""
    seeds: PositiveInt = 4
    """Runs, with `train.seed` 0 .. seeds-1 (the prompt order and rollout sampling)."""
    stop: Literal["rollouts", "steps"] = "rollouts"
    """`rollouts`: run to `budget_rollouts` (equal rollouts) and at least `equal_steps` RL steps
    (`train.min_steps`: a run whose filter dropped many groups goes on past its spent budget),
    scored at both points; `steps`: run `equal_steps` RL steps only (equal optimizer steps;
    e.g. an N-sweep point whose budget in rollouts would be hundreds of steps)."""
    about: str = ""
    """One line for the report: what the arm isolates."""


class StudyWarmup(Section):
    """The study's own warm-up: ProRL from `train.init_checkpoint` until its validation curve
    is flat by a TOST on the slope over the last `window` evaluations (the evaluations as the
    unit), or `max_steps`."""

    eval_every: PositiveInt = 96
    """Steps between validation evaluations: the window of 5 then spans 384 steps, about 1.1
    study budgets of ProRL rollouts, so the slope is measured over the horizon its margin speaks
    of (a shorter window leaves the drift per budget less precise than the margin)."""
    window: int = Field(5, ge=5)
    """Evaluations in the slope test, the newest ones (at least 5)."""
    margin: float = Field(0.03, gt=0, lt=1)
    """Flat means: the slope times `study.budget_rollouts` (the drift over one study run) lies
    within +-margin (score units; 0.03 = 3 points), shown by a TOST at `study.alpha / looks`."""
    max_steps: PositiveInt = 672
    """Cap of the warm-up in RL steps; a warm-up stopped by it is reported as not plateaued."""
    eval_per_family: PositiveInt = 143
    """Validation instances per family (143: every one of the tiny data's 326)."""
    min_instances: PositiveInt = 300
    """Fewest validation instances the slope test accepts (the issue: >= 300); CI-sized data
    has fewer, and its params file says so."""
    eval_samples: PositiveInt = 16
    """Samples per validation instance (avg@16: the per-instance noise of the slope)."""

    @property
    def looks(self) -> int:
        """Tests the warm-up may run (one per evaluation from the `window`-th to the cap's):
        each is a TOST at alpha / looks (Bonferroni), so stopping at the first that passes
        keeps the chance of a false "flat" at alpha."""
        return max(1, self.max_steps // self.eval_every + 1 - self.window + 1)


class StudyPool(Section):
    """The RL prompt pool: train prompts picked by the start policy's estimated pass rate (the
    share of correct rollouts at the training temperature), never by test instances."""

    samples: PositiveInt = 16
    """Rollouts per train prompt in the first round of the estimate."""
    rare_samples: PositiveInt = 112
    """Extra rollouts for each prompt the first round solved at most `rare_below` times (128 in
    all): their pass rate (below about 1/16) is what BroRL's 512 rollouts are meant to reach."""
    rare_below: int = Field(1, ge=0)
    """First-round solves at or below which a prompt gets `rare_samples` more."""
    target: tuple[float, float] = (0.35, 0.65)
    """The band the predicted ProRL dynamic-sampling pass rate at its N must reach (binary keep
    rule: 1 - p^N - (1-p)^N averaged over the pool); the pool is the hardest prompts (lowest
    estimate first) up to the band's centre."""
    min_solves: int = Field(1, ge=0)
    """A prompt solved fewer times than this in all its estimate's rollouts is left out (no
    arm can learn from it, and at N = 512 each of its groups is a refill)."""
    min_prompts: PositiveInt = 64
    """Fewest prompts in the pool; fewer fails the stage, naming the fix (harder data)."""
    holdout_fraction: float = Field(0.4, gt=0, lt=1)
    """Share of each family's band prompts held out as the study's test split before the pool
    is chosen (`brorl.study.pool`): the primary endpoint is scored on prompts of the pool's own
    difficulty, never trained on."""
    holdout_min_per_family: PositiveInt = 30
    """Fewest hold-out prompts of each family in the band; fewer fails the stage."""
    seed: int = 0
    """Seed of the estimate's rollouts and of the hold-out's draw."""

    @model_validator(mode="after")
    def _check_pool(self) -> StudyPool:
        low, high = self.target
        if not 0 < low < high < 1:
            raise ValueError(f"study.pool.target = {list(self.target)} must be two pass rates "
                             "0 < low < high < 1, e.g. [0.35, 0.65].")
        return self


class StudyContrast(Section):
    """One pre-registered comparison, b - a: each side is `start` (the shared step-0
    evaluation) or `<arm>@steps` / `<arm>@budget` (the arm's runs at `equal_steps` RL steps or
    at `budget_rollouts`)."""

    a: str
    b: str
    about: str = ""
    """One line for the report: the question the contrast answers."""
    equivalence: bool = False
    """Read a TOST within `study.margin` ("equivalent"): only where the plan shows the TOST has
    power at the planned seeds (docs/study.md); else the contrast reads higher, lower or
    inconclusive, never equivalent."""


class StudyParams(Section):
    """Arms, budgets, warm-up, pool, contrasts and statistics of a study (docs/study.md)."""

    arms: dict[str, StudyArm] = {}
    """Name -> arm; the first is the baseline (ProRL). {} is no study."""
    budget_rollouts: PositiveInt = 49_152
    """Equal budget in generated rollouts (refills count) of the arms that stop on rollouts:
    48 BroRL steps of 2 x 512 when no step refills."""
    equal_steps: PositiveInt = 48
    """RL steps at which every arm is also scored (4 mini-batches, so 4 optimizer steps each):
    equal optimizer steps."""
    evaluations: PositiveInt = 4
    """Evaluations of a run up to `equal_steps` (at equal fractions of it); a run that goes on
    to its budget is evaluated there, and nowhere in between (an evaluation of the hold-out at
    64 samples costs as much generation as several training steps)."""
    contrasts: dict[str, StudyContrast] = {}
    """The pre-registered comparisons (name -> sides)."""
    confirmatory: list[str] = []
    """The contrasts of the confirmatory family, which Holm adjusts; every other contrast is
    exploratory (Holm over the exploratory ones reported beside, no claim rests on them)."""
    premise: str | None = None
    """The contrast whose TOST shows the start is a plateau where the arms run: the baseline
    arm continued on the pool against the start, on the primary endpoint."""
    revival: dict[str, list[str]] = {}
    """Arm -> the confirmatory contrasts that must all read higher (Holm-adjusted, seed level)
    for the arm to "revive the plateau", together with the premise shown: the pre-registered
    rule."""
    start_replicates: int = Field(3, ge=1)
    """Evaluations of the start under different sampling seeds (the first is every run's
    step-0 row): a contrast against the start is Welch's t between these and the arm's seeds,
    so the start's evaluation noise enters the test."""
    eval_split_samples: dict[str, PositiveInt] = {"holdout": 64, "test": 8}
    """Samples per instance of each evaluated split (`train.eval_split_samples` of every run):
    64 on the hold-out for pass@k up to 64, 8 on the full test split."""
    design_sd: dict[str, float] = {}
    """Per-seed sd of the primary endpoint (score units) per arm and `start` that the plan's
    power analysis assumed (docs/study.md): the report states each contrast's detectable
    effect from these, never from the sds it observed."""
    frozen: str | None = None
    """The committed record of the frozen start (`brorl.study.frozen`): warm-up, pool, hold-out
    and start scores made once; a stage finds them unchanged or stops. None: not frozen."""
    margin: float = Field(0.03, gt=0, lt=1)
    """Equivalence margin of every "no change" reading, score units (0.03 = 3 points): a
    difference shown inside +-margin by TOST counts as no change; our choice, fixed a priori."""
    warmup: StudyWarmup = StudyWarmup()
    pool: StudyPool = StudyPool()
    out_dir: str = "outputs/study"
    """Folder of the study: `warmup/`, `pool/`, `plan/`, `start/`, `runs/<run>/`, the report."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Level of every interval of the report."""
    alpha: float = Field(0.05, gt=0, lt=1)
    """Family-wise level of the tests (Holm) and level of each TOST."""
    power: float = Field(0.8, gt=0, lt=1)
    """Power at which the report states the minimum detectable difference."""
    resamples: PositiveInt = 10_000
    """Bootstrap resamples per interval."""
    bootstrap_seed: int = 0
    """Seed of every bootstrap of the report (the same study gives the same intervals)."""

    @property
    def baseline(self) -> str:
        """The first arm: the one the plan's progress estimates and the figures start from."""
        return next(iter(self.arms))

    @model_validator(mode="after")
    def _check_study(self) -> StudyParams:
        for name, arm in self.arms.items():
            if not ARM_NAME.fullmatch(name):
                raise ValueError(f"study.arms: name {name!r} must be lower-case letters and "
                                 "digits starting with a letter (its runs are <name>_s<seed>), "
                                 "e.g. brorllr.")
            missing = [k for k in SHAPE_KEYS if k not in arm.update]
            if missing:
                raise ValueError(f"study.arms.{name}.update lacks {missing}: every arm states "
                                 "its N (rollouts_per_prompt) and B (prompts_per_step).")
            n, b = arm.update["rollouts_per_prompt"], arm.update["prompts_per_step"]
            if arm.stop == "rollouts" and self.budget_rollouts % n:
                raise ValueError(
                    f"study.budget_rollouts = {self.budget_rollouts} is not divisible by arm "
                    f"{name}'s N = {n}: its run would stop short of the budget; pick a "
                    "multiple of every N (e.g. of 1024).")
            if arm.stop == "rollouts" and self.budget_rollouts < self.equal_steps * n * b:
                raise ValueError(
                    f"study.budget_rollouts = {self.budget_rollouts} gives arm {name} (B x N = "
                    f"{n * b}) fewer than study.equal_steps = {self.equal_steps} steps: raise "
                    f"the budget to at least {self.equal_steps * n * b} (more for refills).")
        for name, c in self.contrasts.items():
            for side in (c.a, c.b):
                arm, _, point = side.partition("@")
                if side != "start" and (arm not in self.arms or point not in POINTS or (
                        point == "budget" and self.arms[arm].stop == "steps")):
                    raise ValueError(
                        f"study.contrasts.{name}: side {side!r} is not `start` or "
                        f"`<arm>@steps` / `<arm>@budget` of an arm {sorted(self.arms)} (an arm "
                        "with stop: steps has no @budget point).")
            if c.a == c.b or c.b == "start":
                raise ValueError(f"study.contrasts.{name}: sides {c.a!r} and {c.b!r}; the sides "
                                 "must differ and `start` may only be side a (b - start).")
        loose = [n for n in [*self.confirmatory, *([self.premise] if self.premise else [])]
                 if n not in self.contrasts]
        if loose:
            raise ValueError(f"study.confirmatory / study.premise name {loose}, which are not "
                             f"contrasts {sorted(self.contrasts)}.")
        if self.premise and not self.contrasts[self.premise].equivalence:
            raise ValueError(f"study.premise {self.premise!r} is read by its TOST: set "
                             f"study.contrasts.{self.premise}.equivalence: true.")
        for arm, names in self.revival.items():
            unknown = [n for n in names if n not in self.confirmatory]
            if arm not in self.arms or unknown or not names:
                raise ValueError(f"study.revival.{arm} = {names}: name an arm of "
                                 f"{sorted(self.arms)} and at least one confirmatory contrast "
                                 f"{self.confirmatory} (not confirmatory: {unknown}).")
        if self.equal_steps % self.evaluations:
            raise ValueError(f"study.equal_steps = {self.equal_steps} is not a multiple of "
                             f"study.evaluations = {self.evaluations}: the evaluations would "
                             "miss the equal-steps point; e.g. 48 and 4.")
        return self
