"""The ProRL-vs-BroRL report: the paper's Table 1 and Table 2 layouts, a paired test, plots.

Inputs are each arm's run outputs: `summary.json` (per-step metrics, training / evaluation /
checkpoint seconds) and `evals.jsonl` (one row per (step, split): training seconds and rollouts so
far, per-family scores, per-instance scores over the same problem ids). Only TEST rows are
reported (rows without "split" count as test, `brorl.runs.legacy`); validation rows choose
checkpoints and never score an arm.

- Table 1 (as BroRL Table 1): per evaluation, step, rollouts, each family's headline score (pass@1 =
  avg@k of correctness for math and code; the mean continuous reward for reasoning, ProRL (arXiv
  2505.24864) §3.4, with its pass@1 beside it) and the training seconds so far (evaluation and
  checkpoints out).
- Table 2 (as BroRL Table 2): N, prompts per step, the dynamic-sampling pass rate and generation
  throughput, both POOLED over steps (sum of kept over sum of generated rollouts; sum of rollouts
  over sum of generation seconds), not means of per-step ratios; evaluation and checkpoint
  seconds apart from training seconds.
- The paired test (BroRL §4.2.2): each arm minus the named baseline (`compare.baseline`), never the
  order of the arms, on their last test rows, per-instance headline scores
  (`brorl.evaluation.stats.paired_test`: t interval, d_z, Wilcoxon p, minimum detectable difference). Arms
  that generated different numbers of rollouts are refused: the comparison is at equal budget.

The report (`outputs/compare`, a DVC output) holds no wall-clock figure: its tables and plots
are those of `timings=False`, and the training seconds per evaluation, each arm's training /
evaluation / checkpoint seconds and its generation throughput go to `<out_dir>.timings.json`
beside it (`brorl.runs.timings`) and to the comparison's MLflow run (`report_metrics`). The arms'
seconds come from their own timings files (`brorl.evaluation.protocol.read_run`), NaN where missing.

Deliberately ignored: seed-to-seed variation. Each arm is one RL seed, so the test's only noise
is which instances were drawn; the report says so. The multi-seed study reports intervals over
seeds and instances. Both reports are written with `brorl.evaluation.reporting`'s run record, pooled rates,
cells and tables.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from brorl.evaluation.protocol import read_run
from brorl.evaluation.reporting import RunRecord, markdown_table, percent, points
from brorl.evaluation.stats import Interval, PairedTest, bootstrap_mean, paired_test
from brorl.families import family as problem_family
from brorl.families import ordered
from brorl.runs.legacy import family_key, instance_scores, row_families
from brorl.runs.timings import split_timings, write_timings

ALPHA = 0.05
"""Significance level of the report's wording and intervals (two-sided); our choice."""


@dataclass(frozen=True)
class ArmResult(RunRecord):
    """One arm's outputs, read from its run folder; `evals` holds its test rows by step."""

    name: str

    @classmethod
    def load(cls, name: str, run_dir: str | Path) -> ArmResult:
        summary, rows = read_run(run_dir, f"train arm {name!r} first (brorl train, or "
                                          "the compare flow).")
        return cls(summary=summary, evals=rows, name=name)


def family_value(record: dict[str, Any], family: str, quantity: str = "score") -> float:
    """A family's `quantity` in an evaluation row; "score" is its headline (ProRL (arXiv 2505.24864)
    §3.4)."""
    row = record["scores"]["family"].get(family, {})
    headline = problem_family(family).headline
    return float(row.get(family_key(row, quantity, headline), math.nan))


def _quantity_name(name: str) -> str:
    return "mean reward" if name == "reward_mean" else name.replace("_at_", "@")


def _label(family: str, quantity: str) -> str:
    name = problem_family(family).headline if quantity == "score" else quantity
    return f"{family} {_quantity_name(name)}"


