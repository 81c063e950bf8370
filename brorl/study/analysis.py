"""The study's numbers, from its runs (`brorl.study.results`) with `brorl.evaluation.stats`: a JSON-ready dict.

The analysis plan is docs/study.md's (version 2), fixed before any run of the design:

- Endpoints: the primary is the family score (avg@k, k = 64 samples per instance: the unbiased
  estimate of avg@8's expectation) on the hold-out split, drawn from the pool's difficulty band
  (`brorl.study.pool`); pass@k for k = 1, 2, 4, ... 64 beside it; the full test split's score is
  the secondary no-harm check. Every figure is a mean over instances (pooled across families).
- Per arm and point (`<arm>@steps`, `<arm>@budget`) and the start: each seed's (each start
  replicate's) mean, and their mean with the t interval over seeds (`seed_interval`); per
  family the same; the pass@k curve; the run's steps, optimizer steps, rollouts, LR, keep rate.
- Per contrast b - a (`study.contrasts`) on each endpoint: the seed-level test (`seed_test`:
  Welch's t over seed means for two arms or an arm against the start's replicates, the paired t
  for one arm's seeds at two points) with its t interval at the study's confidence (the
  interval excludes 0 exactly when p < 1 - confidence: one inference, not two), and the
  effect the design detects with `study.power` at the planned seeds (`detectable`, from
  `study.design_sd`, never from the observed sds). Holm adjusts the confirmatory family
  (`study.confirmatory`) on the primary endpoint; the exploratory contrasts get their own Holm
  family beside, and no claim rests on them. A TOST at `study.margin` is read only for a
  contrast with `equivalence: true` (the plan shows it has power there), unadjusted (the premise
  is one test).
- The reading on the primary endpoint: `higher` / `lower` (Holm p < alpha), `equivalent` (TOST
  p < alpha, where read), `inconclusive`; `not_reached` when a run of one side has no
  evaluation at the side's point (the contrast stays in its Holm family with p = 1).
- The premise (`study.premise`): the baseline arm continued on the pool against the start,
  equivalent within the margin; the warm-up's slope test with its evaluations as the unit
  (`brorl.study.warmup`); the revival rule of each arm (`study.revival`): the premise shown and
  every listed confirmatory contrast reads `higher`.
- The pool: the start's pass-rate histogram and predictions (`brorl.study.pool`), beside each
  arm's measured keep rate.

Deliberately ignored: per-task breakdowns (the run folders hold them), pass@k in the Holm
family (reported beside avg@k, its p unadjusted), a crossed seed x instance model (the seed
means carry the instance noise of a fixed instance set equally in every arm).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats as sps

from brorl.evaluation.stats import holm, seed_test, tost_power
from brorl.families import ordered
from brorl.study import power
from brorl.study.plan import run_params
from brorl.study.results import RunResult, instance_order, table, values_of

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.params.study import StudyParams

READINGS = ("higher", "lower", "equivalent", "inconclusive", "not_reached")
ENDPOINTS = {"primary": "holdout", "secondary": "test"}
"""Endpoint -> the split it is scored on."""
METRICS = ("score", "pass_at_k")
"""Per-instance values each contrast tests: the family score (avg@k) and pass@k at k = the
row's samples."""


