"""The study's report: `report.md` (Table 1 and Table 2 layouts with intervals, the tests, the
N-sweep, the live shrinkage diagnostics, the plateau check, a verdict), `report.json` (every
number, `brorl.study.analysis`), PNG figures (`brorl.study.figures`) and the headline numbers
for `dvc metrics show`.

The verdict is written from the numbers at report time: significance at the study's alpha, the
direction and size of each difference against the minimum detectable difference, where the
sweep peaks and how sure that is, whether the baseline still improved from the start. Scores
are shown in points (percent): pass@1 for math and code, mean reward for reasoning (spec §7.1)
with its pass@1 beside it. Tables follow spec §5.1 (Table 1) and §5.5 (Table 2).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brorl.study import figures
from brorl.study.analysis import analyse
from brorl.study.plan import plan_runs, run_dir
from brorl.study.results import FAMILIES, RunResult
from brorl.files import atomic_write_text

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

FIGURES = {"rollouts": "score_vs_rollouts.png", "seconds": "score_vs_seconds.png",
           "sweep": "sweep.png", "warmup": "warmup.png", "shrinkage": "shrinkage.png"}


def load_results(params: ExperimentParams, root: Path) -> list[RunResult]:
    """Every run of the study's plan, read from its folder."""
    return [RunResult.load(run, root / run_dir(params.study, run))
            for run in plan_runs(params.study)]


