"""The study's numbers, from its runs (`brorl.study.results`) with `brorl.stats`: a JSON-ready dict.

The analysis plan is docs/study.md's, fixed before any run of the design:

- Per arm and point (`start`, `<arm>@steps`, `<arm>@budget`): `[seeds, instances]` tables of the
  family score (avg@k) and of pass@k; mean per family and overall with a two-way bootstrap
  interval (seeds and instances resampled, `bootstrap_mean`); the run's steps, optimizer steps,
  rollouts, LR, training seconds, pooled pass rate and throughput.
- Per pre-registered contrast b - a (`study.contrasts`), on the overall score and on pass@k:
  the headline two-way bootstrap interval (`bootstrap_difference` for two arms, the bootstrap
  of per-seed differences for one arm at two points, the start as a one-row table) and the
  seed-level test (`seed_test`: Welch's t over seed means for two arms, the paired t for one
  arm's seeds at two points, the one-sample t against the start), with its TOST p at
  `study.margin`. Holm adjusts the family of the contrasts' score p-values, and separately the
  family of their TOST p-values (`holm`).
- The reading of each contrast: `higher` / `lower` (Holm p < alpha), `equivalent` (Holm TOST p <
  alpha: the difference lies within +-margin), both (`higher` or `lower` within the margin), or
  `inconclusive`; `not_reached` when a run of one side has no evaluation at the side's point (a
  BroRL run whose budget ended before `equal_steps`): the contrast is not estimated and stays a
  member of both Holm families with p = 1, so the others are adjusted as planned.
- The plateau: the warm-up's slope test (`brorl.study.warmup`); the revival rule of each arm
  (`study.revival`): its start was shown flat and every listed contrast reads `higher` (a gain
  shown within the margin is no revival).
- The pool: the start's pass-rate histogram and predictions (`brorl.study.pool`), beside each
  arm's measured pass rate.

Deliberately ignored: per-task breakdowns (the run folders hold them), tests of pass@k in the
Holm family (pass@k is reported beside avg@k, its p unadjusted).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from brorl.stats import Interval, bootstrap_difference, bootstrap_mean, holm, seed_test
from brorl.study.plan import run_params
from brorl.study.results import METRICS, RunResult, instance_order, table, values_of
from brorl.types import FAMILIES

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.params.study import StudyParams

READINGS = ("higher", "lower", "equivalent", "higher_within_margin", "lower_within_margin",
            "inconclusive", "not_reached")


def _iv(x: Interval) -> dict[str, float]:
    return {"mean": x.mean, "low": x.low, "high": x.high}


def _boot(study: StudyParams) -> dict[str, Any]:
    return dict(confidence=study.confidence, resamples=study.resamples, seed=study.bootstrap_seed)


def over_seeds(values: list[float], study: StudyParams) -> dict[str, float]:
    """Mean of per-run values with a bootstrap interval over the runs (NaN ends below 2 runs or
    with a NaN value)."""
    if len(values) < 2 or not np.isfinite(values).all():
        return {"mean": float(np.mean(values)) if values else math.nan, "low": math.nan,
                "high": math.nan}
    return _iv(bootstrap_mean(np.asarray(values, dtype=float), **_boot(study)))


def describe(x: np.ndarray, families: list[str], study: StudyParams) -> dict[str, Any]:
    """Per family and overall: mean and two-way bootstrap interval of `[runs, instances]`."""
    out = {}
    for family in FAMILIES:
        cols = [j for j, f in enumerate(families) if f == family]
        if cols:
            out[family] = _iv(bootstrap_mean(x[:, cols], **_boot(study)))
    out["overall"] = _iv(bootstrap_mean(x, **_boot(study)))
    return out


def not_reached(study: StudyParams, runs: list[RunResult], point: str) -> str | None:
    """Why `runs` have no evaluation at `point` (`steps`: `equal_steps`), or None when they all
    have one."""
    if point != "steps":
        return None
    short = [f"{r.run.id} ended at step {r.final['step']}" for r in runs
             if r.row_at(study.equal_steps) is None]
    if not short:
        return None
    return (f"{'; '.join(short)} (its budget of {study.budget_rollouts} rollouts ran out before "
            f"step {study.equal_steps})")


def point_rows(study: StudyParams, runs: list[RunResult], point: str) -> list[dict[str, Any]]:
    """Each run's evaluation row at `point`: `start` (step 0), `steps` (`equal_steps`) or
    `budget` (at exactly `budget_rollouts`)."""
    if point == "start":
        return [r.evals[0] for r in runs]
    if point == "steps":
        return [r.at_step(study.equal_steps) for r in runs]
    return [r.at_budget(study.budget_rollouts) for r in runs]


def arm_summary(params: ExperimentParams, name: str, runs: list[RunResult], ids: list[str],
                families: list[str]) -> dict[str, Any]:
    """One arm: its shape and LR, per-run counts and seconds, scores at its points, rates."""
    study = params.study
    arm = study.arms[name]
    p = run_params(params, runs[0].run)
    planned = ["steps"] + (["budget"] if arm.stop == "rollouts" else [])
    missing = {point: why for point in planned if (why := not_reached(study, runs, point))}
    points = [point for point in planned if point not in missing]
    out: dict[str, Any] = {
        "N": p.update.rollouts_per_prompt, "B": p.update.prompts_per_step, "lr": p.update.lr,
        "stop": arm.stop, "about": arm.about, "runs": [r.run.id for r in runs],
        "steps": [r.final["step"] for r in runs],
        "optimizer_steps": [r.optimizer_steps for r in runs],
        "rollouts": [r.final["rollouts"] for r in runs],
        "steps_at_budget": [r.at_budget(study.budget_rollouts)["step"] for r in runs]
        if arm.stop == "rollouts" else [],
        "rollouts_at_steps": [] if "steps" in missing else
        [r.at_step(study.equal_steps)["rollouts"] for r in runs],
        "not_reached": missing,
        "train_seconds": [r.train_seconds for r in runs],
        "eval_seconds": [float(r.summary.get("eval_seconds", math.nan)) for r in runs],
        "pass_rate": over_seeds([r.pass_rate() for r in runs], study),
        "rollouts_per_s": over_seeds([r.throughput() for r in runs], study),
    }
    out["at"] = {point: {metric: describe(table([values_of(r, metric) for r in rows], ids),
                                          families, study) for metric in METRICS}
                 for point, rows in ((p, point_rows(study, runs, p)) for p in points)}
    return out


def side_table(study: StudyParams, side: str, arms: dict[str, list[RunResult]], ids: list[str],
               metric: str, start: dict[str, Any]) -> tuple[np.ndarray, list[int]]:
    """`[seeds, instances]` of one contrast side and its runs' seeds (the start: one row)."""
    if side == "start":
        return table([values_of(start, metric)], ids), []
    name, _, point = side.partition("@")
    runs = arms[name]
    return table([values_of(r, metric) for r in point_rows(study, runs, point)], ids), \
        [r.run.seed for r in runs]