def seed_interval(values: list[float], confidence: float) -> dict[str, Any]:
    """Mean of per-seed values with its t interval (NaN ends below 2 values) and the values."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean()) if len(x) else math.nan
    if len(x) < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "values": x.tolist()}
    half = float(sps.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return {"mean": mean, "low": mean - half, "high": mean + half, "values": x.tolist()}


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
    """Each run's evaluation row at `point`: `steps` (`equal_steps`) or `budget` (at exactly
    `budget_rollouts`)."""
    if point == "steps":
        return [r.at_step(study.equal_steps) for r in runs]
    return [r.at_budget(study.budget_rollouts) for r in runs]


def describe(rows: list[dict[str, Any]], ids: list[str], families: list[str],
             confidence: float) -> dict[str, Any]:
    """Seed (or replicate) means of `rows` on `ids`: per family and overall for the score,
    overall pass@k at k = 1, 2, 4, ... the rows' samples."""
    x = table([values_of(r, "score") for r in rows], ids)
    out: dict[str, Any] = {"score": {}, "pass_at": {}}
    for family in ordered({f for f in families if f is not None}):
        cols = [j for j, f in enumerate(families) if f == family]
        if cols:
            out["score"][family] = seed_interval(x[:, cols].mean(axis=1).tolist(), confidence)
    out["score"]["overall"] = seed_interval(x.mean(axis=1).tolist(), confidence)
    n = min(r.get("samples") or 0 for r in rows)
    for k in (2 ** i for i in range(n.bit_length()) if 2 ** i <= n):
        pk = table([values_of(r, "pass_at_k", k) for r in rows], ids)
        out["pass_at"][str(k)] = seed_interval(pk.mean(axis=1).tolist(), confidence)
    return out


def arm_summary(params: ExperimentParams, name: str, runs: dict[str, list[RunResult]],
                ids: dict[str, list[str]], families: dict[str, list[str]]) -> dict[str, Any]:
    """One arm: its shape and LR, per-run counts, scores at its points on each endpoint,
    keep rates. `runs`, `ids`, `families`: per endpoint."""
    study = params.study
    arm = study.arms[name]
    test_runs = runs["secondary"]
    p = run_params(params, test_runs[0].run)
    planned = ["steps"] + (["budget"] if arm.stop == "rollouts" else [])
    missing = {point: why for point in planned if (why := not_reached(study, test_runs, point))}
    points = [point for point in planned if point not in missing]
    out: dict[str, Any] = {
        "N": p.update.rollouts_per_prompt, "B": p.update.prompts_per_step, "lr": p.update.lr,
        "stop": arm.stop, "about": arm.about, "runs": [r.run.id for r in test_runs],
        "seeds": [r.run.seed for r in test_runs],
        "steps": [r.final["step"] for r in test_runs],
        "optimizer_steps": [r.optimizer_steps for r in test_runs],
        "rollouts": [r.final["rollouts"] for r in test_runs],
        "steps_at_budget": [r.at_budget(study.budget_rollouts)["step"] for r in test_runs]
        if arm.stop == "rollouts" else [],
        "rollouts_at_steps": [] if "steps" in missing else
        [r.at_step(study.equal_steps)["rollouts"] for r in test_runs],
        "not_reached": missing,
        "train_seconds": [r.train_seconds for r in test_runs],
        "eval_seconds": [float(r.summary.get("eval_seconds", math.nan)) for r in test_runs],
        "pass_rate": seed_interval([r.pass_rate() for r in test_runs], study.confidence),
        "rollouts_per_s": seed_interval([r.throughput() for r in test_runs], study.confidence),
    }
    out["at"] = {endpoint: {point: describe(point_rows(study, runs[endpoint], point),
                                            ids[endpoint], families[endpoint], study.confidence)
                            for point in points}
                 for endpoint in ENDPOINTS}
    return out


def side_values(study: StudyParams, side: str, arms: dict[str, list[RunResult]], ids: list[str],
                metric: str, start: list[dict[str, Any]]) -> tuple[np.ndarray, list[int]]:
    """Per-seed means of one contrast side (the start: per replicate) and its runs' seeds."""
    if side == "start":
        return table([values_of(row, metric) for row in start], ids).mean(axis=1), []
    name, _, point = side.partition("@")
    rows = point_rows(study, arms[name], point)
    return table([values_of(r, metric) for r in rows], ids).mean(axis=1), \
        [r.run.seed for r in arms[name]]


def _design(study: StudyParams, side: str) -> tuple[float, int]:
    """(design sd, planned seeds or replicates) of a side."""
    name = side.partition("@")[0]
    count = study.start_replicates if side == "start" else study.arms[name].seeds
    return study.design_sd.get(name, math.nan), count