def _pts(iv: dict[str, float]) -> str:
    """`61.69 [60.10, 63.20]` in points, or `61.69` when the interval is undefined."""
    if math.isnan(iv["low"]):
        return f"{100 * iv['mean']:.2f}"
    return f"{100 * iv['mean']:.2f} [{100 * iv['low']:.2f}, {100 * iv['high']:.2f}]"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def table1(r: dict[str, Any]) -> str:
    """Spec §5.1 layout: the start, each arm at the budget and at equal training time."""
    head = ("| Method | N | Prompts/step | RL steps | Samples (k) | Time (s) | Math | Code "
            "| Reasoning (mean reward) | Reasoning pass@1 | Overall |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = r["arms"][r["baseline"]]
    cells = " | ".join(_pts(base["start"][f]) for f in FAMILIES if f in base["start"])
    lines.append(f"| start (warm-up policy) | - | - | +0 | 0 | 0 | {cells} | - "
                 f"| {_pts(base['start']['overall'])} |")
    t_star = r["equal_time"]["seconds"]
    for name, a in r["arms"].items():
        for label, scores, samples, time in (
                ("budget", a["score"], r["budget_rollouts"], _mean(a["train_seconds"])),
                ("equal time", a["at_equal_time"], _mean(a["rollouts_at_equal_time"]), t_star)):
            steps = f"+{_mean(a['steps']):.1f}" if label == "budget" else "-"
            reasoning = _pts(a["reasoning_pass_at_1"]) if label == "budget" and \
                "reasoning_pass_at_1" in a else "-"
            cells = " | ".join(_pts(scores[f]) for f in FAMILIES if f in scores)
            lines.append(f"| {name} ({label}) | {a['N']} | {a['B']} | {steps} "
                         f"| {samples / 1000:.2f} | {time:.0f} | {cells} | {reasoning} "
                         f"| {_pts(scores['overall'])} |")
    return "\n".join(lines)


def table2(r: dict[str, Any]) -> str:
    """Spec §5.5 layout with pooled fractions, intervals over seeds, time apart."""
    lines = ["| Method (N) | Dynamic sampling pass rate | Generation rollouts/s | training s "
             "| evaluation s | checkpoint s |", "|---|---:|---:|---:|---:|---:|"]
    for name, a in r["arms"].items():
        rate, speed = a["pass_rate"], a["rollouts_per_s"]
        speed_text = f"{speed['mean']:.1f}" + ("" if math.isnan(speed["low"]) else
                                                f" [{speed['low']:.1f}, {speed['high']:.1f}]")
        lines.append(f"| {name} ({a['N']}) | {_pts(rate)}% | {speed_text} "
                     f"| {_mean(a['train_seconds']):.0f} | {_mean(a['eval_seconds']):.0f} "
                     f"| {_mean(a['checkpoint_seconds']):.1f} |")
    return "\n".join(lines)


def shrinkage_table(r: dict[str, Any]) -> str | None:
    """The live shrinkage diagnostics per arm (mean [interval over seeds]); None when some arm's
    runs did not log them."""
    rows = {**r["arms"], **r.get("variants", {})}
    if any(a.get("shrinkage") is None for a in rows.values()):
        return None

    def cell(iv: dict[str, float], scale: float = 1.0, digits: int = 4) -> str:
        if math.isnan(iv["mean"]):
            return "- (none)"  # e.g. no unsolved drawn prompt: every group had a solve
        text = f"{scale * iv['mean']:+.{digits}f}"
        return text if math.isnan(iv["low"]) else \
            f"{text} [{scale * iv['low']:+.{digits}f}, {scale * iv['high']:+.{digits}f}]"

    lines = ["| Method (N) | held-out Q_pos change | % improved since start | worst drop since "
             "start | per update: solved | per update: unsolved |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, a in rows.items():
        s = a["shrinkage"]
        lines.append(f"| {name} ({a['N']}) | {cell(s['q_pos_change'])} "
                     f"| {cell(s['pct_improved_since_start'], digits=1)} "
                     f"| {cell(s['worst_drop_since_start'])} | {cell(s['solved_delta'], digits=5)} "
                     f"| {cell(s['unsolved_delta'], digits=5)} |")
    return "\n".join(lines)


def variants_table(r: dict[str, Any]) -> str:
    """Each variant at the budget beside both arms: its shape and setting, score, pass rate,
    training time and the difference to each arm (points, bootstrap interval, paired p)."""
    arms = list(r["arms"])
    lines = ["| Variant | of arm (N, B) | update | runs | score at the budget | pass rate "
             "| training s | " + " | ".join(f"- {a} (points, p)" for a in arms) + " |",
             "|---|---|---|---:|---:|---:|---:|" + "---:|" * len(arms)]
    for name, v in r["variants"].items():
        setting = ", ".join(f"{k}: {val}" for k, val in v["update"].items())
        diffs = " | ".join(f"{_pts(v['versus'][a]['difference']['overall'])}, p = "
                           f"{v['versus'][a]['paired_test']['p_two_sided']:.3g}" for a in arms)
        lines.append(f"| {name} | {v['arm']} ({v['N']}, {v['B']}) | {setting} "
                     f"| {len(v['runs'])} | {_pts(v['score']['overall'])} "
                     f"| {_pts(v['pass_rate'])}% | {_mean(v['train_seconds']):.0f} | {diffs} |")
    return "\n".join(lines)


def sweep_table(s: dict[str, Any]) -> str:
    lines = ["| N | B | runs | score at the budget | pass rate | rollouts/s | training s |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for p in s["points"]:
        lines.append(f"| {p['N']} | {p['B']} | {len(p['runs'])} | {_pts(p['score'])} "
                     f"| {_pts(p['pass_rate'])}% | {p['rollouts_per_s']['mean']:.1f} "
                     f"| {p['train_seconds']:.0f} |")
    return "\n".join(lines)


def _test_sentence(t: dict[str, Any], diff: dict[str, float], alpha: float, power: float,
                   what: str) -> str:
    if math.isnan(t["p_two_sided"]):
        return (f"{what}: every instance differs by the same amount ({100 * t['delta']:+.2f} "
                "points), so the paired test is undefined.")
    sig = t["p_two_sided"] < alpha
    direction = "apart" if round(100 * abs(t["delta"]), 2) == 0 else \
        "higher" if t["delta"] > 0 else "lower"
    text = (f"{what}: {100 * abs(t['delta']):.2f} points {direction} (paired t over {t['n']} "
            f"instances: p = {t['p_two_sided']:.3g} two-sided, {100 * (1 - alpha):.0f}% CI "
            f"[{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}], d_z = "
            f"{t['effect_size_dz']:+.2f}; bootstrap over seeds and instances "
            f"[{100 * diff['low']:+.2f}, {100 * diff['high']:+.2f}]). ")
    if sig:
        size = "at or above" if abs(t["delta"]) >= t["mde"] else "below"
        return text + (f"Significant at alpha = {alpha}; its size is {size} the smallest "
                       f"difference this study detects with power {power} "
                       f"({100 * t['mde']:.2f} points).")
    return text + (f"Not significant at alpha = {alpha}: the data do not show a difference. "
                   f"The study detects {100 * t['mde']:.2f} points or more with power {power}; "
                   "a smaller true difference is not ruled out.")


def verdict(r: dict[str, Any]) -> list[str]:
    """Plain sentences generated from the numbers (module docstring)."""
    a, b = r["arms"][r["baseline"]], r["arms"][r["other"]]
    pair = f"{r['other']} (N={b['N']}) - {r['baseline']} (N={a['N']})"
    lines = [
        _test_sentence(r["equal_rollouts"]["paired_test"], r["equal_rollouts"]["difference"]
                       ["overall"], r["alpha"], r["power"],
                       f"At equal rollouts ({r['budget_rollouts']}), {pair}"),
        _test_sentence(r["equal_time"]["paired_test"], r["equal_time"]["difference"]["overall"],
                       r["alpha"], r["power"],
                       f"At equal training time ({r['equal_time']['seconds']:.0f} s), {pair}")]
    s = r["sweep"]
    if s is not None:
        pk, first, last = s["peak"], s["points"][0], s["points"][-1]
        where = f"peaks at N = {pk['N']}" if len(pk["tied"]) == 1 else \
            f"ties at N = {', '.join(str(n) for n in pk['tied'])}"
        spread = "single out this N" if len(pk["tied"]) == 1 and \
            pk["interval"][0] == pk["interval"][1] else "do not single out one N"
        lines.append(
            f"The N-sweep's score at the budget {where} (the highest in "
            f"{100 * pk['share']:.0f}% of bootstrap resamples; {100 * r['confidence']:.0f}% "
            f"range of the peak: N = {pk['interval'][0]} to {pk['interval'][1]}): the data "
            f"{spread}. From N = {first['N']} to {last['N']} the pooled pass rate goes from "
            f"{100 * first['pass_rate']['mean']:.1f}% to {100 * last['pass_rate']['mean']:.1f}% "
            f"and generation from {first['rollouts_per_s']['mean']:.0f} to "
            f"{last['rollouts_per_s']['mean']:.0f} rollouts/s.")
    for name, v in r["variants"].items():
        setting = ", ".join(f"{k}: {val}" for k, val in v["update"].items())
        for other, c in v["versus"].items():
            lines.append(_test_sentence(
                c["paired_test"], c["difference"]["overall"], r["alpha"], r["power"],
                f"At equal rollouts, {name} ({v['arm']}'s shape with {setting}) - {other} "
                f"(N={r['arms'][other]['N']})"))
    t = r["plateau"]["baseline_vs_start"]["paired_test"]
    if math.isnan(t["p_two_sided"]):
        lines.append(f"{r['baseline']}: every instance changes by the same amount from the start "
                     f"({100 * t['delta']:+.2f} points), so the paired test is undefined.")
    elif t["p_two_sided"] >= r["alpha"]:
        lines.append(f"{r['baseline']} does not change significantly from the start "
                     f"({100 * t['delta']:+.2f} points, p = {t['p_two_sided']:.3g}): consistent "
                     "with the plateau the paper starts from.")
    elif t["delta"] > 0:
        lines.append(f"{r['baseline']} still improves from the start ({100 * t['delta']:+.2f} "
                     f"points, p = {t['p_two_sided']:.3g}): the start is not a plateau, so the "
                     "paper's premise does not hold here and a gain of the broad arm is not a "
                     "revival of a plateaued model.")
    else:
        lines.append(f"{r['baseline']} gets worse from the start ({100 * t['delta']:+.2f} "
                     f"points, p = {t['p_two_sided']:.3g}), as ProRL does in the paper's Fig. 1.")
    lines.append("What this does not show: anything beyond this tiny policy, its three generated "
                 f"task families and a budget of {r['budget_rollouts']} rollouts per run.")
    return lines


def markdown(r: dict[str, Any], names: dict[str, str]) -> str:
    base, other = r["baseline"], r["other"]
    tests = []
    for key, label in (("equal_rollouts", "equal rollouts"), ("equal_time", "equal training time")):
        t, d = r[key]["paired_test"], r[key]["difference"]
        per_family = ", ".join(f"{f} {_pts(d[f])}" for f in (*FAMILIES, "overall") if f in d)
        tests += [f"- {label}: delta {100 * t['delta']:+.2f} points, t = {t['t']:.3f}, p = "
                  f"{t['p_two_sided']:.4g} (one-sided {t['p_one_sided']:.4g}), Wilcoxon p = "
                  f"{t['wilcoxon_p']:.4g}, d_z = {t['effect_size_dz']:+.3f}, mde = "
                  f"{100 * t['mde']:.2f} points; {other} - {base} per family: {per_family}"]
    counts = ", ".join(f"{n} {f}" for f, n in r["instances_per_family"].items())
    text = [f"# Study {r['name']}: {base} vs {other} and an N-sweep", "",
            f"Every run continues the same warm-up policy for {r['budget_rollouts']} rollouts; "
            f"scores in points on the same {r['instances']} test instances "
            f"({counts}), mean [{100 * r['confidence']:.0f}% bootstrap "
            "interval over seeds and instances].", "", "## Verdict", "",
            *[f"- {line}" for line in verdict(r)], "",
            "## Table 1 layout (spec §5.1)", "", table1(r), "",
            "## Table 2 layout (spec §5.5; pooled over steps, intervals over seeds)", "",
            table2(r), "", "## Paired tests (per-instance scores averaged over seeds)", "", *tests,
            "", f"Equal training time: each run's per-instance scores interpolated linearly at "
            f"{r['equal_time']['seconds']:.1f} s, the smallest final training time of the two "
            "arms' runs.", "", f"![score vs rollouts]({names['rollouts']})",
            f"![score vs training seconds]({names['seconds']})", ""]
    if r["sweep"] is not None:
        text += ["## N-sweep", "", sweep_table(r["sweep"]), "", f"![N-sweep]({names['sweep']})",
                 ""]
    if r["variants"]:
        text += ["## Variants: other update settings at an arm's shape", "",
                 "Every variant spends the same rollouts per step and per run as its arm; "
                 "differences are variant - arm at equal rollouts (bootstrap interval over seeds "
                 "and instances; p of the paired t over seed-averaged instances).", "",
                 variants_table(r), ""]
    shrink = shrinkage_table(r)
    text += ["## Knowledge shrinkage on the live policy", ""]
    if shrink is None:
        text += ["Some runs logged no shrinkage diagnostics (recorded before they existed, or "
                 "with `diagnostics.enabled: false`).", ""]
    else:
        text += ["Reference-token probabilities of held-out probes and of each step's drawn "
                 "prompts, before and after every update (docs/metrics.md, `diag/*`); means "
                 "[bootstrap interval over seeds].", "", shrink, "",
                 f"![shrinkage]({names['shrinkage']})", ""]
    curve = r["plateau"]["warmup_validation"]
    if curve is not None and "warmup" in names:
        text += ["## The start point", "", f"The warm-up stopped at step {curve['start_step']}; "
                 "its validation curve:", "", f"![warm-up]({names['warmup']})", ""]
    return "\n".join(text)


def headline(r: dict[str, Any]) -> dict[str, float]:
    """What `dvc metrics show` prints for the study: differences rounded to 4 decimals,
    p-values to 3 significant digits (a p of 1e-8 must not print as 0)."""
    eq, et = r["equal_rollouts"]["paired_test"], r["equal_time"]["paired_test"]
    start = r["plateau"]["baseline_vs_start"]["paired_test"]
    out = {"delta_rollouts": eq["delta"], "p_rollouts": eq["p_two_sided"], "mde": eq["mde"],
           "delta_time": et["delta"], "p_time": et["p_two_sided"],
           "baseline_gain": start["delta"], "baseline_gain_p": start["p_two_sided"]}
    for name, v in r["variants"].items():
        for other, c in v["versus"].items():
            out[f"{name}_vs_{other}"] = c["paired_test"]["delta"]
            out[f"p_{name}_vs_{other}"] = c["paired_test"]["p_two_sided"]
    if r["sweep"] is not None:  # NaN when several N tie for the peak
        peak = r["sweep"]["peak"]
        out["peak_n"] = peak["N"] if len(peak["tied"]) == 1 else math.nan
    return {k: float(f"{float(v):.3g}") if k.startswith("p_") or k.endswith("_p")
            else round(float(v), 4) for k, v in out.items()}


def build_report(params: ExperimentParams, root: Path | str = ".") -> dict[str, Any]:
    """Read the runs, write report.md, report.json and the PNGs under `study.out_dir`; return
    the report's numbers with the verdict."""
    root = Path(root)
    out = root / params.study.out_dir
    results = load_results(params, root)
    warmup_dir = (root / params.train.init_checkpoint).parent  # the warm-up's run folder
    report = analyse(params, results, warmup_dir)
    report["verdict"] = verdict(report)
    arms = {name: [r for r in results if r.run.arm == name] for name in params.study.arms}
    drawn = {**arms, **{name: [r for r in results if r.run.variant == name]
                        for name in params.study.variants}}
    figures.curves(drawn, "rollouts", out / FIGURES["rollouts"], "rollouts generated")
    figures.curves(drawn, "seconds", out / FIGURES["seconds"], "training seconds")
    if report["sweep"] is not None:
        figures.sweep(report["sweep"]["points"], report["sweep"]["peak"], out / FIGURES["sweep"])
    else:
        figures.placeholder("no N-sweep in this study", out / FIGURES["sweep"])
    if shrinkage_table(report) is not None:
        figures.shrinkage(drawn, out / FIGURES["shrinkage"])
    else:
        figures.placeholder("no shrinkage diagnostics in these runs", out / FIGURES["shrinkage"])
    curve = report["plateau"]["warmup_validation"]
    if curve is not None and curve["points"]:
        figures.warmup(curve, out / FIGURES["warmup"])
    else:
        figures.placeholder(f"no validation evaluations in {warmup_dir}", out / FIGURES["warmup"])
    names = {k: v for k, v in FIGURES.items()
             if k != "warmup" or (curve is not None and curve["points"])}
    atomic_write_text(out / "report.md", markdown(report, names))
    atomic_write_text(out / "report.json", json.dumps(report, indent=1) + "\n")
    return report