def contrast(study: StudyParams, a: str, b: str, arms: dict[str, list[RunResult]],
             ids: list[str], start: dict[str, Any]) -> dict[str, Any]:
    """b - a on each metric: the two-way bootstrap interval and the seed-level test (module
    docstring). The start is side a only (a fixed policy: one-sample test)."""
    out: dict[str, Any] = {"a": a, "b": b, "instances": len(ids)}
    why = [w for side in (a, b) if side != "start" and (w := not_reached(
        study, arms[side.partition("@")[0]], side.partition("@")[2]))]
    if why:
        return {**out, "not_reached": "; ".join(why)}
    same_arm = a != "start" and a.partition("@")[0] == b.partition("@")[0]
    for metric in METRICS:
        xa, seeds_a = side_table(study, a, arms, ids, metric, start)
        xb, seeds_b = side_table(study, b, arms, ids, metric, start)
        if same_arm:
            if seeds_a != seeds_b:
                raise ValueError(f"contrast {a} -> {b}: the same arm's points have different "
                                 "runs; every run must reach both points.")
            interval = bootstrap_mean(xb - xa, **_boot(study))
        else:
            interval = bootstrap_difference(xa, xb, **_boot(study))
        kind = "paired" if same_arm else "one_sample" if a == "start" else "welch"
        test = seed_test(xa.mean(axis=1), xb.mean(axis=1), kind=kind, alpha=study.alpha,
                         margin=study.margin)
        out[metric] = {"difference": _iv(interval), "test": asdict(test),
                       "seeds_a": len(seeds_a), "seeds_b": len(seeds_b)}
    return out


