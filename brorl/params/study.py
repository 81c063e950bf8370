"""The `study` section: ProRL vs BroRL over many seeds and an N-sweep at an equal rollout budget.

A study is a set of runs, each one (N, seed) continuing the one warm-up policy with everything
else taken from the study's params file (`params/study.yaml` extends the arms' recipe,
`params/rl.yaml`). `brorl.study.plan` expands this section into the runs and each run's resolved
`ExperimentParams`; `brorl.study.report` reads their folders. The issue's protocol: two arms
(ProRL N=16, BroRL N=512) with >= 5 seeds each, a sweep over N with >= 3 seeds, a budget that
gives the BroRL arm >= 8 steps; B(N) by one rule through both arms (`prompts_per_step`), the LR
by the sqrt rule (`UpdateParams.lr`, spec §4.1).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from brorl.params.section import Section


class StudyArm(Section):
    """One arm of the study: its rollout shape (N, B) and how many seeds it runs."""

    rollouts_per_prompt: PositiveInt
    """N of the arm. Spec §4.1: ProRL 16, BroRL 512."""
    prompts_per_step: PositiveInt
    """B of the arm; with the other arm's (N, B) it fixes the rule B(N) of the sweep."""
    seeds: PositiveInt = 5
    """Runs of the arm, with `train.seed` 0 .. seeds-1 (the issue asks for >= 5)."""


class StudyVariant(Section):
    """Runs with one arm's shape (N, B, the LR by the sqrt rule, the budget) and other `update`
    settings: the adaptive allocation or a training subset, compared with both arms at the same
    rollouts (issue: beyond the paper)."""

    arm: str
    """The arm whose shape these runs take."""
    seeds: PositiveInt = 3
    """Runs, with `train.seed` 0 .. seeds-1 (the arms' seeds: the same prompt streams)."""
    update: dict[str, Any]
    """`update` keys set for these runs, e.g. {allocation: adaptive} or {train_subset: 64};
    not N or B (the arm's). Checked when the plan is built (`brorl.study.plan.run_params`)."""


VARIANT_NAME = re.compile(r"[a-z][a-z0-9]*")
"""A variant's name: its runs are `<name>_s<seed>` (folders and DVC keys); `n<digits>` is the
arms' and the sweep's."""
SHAPE_KEYS = {"prompts_per_step", "rollouts_per_prompt"}