def arm_families(arms: list[ArmResult]) -> list[str]:
    """The families the arms' evaluation rows score (their family scores and their instances'
    families), in table order (`brorl.families.ordered`)."""
    return ordered({f for a in arms for r in a.evals
                    for f in (*r["scores"]["family"], *row_families(r)) if f is not None})


def table1_columns(families: list[str]) -> list[tuple[str, str, str]]:
    """(family, quantity, header) of Table 1's score columns: each family's headline score, and
    its pass@1 beside a headline that is not pass@1 (reasoning's mean reward)."""
    columns = []
    for name in families:
        fam = problem_family(name)
        columns.append((name, "score", f"{fam.title} {_quantity_name(fam.headline)}"))
        if fam.headline != "pass_at_1":
            columns.append((name, "pass_at_1", f"{fam.title} pass@1"))
    return columns


def table1(arms: list[ArmResult], timings: bool = True) -> str:
    """Markdown: the headline score of every family the rows score at each test evaluation
    (percent), pass@1 beside a headline that is not pass@1, then (with `timings`) the training
    seconds so far."""
    columns = table1_columns(arm_families(arms))
    header = (["arm", "step", "rollouts", *(c[2] for c in columns)]
              + (["training time (s)"] if timings else []))
    rows = []
    for arm in arms:
        for r in arm.evals:
            scores = [family_value(r, name, quantity) for name, quantity, _ in columns]
            rows.append([arm.name, r["step"], int(r["rollouts"]), *map(percent, scores)]
                        + ([f"{r.get('seconds', math.nan):.1f}"] if timings else []))
    return markdown_table(header, "l" + "r" * (len(header) - 1), rows)


def table2(arms: list[ArmResult], timings: bool = True) -> str:
    """Markdown: N, B, pooled pass rates (the active keep rule, then both rules when logged),
    then (with `timings`) pooled throughput and training / evaluation / checkpoint seconds."""
    header = ["arm", "N", "prompts/step", "pass rate", "pass rate (binary)",
              "pass rate (any difference)"]
    if timings:
        header += ["rollouts/s", "training (s)", "evaluation (s)", "checkpoints (s)"]
    rows = []
    for arm in arms:
        s = arm.summary
        rates = [arm.pass_rate(k) for k in ("filter/pass_rate", "filter/pass_rate_binary",
                                            "filter/pass_rate_any_difference")]
        seconds = [s.get(k, math.nan) for k in ("train_seconds", "eval_seconds",
                                                 "checkpoint_seconds")]
        row = [arm.name, s.get("rollouts_per_prompt", "?"), s.get("prompts_per_step", "?"),
               *(percent(r, 1, "%") for r in rates)]
        if timings:
            row += [f"{arm.throughput():.1f}", *(f"{v:.1f}" for v in seconds)]
        rows.append(row)
    return markdown_table(header, "l" + "r" * (len(header) - 1), rows)


def family_scores(record: dict[str, Any], family: str) -> dict[str, float]:
    """Problem id -> headline score of the instances of `family` in an eval row."""
    return {i: v for i, v, f in zip(record["problem_ids"], instance_scores(record),
                                    row_families(record), strict=True) if f == family}


def start_and_end(arms: list[ArmResult], baseline: str, *, alpha: float = ALPHA) -> dict[str, Any]:
    """Per family: the start's score (the baseline arm's step-0 row, which every arm shares at
    an equal start) and each arm's last score, each with a bootstrap interval over instances, and
    each arm's change from the start (paired over the same instances, t interval). Families with
    fewer than two instances are left out."""
    by_name = {a.name: a for a in arms}
    start = by_name[baseline].evals[0]
    out: dict[str, Any] = {"start_step": start["step"], "families": {}}
    for family in arm_families(arms):
        base = family_scores(start, family)
        if len(base) < 2:
            continue
        row: dict[str, Any] = {"instances": len(base),
                               "start": asdict(bootstrap_mean(list(base.values()),
                                                              confidence=1 - alpha))}
        for arm in arms:
            last = family_scores(arm.evals[-1], family)
            ids = [i for i in base if i in last]
            if len(ids) < 2:
                continue
            change = paired_test([base[i] for i in ids], [last[i] for i in ids], alpha=alpha)
            row[arm.name] = {"end": asdict(bootstrap_mean([last[i] for i in ids],
                                                          confidence=1 - alpha)),
                             "change": {"mean": change.delta, "low": change.ci_low,
                                        "high": change.ci_high, "p": change.p_two_sided}}
        out["families"][family] = row
    return out


