"""The study's numbers, from its runs (`brorl.study.results`) with `brorl.stats`: a JSON-ready dict.

- Per arm, family and overall: mean with a two-way bootstrap interval over seeds and instances
  (`bootstrap_mean` on `[seeds, instances]`) at the budget, at step 0, at equal training time.
  A family's score is the mean of its instances' scores; overall is the mean over all instances
  (each family has `train.eval_per_family` of them, so it equals the mean of the families when
  the test split has that many of each).
- The comparison other - baseline: the paired test over instances of the per-instance scores
  averaged over seeds (`paired_test`: t, its interval, d_z, Wilcoxon p, the minimum detectable
  difference at the study's power) and, per family, `bootstrap_difference` (seeds and instances),
  at equal rollouts (the runs' final evaluations, all at the budget) and at equal training time
  T* = the smallest final training time among both arms' runs (every run reached it), each run's
  per-instance scores linearly interpolated at T* between its two evaluations around it.
- The N-sweep: per N (the sweep's seeds), the score at the budget with its interval, the pooled
  pass rate and throughput (interval over seeds), and the peak N: argmax of the mean score,
  with how often each N is the argmax when seeds (per N) and instances (shared) are resampled.
- Variants (`study.variants`: an arm's shape with other update settings, e.g. the adaptive
  allocation or a training subset): each described as an arm (at the budget; no equal-time
  figures) and compared with both arms at equal rollouts, variant - arm, by the same paired test
  and bootstrap (every seed of each side).
- The plateau: the warm-up's validation curve up to the start, and the baseline arm's final
  evaluation against its step-0 evaluation (paired test): the paper's premise is a plateau.

Deliberately ignored: per-task breakdowns (docs/study.md says where the run folders hold them).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from brorl.stats import Interval, bootstrap_difference, bootstrap_mean, paired_test
from brorl.study.plan import run_params
from brorl.evals import read_evals
from brorl.study.results import FAMILIES, RunResult, instance_order, table, values_of

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.params.study import StudyParams


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


def describe(values: list[dict[str, float]], ids: list[str], families: list[str],
             study: StudyParams) -> dict[str, dict[str, float]]:
    """Per family and overall: mean and two-way bootstrap interval of `[runs, instances]`."""
    x = table(values, ids)
    out = {}
    for family in FAMILIES:
        cols = [j for j, f in enumerate(families) if f == family]
        if cols:
            out[family] = _iv(bootstrap_mean(x[:, cols], **_boot(study)))
    out["overall"] = _iv(bootstrap_mean(x, **_boot(study)))
    return out


def compare(base: list[dict[str, float]], other: list[dict[str, float]], ids: list[str],
            families: list[str], study: StudyParams) -> dict[str, Any]:
    """other - baseline: the paired test over seed-averaged instances, bootstrap differences."""
    a, b = table(base, ids), table(other, ids)
    test = paired_test(a.mean(axis=0), b.mean(axis=0), alpha=study.alpha, power=study.power)
    difference = {}
    for family in FAMILIES:
        cols = [j for j, f in enumerate(families) if f == family]
        if cols:
            difference[family] = _iv(bootstrap_difference(a[:, cols], b[:, cols], **_boot(study)))
    difference["overall"] = _iv(bootstrap_difference(a, b, **_boot(study)))
    return {"paired_test": asdict(test), "difference": difference}


def _score_mean(row: dict[str, Any]) -> float:
    fams = row["scores"]["family"].values()
    return float(np.mean([f.get("score", f["pass_at_1"]) for f in fams]))


def warmup_curve(folder: Path) -> dict[str, Any] | None:
    """The warm-up's validation curve (step, rollouts, mean family score) up to its last step,
    which is where every study run starts; None when the folder has no evaluations."""
    path = folder / "evals.jsonl"
    if not path.is_file():
        return None
    rows = read_evals(path, "validation")
    summary = folder / "summary.json"
    start = json.loads(summary.read_text())["steps"] if summary.is_file() else \
        (rows[-1]["step"] if rows else 0)
    return {"start_step": start, "points": [
        {"step": r["step"], "rollouts": r["rollouts"], "score_mean": _score_mean(r)}
        for r in rows if r["step"] <= start]}


SHRINKAGE = ("q_pos_change", "pct_improved_since_start", "worst_drop_since_start",
             "solved_delta", "unsolved_delta")
"""Per-run summaries of the live shrinkage diagnostics (`brorl.train.diagnostics`): the held-out
Q_pos change from the run's start to its end, the paper's cumulative % improved and worst drop
at the end, and the mean per-update change of the step's solved and unsolved prompts."""