class StudyParams(Section):
    """Runs, budget, evaluations and statistics of a study (`brorl.study`, docs/study.md)."""

    arms: dict[str, StudyArm] = {
        "prorl": StudyArm(rollouts_per_prompt=16, prompts_per_step=8),
        "brorl": StudyArm(rollouts_per_prompt=512, prompts_per_step=2)}
    """Exactly two arms, name -> shape and seeds: the baseline and the broadened arm. Defaults
    are the CPU arms of params/prorl.yaml and params/brorl.yaml (8 x 16 and 2 x 512)."""
    baseline: str = "prorl"
    """The arm the other is tested against (differences are other - baseline)."""
    variants: dict[str, StudyVariant] = {}
    """Name -> runs of one arm's shape with other update settings (`StudyVariant`); each is
    reported beside both arms at equal rollouts. {} runs none."""
    sweep_rollouts_per_prompt: list[PositiveInt] = [16, 64, 256, 512, 1024]
    """N values of the sweep (the reviewers' request, spec §9); [] runs no sweep."""
    sweep_seeds: NonNegativeInt = 3
    """Seeds per N of the sweep (0 .. sweep_seeds-1; an arm's runs with those seeds are reused)."""
    budget_rollouts: PositiveInt = 8192
    """Every run's budget in generated rollouts (set as `train.max_rollouts`): divisible by every
    N so each run ends exactly on it."""
    evaluations: PositiveInt = 4
    """Evaluations after step 0, at equal fractions of the budget (4: 1/4, 1/2, 3/4, all); each
    run's `train.eval_every` is the nearest whole number of its steps to budget / evaluations."""
    min_steps: PositiveInt = 8
    """Fewest steps each arm must take at the budget (the issue: BroRL >= 8 steps)."""
    out_dir: str = "outputs/study"
    """Folder of the study: `plan/`, `runs/<run>/` (each run's run_dir and checkpoints) and the
    report (report.md, report.json, PNGs)."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Level of every interval of the report."""
    alpha: float = Field(0.05, gt=0, lt=1)
    """Level of the paired tests (two-sided)."""
    power: float = Field(0.8, gt=0, lt=1)
    """Power at which the report states the minimum detectable difference."""
    resamples: PositiveInt = 10_000
    """Bootstrap resamples per interval."""
    bootstrap_seed: int = 0
    """Seed of every bootstrap of the report (the same study gives the same intervals)."""

    @property
    def other(self) -> str:
        """The arm that is not the baseline."""
        return next(name for name in self.arms if name != self.baseline)

    @property
    def exponent(self) -> float:
        """alpha of B(N) = B_base (N_base / N)^alpha, the log-linear rule through both arms:
        log(B_base / B_other) / log(N_other / N_base); 8 x 16 and 2 x 512 give
        log 4 / log 32 = 0.4."""
        a, b = self.arms[self.baseline], self.arms[self.other]
        return math.log(a.prompts_per_step / b.prompts_per_step) / \
            math.log(b.rollouts_per_prompt / a.rollouts_per_prompt)

    def prompts_per_step(self, rollouts_per_prompt: int) -> int:
        """B(N) = max(1, round(B_base (N_base / N)^alpha)), our rule, reproducing both arms:
        with 8 x 16 and 2 x 512, N = 16, 64, 256, 512, 1024 give B = 8, 5, 3, 2, 2."""
        a = self.arms[self.baseline]
        value = a.prompts_per_step * (a.rollouts_per_prompt / rollouts_per_prompt) ** self.exponent
        return max(1, round(value))

    @model_validator(mode="after")
    def _check_study(self) -> StudyParams:
        if len(self.arms) != 2 or self.baseline not in self.arms:
            raise ValueError(
                f"study.arms {sorted(self.arms)} with baseline {self.baseline!r}: a study needs "
                "exactly two arms, the baseline among them (the B rule runs through both); e.g. "
                "prorl (N=16, B=8) and brorl (N=512, B=2) with baseline: prorl.")
        a, b = self.arms[self.baseline], self.arms[self.other]
        if a.rollouts_per_prompt == b.rollouts_per_prompt:
            raise ValueError(f"study.arms: both arms have N = {a.rollouts_per_prompt}; the arms "
                             "must differ in N (e.g. 16 and 512).")
        if (a.prompts_per_step - b.prompts_per_step) * \
                (a.rollouts_per_prompt - b.rollouts_per_prompt) > 0:
            raise ValueError("study.arms: the arm with the larger N must have no more prompts per "
                             "step (BroRL trades prompts for rollouts, spec §4.1).")
        for name, variant in self.variants.items():
            if not VARIANT_NAME.fullmatch(name) or re.fullmatch(r"n\d+", name):
                raise ValueError(
                    f"study.variants: name {name!r} must be lower-case letters and digits, "
                    "starting with a letter and not n<digits> (the arms' run ids), e.g. adaptive16.")
            if variant.arm not in self.arms:
                raise ValueError(f"study.variants.{name}.arm = {variant.arm!r} is not an arm of "
                                 f"the study; use one of {sorted(self.arms)}.")
            if not variant.update or SHAPE_KEYS & set(variant.update):
                raise ValueError(
                    f"study.variants.{name}.update = {variant.update}: set at least one update "
                    "key, and not prompts_per_step or rollouts_per_prompt (the arm's shape).")
        for n in self.all_rollouts_per_prompt:
            if self.budget_rollouts % n:
                raise ValueError(
                    f"study.budget_rollouts = {self.budget_rollouts} is not divisible by N = {n}: "
                    "a run then stops short of the budget; pick a multiple of every N (e.g. of "
                    "1024 for N up to 1024).")
        for name, arm in self.arms.items():
            per_step = arm.prompts_per_step * arm.rollouts_per_prompt
            if self.budget_rollouts < self.min_steps * per_step:
                raise ValueError(
                    f"study.budget_rollouts = {self.budget_rollouts} gives arm {name} "
                    f"(B x N = {per_step}) fewer than study.min_steps = {self.min_steps} steps; "
                    f"raise the budget to at least {self.min_steps * per_step}.")
        return self

    @property
    def all_rollouts_per_prompt(self) -> list[int]:
        """Every N of the study, ascending."""
        return sorted({*(a.rollouts_per_prompt for a in self.arms.values()),
                       *self.sweep_rollouts_per_prompt})