def start_and_end_table(summary: dict[str, Any], arms: list[ArmResult]) -> str:
    """Markdown of `start_and_end`: percent with 95% intervals, changes in points."""
    header = ["family", "instances", "start (step 0)",
              *(f"{a.name} {what}" for a in arms for what in ("end", "change"))]
    rows = []
    for family, row in summary["families"].items():
        cells = [family, str(row["instances"]), _cell(Interval(**row["start"]))]
        for arm in arms:
            got = row.get(arm.name)
            if got is None:
                cells += ["–", "–"]
                continue
            c = got["change"]
            cells += [_cell(Interval(**got["end"])),
                      points(c["mean"], c["low"], c["high"], digits=1, signed=True)]
        rows.append(cells)
    return markdown_table(header, "l" + "r" * (2 + 2 * len(arms)), rows)


def _cell(interval: Interval) -> str:
    return points(interval.mean, interval.low, interval.high, digits=1)


def _instance_scores(record: dict[str, Any]) -> dict[str, float]:
    """Problem id -> its headline score."""
    return dict(zip(record["problem_ids"], instance_scores(record), strict=True))


def paired(baseline: ArmResult, arm: ArmResult, *, alpha: float = ALPHA) -> dict[str, Any]:
    """`arm` - `baseline` on their last test rows' common instances (`brorl.evaluation.stats.paired_test`),
    overall and per family. Raises ValueError when the two rows' rollouts differ."""
    eb, ea = baseline.evals[-1], arm.evals[-1]
    if int(eb["rollouts"]) != int(ea["rollouts"]):
        raise ValueError(
            f"paired: {arm.name} generated {int(ea['rollouts'])} rollouts and {baseline.name} "
            f"{int(eb['rollouts'])} at their last test evaluations; compare at an equal budget "
            "(a compare.budget_rollouts divisible by every arm's N ends each run exactly on it).")
    sb, sa = _instance_scores(eb), _instance_scores(ea)
    common = [i for i in eb["problem_ids"] if i in sa]
    if len(common) < 2:
        raise ValueError(f"paired: {baseline.name} and {arm.name} share {len(common)} test "
                         "instances; evaluate both on the same instances (train.eval_seed).")
    ids = eb["problem_ids"]
    families = dict(zip(ids, eb.get("families") or [None] * len(ids), strict=True))
    result = {"baseline": baseline.name, "arm": arm.name, "rollouts": int(eb["rollouts"]),
              "unmatched": len(set(sb) ^ set(sa)),
              **_test_dict(paired_test([sb[i] for i in common], [sa[i] for i in common],
                                       alpha=alpha)), "families": {}}
    for fam in ordered({f for f in families.values() if f is not None}):
        ids = [i for i in common if families[i] == fam]
        if len(ids) >= 2:
            result["families"][fam] = _test_dict(
                paired_test([sb[i] for i in ids], [sa[i] for i in ids], alpha=alpha))
    return result


def _test_dict(test: PairedTest) -> dict[str, Any]:
    """A `PairedTest` as the report's JSON: `instances`, and the paper's `p_one_tailed`."""
    d = asdict(test)
    d.pop("n")
    d["instances"] = test.n
    d["p_one_tailed"] = d.pop("p_one_sided")  # the paper's name (BroRL §4.2.2)
    return d