def detectable(study: StudyParams, a: str, b: str, level: float) -> float:
    """The smallest |b - a| (score units, to 0.001) that Welch's t at `level` detects with
    `study.power` at the planned seeds and the design sds; NaN without design sds (or for one
    arm at two points, whose paired sd the plan does not fix)."""
    (sd_a, n_a), (sd_b, n_b) = _design(study, a), _design(study, b)
    same_arm = a != "start" and a.partition("@")[0] == b.partition("@")[0]
    if same_arm or not (np.isfinite(sd_a) and np.isfinite(sd_b)) or min(n_a, n_b) < 2:
        return math.nan
    return power.detectable(sd_a, sd_b, n_a, n_b, alpha=level, power=study.power)


def equivalence_power(study: StudyParams, a: str, b: str) -> float:
    """Power of the TOST at a true difference of 0 (planned seeds, design sds); NaN where the
    plan fixes no sds."""
    (sd_a, n_a), (sd_b, n_b) = _design(study, a), _design(study, b)
    if not (np.isfinite(sd_a) and np.isfinite(sd_b)) or min(n_a, n_b) < 2:
        return math.nan
    return tost_power(0.0, sd_a, sd_b, n_a, n_b, margin=study.margin, alpha=study.alpha)


def contrast(study: StudyParams, a: str, b: str, arms: dict[str, list[RunResult]],
             ids: list[str], start: list[dict[str, Any]]) -> dict[str, Any]:
    """b - a on each metric of one endpoint: the seed-level test with its t interval (module
    docstring)."""
    out: dict[str, Any] = {"instances": len(ids)}
    why = [w for side in (a, b) if side != "start" and (w := not_reached(
        study, arms[side.partition("@")[0]], side.partition("@")[2]))]
    if why:
        return {**out, "not_reached": "; ".join(why)}
    same_arm = a != "start" and a.partition("@")[0] == b.partition("@")[0]
    for metric in METRICS:
        xa, seeds_a = side_values(study, a, arms, ids, metric, start)
        xb, seeds_b = side_values(study, b, arms, ids, metric, start)
        if same_arm and seeds_a != seeds_b:
            raise ValueError(f"contrast {a} -> {b}: the same arm's points have different runs; "
                             "every run must reach both points.")
        test = seed_test(xa, xb, kind="paired" if same_arm else "welch",
                         alpha=1 - study.confidence, margin=study.margin)
        out[metric] = {"test": asdict(test), "a": xa.tolist(), "b": xb.tolist()}
    return out


def reading(p_holm: float, p_tost: float | None, delta: float, alpha: float) -> str:
    """`READINGS` from the Holm-adjusted p of the difference and the TOST p (None: not read)."""
    if np.isfinite(p_holm) and p_holm < alpha:
        return "higher" if delta > 0 else "lower"
    if p_tost is not None and np.isfinite(p_tost) and p_tost < alpha:
        return "equivalent"
    return "inconclusive"


def contrasts(params: ExperimentParams, arms: dict[str, dict[str, list[RunResult]]],
              ids: dict[str, list[str]], start: dict[str, list[dict[str, Any]]]
              ) -> dict[str, Any]:
    """Every pre-registered contrast on each endpoint, with its family, Holm-adjusted p (on the
    primary endpoint), detectable effect and reading."""
    study = params.study
    out: dict[str, Any] = {}
    for name, c in study.contrasts.items():
        family = "confirmatory" if name in study.confirmatory else \
            "premise" if name == study.premise else "exploratory"
        out[name] = {"about": c.about, "a": c.a, "b": c.b, "family": family,
                     "equivalence": c.equivalence,
                     **{endpoint: contrast(study, c.a, c.b, arms[endpoint], ids[endpoint],
                                           start[endpoint]) for endpoint in ENDPOINTS}}
    for family in ("confirmatory", "exploratory", "premise"):
        names = [n for n in out if out[n]["family"] == family]
        tests = {n: out[n]["primary"]["score"]["test"] for n in names
                 if "not_reached" not in out[n]["primary"]}
        adjusted = holm([tests[n]["p_two_sided"] if n in tests else 1.0 for n in names])
        level = study.alpha / max(1, len(names)) if family == "confirmatory" else study.alpha
        for name, p in zip(names, adjusted):
            c = out[name]
            c["detectable"] = detectable(study, c["a"], c["b"], level)
            c["detectable_level"] = level
            if c["equivalence"]:
                c["equivalence_power"] = equivalence_power(study, c["a"], c["b"])
            if name not in tests:
                c["p_holm"], c["reading"] = 1.0, "not_reached"
                continue
            t = tests[name]
            c["p_holm"] = p
            c["reading"] = reading(p, t["p_equivalence"] if c["equivalence"] else None,
                                   t["delta"], study.alpha)
    return out