def shrinkage_of(history: list[dict[str, float]]) -> dict[str, float] | None:
    """`SHRINKAGE` of one run's per-step history; None when no step logged the diagnostics (a
    run recorded before they existed, or with `diagnostics.enabled: false`)."""
    steps = [m for m in history if "diag/heldout/q_pos" in m]
    if not steps:
        return None
    first, last = steps[0], steps[-1]

    def mean_of(key: str) -> float:
        values = [m[key] for m in history if key in m]
        return float(np.mean(values)) if values else math.nan

    return {"q_pos_change": last["diag/heldout/q_pos"] - first["diag/heldout/q_pos"]
            + first["diag/heldout/q_pos_delta"],
            "pct_improved_since_start": last.get("diag/heldout/pct_improved_since_start",
                                                 math.nan),
            "worst_drop_since_start": last.get("diag/heldout/worst_drop_since_start", math.nan),
            "solved_delta": mean_of("diag/solved/q_pos_delta"),
            "unsolved_delta": mean_of("diag/unsolved/q_pos_delta")}


def shrinkage(runs: list[RunResult], study: StudyParams) -> dict[str, Any] | None:
    """Each `SHRINKAGE` quantity over the arm's runs (mean, interval over seeds); None unless
    every run logged the diagnostics."""
    per_run = [shrinkage_of(r.summary.get("history", [])) for r in runs]
    if any(v is None for v in per_run):
        return None
    return {key: over_seeds([v[key] for v in per_run], study) for key in SHRINKAGE}


def arm(params: ExperimentParams, runs: list[RunResult], ids: list[str], families: list[str],
        t_star: float | None) -> dict[str, Any]:
    """One arm: shape, runs, scores at the start, at the budget and at T* (unless None), pass
    rate, speed."""
    study, first = params.study, runs[0].run
    reasoning = [j for j, f in enumerate(families) if f == "reasoning"]
    finals = [values_of(r.final) for r in runs]
    out = {
        "N": first.rollouts_per_prompt, "B": first.prompts_per_step,
        "lr": run_params(params, first).update.lr, "runs": [r.run.id for r in runs],
        "steps": [r.final["step"] for r in runs],
        "train_seconds": [r.train_seconds for r in runs],
        "eval_seconds": [float(r.summary.get("eval_seconds", math.nan)) for r in runs],
        "checkpoint_seconds": [float(r.summary.get("checkpoint_seconds", math.nan)) for r in runs],
        "start": describe([values_of(r.evals[0]) for r in runs], ids, families, study),
        "score": describe(finals, ids, families, study),
        "pass_rate": over_seeds([r.pass_rate for r in runs], study),
        "rollouts_per_s": over_seeds([r.rollouts_per_s for r in runs], study),
        "shrinkage": shrinkage(runs, study),
    }
    if t_star is not None:
        out["at_equal_time"] = describe([r.at("seconds", t_star) for r in runs], ids, families,
                                        study)
        out["rollouts_at_equal_time"] = [
            float(np.interp(t_star, [e["seconds"] for e in r.evals],
                            [e["rollouts"] for e in r.evals])) for r in runs]
    if reasoning:
        x = table([values_of(r.final, "pass_at_1") for r in runs], ids)[:, reasoning]
        out["reasoning_pass_at_1"] = _iv(bootstrap_mean(x, **_boot(study)))
    return out


def peak(tables: dict[int, np.ndarray], study: StudyParams) -> dict[str, Any]:
    """The N of the highest mean score (`tied`: every N sharing that mean) and each N's share of
    the resamples in which it is highest, seeds (per N) and the shared instances resampled
    `study.resamples` times (a tie splits the resample between the tied N); the interval is the
    central `confidence` range of that distribution over N, in N order. Our choice of peak
    uncertainty."""
    ns = sorted(tables)
    means = np.array([tables[n].mean() for n in ns])
    tied = [n for n, m in zip(ns, means) if np.isclose(m, means.max(), rtol=0, atol=1e-12)]
    rng = np.random.default_rng(study.bootstrap_seed)
    size = tables[ns[0]].shape[1]
    shares = np.zeros(len(ns))
    for _ in range(study.resamples):
        inst = rng.integers(0, size, size)
        m = np.array([tables[n][rng.integers(0, len(tables[n]), len(tables[n]))][:, inst].mean()
                      for n in ns])
        top = np.isclose(m, m.max(), rtol=0, atol=1e-12)
        shares += top / top.sum()
    shares /= study.resamples
    tail, cumulative = (1 - study.confidence) / 2, np.cumsum(shares)
    low = int(np.searchsorted(cumulative, tail - 1e-12, side="right"))
    high = int(np.searchsorted(cumulative, 1 - tail - 1e-12, side="left"))
    return {"N": tied[0], "tied": tied, "share": float(shares[ns.index(tied[0])]),
            "interval": [ns[low], ns[min(high, len(ns) - 1)]],
            "shares": {str(n): float(x) for n, x in zip(ns, shares)}}