def verdict(test: dict[str, Any], alpha: float = ALPHA) -> str:
    """Plain words for one paired test: significant or not, the interval, what it can detect."""
    head = (f"{test['arm']} - {test['baseline']} over {test['instances']} test instances at "
            f"{test['rollouts']} rollouts each: mean difference {100 * test['delta']:+.2f} points "
            f"({100 * (1 - alpha):g}% CI {100 * test['ci_low']:+.2f} to "
            f"{100 * test['ci_high']:+.2f}), t = {test['t']:.2f}, two-sided p = {test['p_two_sided']:.3g} (one-tailed "
            f"p = {test['p_one_tailed']:.3g}), d_z = {test['effect_size_dz']:.2f}, Wilcoxon "
            f"p = {test['wilcoxon_p']:.3g}.")
    if math.isnan(test["p_two_sided"]):
        said = "The test is undefined: every instance differs by the same amount."
    elif test["p_two_sided"] < alpha:
        better = test["arm"] if test["delta"] > 0 else test["baseline"]
        said = (f"The difference is significant at the {alpha:g} level (two-sided): {better} "
                "scores higher on these instances.")
    else:
        said = (f"The difference is NOT significant at the {alpha:g} level (two-sided): these "
                "data do not show that either arm is better.")
    return (f"{head} {said} With this spread the test detects a difference of "
            f"{100 * test['mde']:.2f} points with 80% power. Each arm is ONE training seed, so "
            "the test covers the choice of instances only, not seed-to-seed variation: a "
            "difference here may not hold for another seed.")


CAPTIONS = {
    "table1": "Table: each family's score is the MEAN OVER ITS TASKS of each task's mean over its "
              "test instances (a task weighs the same whatever its instance count; "
              "`eval/score_<family>`, docs/metrics.md), {evaluation}. It differs from the "
              "start-and-end table's mean over instances when a family's tasks have unequal "
              "instance counts.",
    "start_and_end": "Table: each score is the MEAN OVER THE FAMILY'S TEST INSTANCES (every "
                     "instance weighs the same, tasks pooled), not Table 1's mean over tasks, "
                     "{evaluation}; intervals are bootstrap over instances, changes are paired "
                     "over instances.",
    "table2": "Table: training rollouts, not an evaluation: each rate is POOLED OVER THE ARM'S "
              "TRAINING STEPS (sum of the rollouts of the groups the keep rule passes / sum of "
              "rollouts generated, the active rule, then each rule), not a mean of per-step "
              "rates.",
    "paired": "Table: each family's arm - baseline difference of the MEAN OVER THE FAMILY'S "
              "COMMON TEST INSTANCES (instances weigh the same, tasks pooled), {evaluation}; "
              "paired over instances (t interval, two-sided p).",
}
"""The statement above each table of `report.md`: what its figures average, over what unit, and
which evaluation (`{evaluation}`: `evaluation_words`)."""


def evaluation_words(arms: list[ArmResult], sampling: dict[str, Any] | None) -> str:
    """`per instance the avg@k of its k = 4 evaluation samples, temperature 0.6, top-p 0.95
    (...)`: which evaluation the report's scores are. k comes from `sampling` or else from the rows'
    pass@k keys; temperature and top-p only from `sampling`."""
    if sampling is not None:
        k = int(sampling["samples"])
        how = f", temperature {sampling['temperature']:g}, top-p {sampling['top_p']:g}"
    else:
        ks = {int(q.removeprefix("pass_at_")) for a in arms for r in a.evals
              for fam in r["scores"]["family"].values() for q in fam
              if q.startswith("pass_at_")}
        k = max(ks, default=1)
        how = ", sampling settings not recorded"
    return (f"per instance the avg@k of its k = {k} evaluation samples{how} (correctness for "
            "pass@1, the reward for the mean reward)")