def revival(params: ExperimentParams, found: dict[str, Any]) -> dict[str, Any]:
    """Per arm of `study.revival`: whether it revives the plateau by the pre-registered rule
    (the premise shown equivalent, every listed confirmatory contrast `higher`), and why not."""
    study = params.study
    flat = bool(study.premise and found[study.premise]["reading"] == "equivalent")
    out = {}
    for arm, names in study.revival.items():
        failing = [n for n in names if found[n]["reading"] != "higher"]
        out[arm] = {"revives": flat and not failing, "premise_shown": flat, "contrasts": names,
                    "not_higher": failing}
    return out


def analyse(params: ExperimentParams, results: list[RunResult],
            start: dict[str, list[dict[str, Any]]], plateau: dict[str, Any] | None = None,
            pool_record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every number of the report (module docstring). `start`: split -> the start's rows, one
    per replicate (`brorl.study.start`); `plateau`: the warm-up's record with its slope test
    (`brorl.study.warmup`); `pool_record`: the pool stage's `pool.json`."""
    study = params.study
    views = {endpoint: [r.on(split) for r in results] for endpoint, split in ENDPOINTS.items()}
    for r in results:
        if r.evals[0]["step"] != 0:
            raise ValueError(f"run {r.run.id} has no step-0 evaluation (its first is at step "
                             f"{r.evals[0]['step']}); the start scores need it: rerun the run.")
    order = {endpoint: instance_order(v) for endpoint, v in views.items()}
    ids = {e: o[0] for e, o in order.items()}
    families = {e: o[1] for e, o in order.items()}
    arms = {endpoint: {name: [r for r in v if r.run.arm == name] for name in study.arms}
            for endpoint, v in views.items()}
    missing = [name for name, runs in arms["primary"].items() if not runs]
    if missing:
        raise ValueError(f"study arms {missing} have no finished run; run the study first.")
    starts = {endpoint: start[split] for endpoint, split in ENDPOINTS.items()}
    found = contrasts(params, arms, ids, starts)
    return {
        "name": params.name, "budget_rollouts": study.budget_rollouts,
        "equal_steps": study.equal_steps,
        "instances": {e: len(i) for e, i in ids.items()},
        "instances_per_family": {e: {f: fs.count(f) for f in ordered({f for f in fs if f})}
                                 for e, fs in families.items()},
        "max_response_tokens": params.generate.max_response_tokens,
        "evaluation": {"samples": dict(study.eval_split_samples),
                       "temperature": params.train.eval_temperature,
                       "top_p": params.train.eval_top_p},
        "alpha": study.alpha, "confidence": study.confidence, "margin": study.margin,
        "power": study.power, "start_replicates": len(start["holdout"]),
        "start": {e: describe(starts[e], ids[e], families[e], study.confidence)
                  for e in ENDPOINTS},
        "arms": {name: arm_summary(params, name, {e: arms[e][name] for e in ENDPOINTS}, ids,
                                   families) for name in study.arms},
        "contrasts": found, "plateau": plateau, "revival": revival(params, found),
        "pool": pool_record,
    }