def sweep(results: list[RunResult], study: StudyParams, ids: list[str]) -> dict[str, Any] | None:
    """Per N of the sweep: score at the budget, pooled pass rate and throughput; the peak N."""
    rows, tables = [], {}
    for n in sorted(study.sweep_rollouts_per_prompt):
        runs = [r for r in results if r.run.rollouts_per_prompt == n and r.run.in_sweep
                and r.run.seed < study.sweep_seeds]
        if not runs:
            continue
        tables[n] = table([values_of(r.final) for r in runs], ids)
        rows.append({"N": n, "B": runs[0].run.prompts_per_step, "runs": [r.run.id for r in runs],
                     "score": _iv(bootstrap_mean(tables[n], **_boot(study))),
                     "pass_rate": over_seeds([r.pass_rate for r in runs], study),
                     "rollouts_per_s": over_seeds([r.rollouts_per_s for r in runs], study),
                     "train_seconds": float(np.mean([r.train_seconds for r in runs]))})
    if len(tables) < 2:
        return None
    return {"points": rows, "peak": peak(tables, study)}


def variants(params: ExperimentParams, results: list[RunResult], arms: dict[str, list[RunResult]],
             ids: list[str], families: list[str]) -> dict[str, Any]:
    """Each variant as an arm at the budget, with `versus` each arm: variant - arm at equal
    rollouts (`compare`)."""
    study, out = params.study, {}
    for name, v in study.variants.items():
        runs = [r for r in results if r.run.variant == name]
        if not runs:
            raise ValueError(f"study variant {name} has no finished run; run the study first.")
        finals = [values_of(r.final) for r in runs]
        out[name] = {**arm(params, runs, ids, families, None), "arm": v.arm, "update": v.update,
                     "versus": {a: compare([values_of(r.final) for r in arm_runs], finals, ids,
                                           families, study) for a, arm_runs in arms.items()}}
    return out


def analyse(params: ExperimentParams, results: list[RunResult],
            warmup: Path | None = None) -> dict[str, Any]:
    """Every number of the report (module docstring). `warmup`: the warm-up's run folder."""
    study = params.study
    for r in results:
        if r.final["rollouts"] != study.budget_rollouts:
            raise ValueError(
                f"run {r.run.id} ended at {r.final['rollouts']} rollouts, not the study's budget "
                f"{study.budget_rollouts}: the comparison is at equal rollouts only; rerun it.")
        if r.evals[0]["step"] != 0:
            raise ValueError(f"run {r.run.id} has no step-0 evaluation (its first is at step "
                             f"{r.evals[0]['step']}); the start scores need it: rerun the run.")
    ids, families = instance_order(results)
    arms = {name: [r for r in results if r.run.arm == name] for name in study.arms}
    missing = [name for name, runs in arms.items() if not runs]
    if missing:
        raise ValueError(f"study arms {missing} have no finished run; run the study first.")
    t_star = min(r.final["seconds"] for runs in arms.values() for r in runs)
    base, other = arms[study.baseline], arms[study.other]
    at_t = {r.run.id: r.at("seconds", t_star) for r in base + other}
    counts = {f: families.count(f) for f in FAMILIES if f in families}
    return {
        "name": params.name, "budget_rollouts": study.budget_rollouts, "instances": len(ids),
        "instances_per_family": counts, "baseline": study.baseline, "other": study.other,
        "alpha": study.alpha, "power": study.power, "confidence": study.confidence,
        "arms": {name: arm(params, runs, ids, families, t_star) for name, runs in arms.items()},
        "equal_rollouts": {"rollouts": study.budget_rollouts, **compare(
            [values_of(r.final) for r in base], [values_of(r.final) for r in other], ids,
            families, study)},
        "equal_time": {"seconds": t_star, **compare(
            [at_t[r.run.id] for r in base], [at_t[r.run.id] for r in other], ids, families,
            study)},
        "sweep": sweep(results, study, ids),
        "variants": variants(params, results, arms, ids, families),
        "plateau": {
            "warmup_validation": warmup_curve(warmup) if warmup is not None else None,
            "baseline_vs_start": compare([values_of(r.evals[0]) for r in base],
                                         [values_of(r.final) for r in base], ids, families,
                                         study)},
    }