def plot(arms: list[ArmResult], path: Path, quantity: str = "score",
         timings: bool = True) -> Path:
    """One quantity per family (headline score or pass@1) against training seconds (top row,
    with `timings`) and rollouts (bottom row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_x = ([("seconds", "training time (s)")] if timings else []) + \
        [("rollouts", "rollouts generated")]
    names = arm_families(arms)
    fig, axes = plt.subplots(len(axes_x), len(names),
                             figsize=(4 * len(names), 3.25 * len(axes_x) + 0.5), squeeze=False)
    for col, family in enumerate(names):
        for row, (x_key, x_label) in enumerate(axes_x):
            ax = axes[row][col]
            for arm in arms:
                ax.plot([r.get(x_key, math.nan) for r in arm.evals],
                        [family_value(r, family, quantity) for r in arm.evals],
                        marker="o", label=arm.name)
            ax.set_xlabel(x_label)
            ax.set_ylabel(_label(family, quantity))
            ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("ProRL vs BroRL: held-out test scores (same start, equal budget, one seed each)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build_report(arms: list[ArmResult], out_dir: str | Path, baseline: str,
                 sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write `report.md`, `report.json`, `scores.png` and `pass_at_1.png` under `out_dir`, none
    with a wall-clock figure, and those figures to `<out_dir>.timings.json`; return the JSON
    with them (`arms`' seconds, `rollouts_per_s`). `paired_test` is the first non-baseline
    arm's test, `paired_tests` every arm's. `sampling` is the arms' shared evaluation sampling
    (`brorl.evaluation.protocol.EvalProtocol.sampling`), named in the report's words (`evaluation_words`)."""
    by_name = {a.name: a for a in arms}
    if baseline not in by_name:
        raise ValueError(f"compare.baseline {baseline!r} is not an arm; choose from "
                         f"{sorted(by_name)}.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tests = {a.name: paired(by_name[baseline], a) for a in arms if a.name != baseline}
    ends = start_and_end(arms, baseline)
    names = arm_families(arms)
    figures = [plot(arms, out_dir / "scores.png", timings=False),
               plot(arms, out_dir / "pass_at_1.png", "pass_at_1", timings=False)]
    evaluation = evaluation_words(arms, sampling)
    caption = {name: text.format(evaluation=evaluation) for name, text in CAPTIONS.items()}
    text = ["# ProRL vs BroRL", "",
            "Every arm starts from the same checkpoint with an equal rollout budget and is scored "
            "on the same held-out test instances. Scores in percent: each family's headline "
            "(pass@1, or the mean continuous reward for Reasoning, BroRL §4.2, as in ProRL, with "
            f"its pass@1 beside it); every score is {evaluation}. Wall-clock figures (training seconds, "
            f"throughput) are in {out_dir.name}.timings.json beside this folder and in the MLflow "
            "run, not here: this report is the same whenever the weights are.", "",
            "## Scores per evaluation (Table 1 layout, BroRL Table 1)", "", caption["table1"],
            "", table1(arms, timings=False), "",
            "## Start and end per family", "",
            "The start's scores (step 0, shared by every arm) and each arm's last, in percent with "
            f"{100 * (1 - ALPHA):g}% bootstrap intervals over the instances; each arm's change "
            "from the start in points, paired over the same instances (t interval). One training "
            "seed per arm: the intervals cover the choice of instances only.", "",
            caption["start_and_end"], "", start_and_end_table(ends, arms), "",
            "## Dynamic-sampling pass rate (Table 2 layout, BroRL Table 2)",
            "", "The generation throughput (rollouts / generation seconds) is with the "
            "wall-clock figures.", "", caption["table2"], "", table2(arms, timings=False), ""]
    for test in tests.values():
        text += [f"## Paired test: {test['arm']} - {test['baseline']} (last test evaluation)", "",
                 verdict(test), ""]
        if test["families"]:
            rows = [[fam, t["instances"], f"{100 * t['delta']:+.2f}",
                     f"{100 * t['ci_low']:+.2f} to {100 * t['ci_high']:+.2f}",
                     f"{t['p_two_sided']:.3g}"] for fam, t in test["families"].items()]
            text += [caption["paired"], "",
                     markdown_table(["family", "instances", "difference (points)", "95% CI",
                                     "p (two-sided)"], "lrrrr", rows), ""]
    text += [f"![{f.stem}]({f.name})" for f in figures] + [""]
    (out_dir / "report.md").write_text("\n".join(text))
    report = {
        "baseline": baseline,
        "final_score": {a.name: {f: family_value(a.evals[-1], f) for f in names} for a in arms},
        "final_pass_at_1": {a.name: {f: family_value(a.evals[-1], f, "pass_at_1")
                                     for f in names} for a in arms},
        "paired_test": next(iter(tests.values()), None), "paired_tests": tests,
        "start_and_end": ends,
        "arms": {a.name: {k: a.summary[k] for k in ("steps", "rollouts", "train_seconds",
                                                    "eval_seconds", "checkpoint_seconds",
                                                    "stopped_by") if k in a.summary}
                 for a in arms},
        "pass_rate": {a.name: a.pass_rate() for a in arms},
        "rollouts_per_s": {a.name: a.throughput() for a in arms}}
    stable = {**report, "arms": {a: split_timings(row)[0] for a, row in report["arms"].items()}}
    stable.pop("rollouts_per_s")
    (out_dir / "report.json").write_text(json.dumps(stable, indent=1, allow_nan=True) + "\n")
    write_timings(out_dir, {
        "arms": {a: split_timings(row)[1] for a, row in report["arms"].items()},
        "rollouts_per_s": report["rollouts_per_s"],
        "evals": {a.name: [{"step": r["step"], "seconds": r.get("seconds", math.nan)}
                           for r in a.evals] for a in arms}})
    return report


DVC_METRICS = {"delta": "delta", "ci_low": "ci_low", "ci_high": "ci_high", "p": "p_one_tailed",
               "p_two_sided": "p_two_sided", "mde": "mde"}
"""The DVC metrics of a comparison -> their key in the paired test. `p` is one-tailed (arm above
the baseline), the paper's test (BroRL §4.2.2); the report's wording uses the two-sided p."""


PAIRED_METRICS = {"delta": "delta", "ci_low": "ci_low", "ci_high": "ci_high", "p": "p_one_tailed",
                  "p_two_sided": "p_two_sided", "dz": "effect_size_dz",
                  "wilcoxon_p": "wilcoxon_p", "mde": "mde"}
"""`compare/paired_<name>` metric -> the paired test's key in report.json."""


def report_metrics(report: dict[str, Any]) -> dict[str, float]:
    """Flat `compare/...` metrics of a report: final score and pass@1 per family and arm, the
    pooled pass rate per arm, its generation throughput and training seconds (those of
    `build_report`'s return: report.json holds neither), and the first non-baseline arm's
    paired test against the baseline as `compare/paired_<q>` (report.json holds every arm's)."""
    metrics = {f"compare/{q}_{fam}_{arm}": v for q in ("score", "pass_at_1")
               for arm, row in report[f"final_{q}"].items() for fam, v in row.items()}
    metrics.update({f"compare/pass_rate_{a}": v for a, v in report["pass_rate"].items()})
    metrics.update({f"compare/rollouts_per_s_{a}": v
                    for a, v in report.get("rollouts_per_s", {}).items()})
    metrics.update({f"compare/train_seconds_{a}": row["train_seconds"]
                    for a, row in report["arms"].items() if "train_seconds" in row})
    test = report.get("paired_test") or {}
    metrics.update({f"compare/paired_{q}": test[k] for q, k in PAIRED_METRICS.items() if test})
    return metrics


def headline(report: dict[str, Any]) -> dict[str, float]:
    """The few numbers `dvc metrics show` prints: the first paired test, rounded; NaN without."""
    test = report.get("paired_test") or {}
    return {name: round(float(test.get(key, math.nan)), 4) for name, key in DVC_METRICS.items()}