def reading(p_holm: float, p_tost_holm: float, delta: float, alpha: float) -> str:
    """`READINGS` from the Holm-adjusted p of the difference and of the TOST."""
    differs = np.isfinite(p_holm) and p_holm < alpha
    equivalent = np.isfinite(p_tost_holm) and p_tost_holm < alpha
    if differs:
        direction = "higher" if delta > 0 else "lower"
        return f"{direction}_within_margin" if equivalent else direction
    return "equivalent" if equivalent else "inconclusive"


def contrasts(params: ExperimentParams, arms: dict[str, list[RunResult]], ids: list[str],
              start: dict[str, Any]) -> dict[str, Any]:
    """Every pre-registered contrast with its Holm-adjusted p-values and reading."""
    study = params.study
    out = {name: {"about": c.about, **contrast(study, c.a, c.b, arms, ids, start)}
           for name, c in study.contrasts.items()}
    tests = {n: c["score"]["test"] for n, c in out.items() if "not_reached" not in c}
    # a contrast not estimated stays in both families with p = 1 (module docstring)
    p = holm([tests[n]["p_two_sided"] if n in tests else 1.0 for n in out])
    p_tost = holm([tests[n]["p_equivalence"] if n in tests else 1.0 for n in out])
    for name, ph, pt in zip(list(out), p, p_tost):
        if name not in tests:
            out[name]["score"] = {"reading": "not_reached"}
            continue
        c = out[name]["score"]
        c.update(p_holm=ph, p_equivalence_holm=pt,
                 reading=reading(ph, pt, c["test"]["delta"], study.alpha))
    return out


def revival(params: ExperimentParams, found: dict[str, Any], plateau: dict[str, Any] | None
            ) -> dict[str, Any]:
    """Per arm of `study.revival`: whether it revives the plateau by the pre-registered rule
    (the warm-up was shown flat and every listed contrast reads `higher`: significant after Holm
    and not shown to lie within the margin), and why not."""
    flat = bool(plateau and plateau.get("plateaued"))
    out = {}
    for arm, names in params.study.revival.items():
        failing = [n for n in names if found[n]["score"]["reading"] != "higher"]
        out[arm] = {"revives": flat and not failing, "start_flat": flat, "contrasts": names,
                    "not_higher": failing}
    return out


def analyse(params: ExperimentParams, results: list[RunResult], start: dict[str, Any],
            plateau: dict[str, Any] | None = None,
            pool_record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every number of the report (module docstring). `start`: the shared step-0 row;
    `plateau`: the warm-up's record (`brorl.study.warmup.read_warmup`); `pool_record`: the pool
    stage's `pool.json`."""
    study = params.study
    for r in results:
        if r.evals[0]["step"] != 0:
            raise ValueError(f"run {r.run.id} has no step-0 evaluation (its first is at step "
                             f"{r.evals[0]['step']}); the start scores need it: rerun the run.")
    ids, families = instance_order(results)
    arms = {name: [r for r in results if r.run.arm == name] for name in study.arms}
    missing = [name for name, runs in arms.items() if not runs]
    if missing:
        raise ValueError(f"study arms {missing} have no finished run; run the study first.")
    found = contrasts(params, arms, ids, start)
    start_tables = {m: table([values_of(start, m)], ids) for m in METRICS}
    return {
        "name": params.name, "budget_rollouts": study.budget_rollouts,
        "equal_steps": study.equal_steps, "instances": len(ids),
        "max_response_tokens": params.generate.max_response_tokens,
        "evaluation": {"samples": params.train.eval_samples,
                       "temperature": params.train.eval_temperature,
                       "top_p": params.train.eval_top_p},
        "instances_per_family": {f: families.count(f) for f in FAMILIES if f in families},
        "alpha": study.alpha, "confidence": study.confidence, "margin": study.margin,
        "start": {m: describe(x, families, study) for m, x in start_tables.items()},
        "arms": {name: arm_summary(params, name, runs, ids, families)
                 for name, runs in arms.items()},
        "contrasts": found, "plateau": plateau, "revival": revival(params, found, plateau),
        "pool": pool_record,
    }
