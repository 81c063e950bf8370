"""The study's report: `report.md` (the verdict, the design, the plateau, the pool, scores,
contrasts), `report.json` (every number, `brorl.study.analysis`), PNG figures
(`brorl.study.figures`) and the headline for `dvc metrics show` (`headline`).

Every sentence of the verdict is written from the numbers at report time: the warm-up's slope
test says whether the start is shown plateaued; each contrast's reading (Holm-adjusted seed-level
p, Holm-adjusted TOST p at the study's margin) says higher, lower, no change beyond the margin,
or inconclusive; the pre-registered revival rule is applied per arm. Scores are in points (percent):
avg@k of the family score (pass@1 for math and code, mean reward for reasoning, ProRL (arXiv
2505.24864) §3.4), pass@k beside it; cells and tables are `brorl.reporting`'s, as in the
comparison.

The report's files are DVC outputs and hold no wall-clock figure: each arm's training and
evaluation seconds and generation throughput (`TIMING_KEYS`, from the runs' own timings files,
`brorl.evals.read_run`) go to `<out_dir>/report.timings.json` (`brorl.timings`), and
`build_report` returns them with the rest.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brorl.evals import read_start
from brorl.files import atomic_write_text
from brorl.reporting import markdown_table, p_value, percent, points
from brorl.study import figures
from brorl.study.analysis import analyse
from brorl.study.plan import plan_runs, pool_dir, run_dir, warmup_dir
from brorl.study.pool import POOL_FILE
from brorl.study.results import RunResult
from brorl.study.start import start_path
from brorl.study.warmup import read_warmup
from brorl.timings import split_timings, write_timings
from brorl.types import FAMILIES

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

FIGURES = {"rollouts": "score_vs_rollouts.png", "steps": "score_vs_steps.png",
           "warmup": "warmup.png", "pool": "pool.png"}
REPORT_FILES = ("report.md", "report.json", *FIGURES.values())
"""What `build_report` writes into `study.out_dir` (the DVC stage's outputs)."""
TIMINGS = "report"
"""`<out_dir>/report.timings.json` (`brorl.timings.timings_path` of `<out_dir>/report`): each
arm's wall-clock figures, kept out of `REPORT_FILES`."""
WORDS = {"higher": "higher", "lower": "lower",
         "equivalent": "no change beyond the margin (equivalent by TOST)",
         "higher_within_margin": "higher, by less than the margin",
         "lower_within_margin": "lower, by less than the margin",
         "inconclusive": "inconclusive: neither a difference nor equivalence within the margin "
                         "is shown",
         "not_reached": "not estimated: a run of one side has no evaluation at its point"}


def load_results(params: ExperimentParams, root: Path) -> list[RunResult]:
    """Every run of the study's plan, read from its folder."""
    return [RunResult.load(run, root / run_dir(params.study, run))
            for run in plan_runs(params.study)]


def _pts(iv: dict[str, float]) -> str:
    """`61.69 [60.10, 63.20]` in points, or `61.69` when the interval is undefined."""
    if math.isnan(iv["low"]):
        return f"{100 * iv['mean']:.2f}"
    return points(iv["mean"], iv["low"], iv["high"])


def _diff(iv: dict[str, float]) -> str:
    return points(iv["mean"], iv["low"], iv["high"], signed=True)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def plateau_sentence(r: dict[str, Any]) -> str:
    """Whether the start is shown plateaued, from the warm-up's slope test."""
    w = r["plateau"]
    if w is None or w.get("verdict") is None:
        return ("The warm-up record (plateau.json with at least `window` evaluations) is "
                "missing: whether the start is a plateau is unknown here.")
    t = w["verdict"]["test"]
    drift = (f"a drift of {100 * t['slope']:+.2f} points per study run ({w['budget_rollouts']} "
             f"rollouts; {100 * r['confidence']:.0f}% CI [{100 * t['ci_low']:+.2f}, "
             f"{100 * t['ci_high']:+.2f}]) over its last {w['window']} validation evaluations "
             f"(steps {w['verdict']['steps'][0]}-{w['verdict']['steps'][-1]}, "
             f"{t['instances']} instances), TOST p = {p_value(t['p_equivalence'])} against "
             f"+-{100 * w['margin']:.1f} points")
    if w["plateaued"]:
        return f"The start is shown plateaued: {drift}."
    return (f"The start is not shown plateaued: the warm-up reached its cap at step "
            f"{w['steps']} with {drift}; no gain of an arm below can be read as reviving a "
            "plateau.")


def contrast_sentence(name: str, c: dict[str, Any], r: dict[str, Any]) -> str:
    """One contrast's numbers and reading in words."""
    what = c["about"] or name
    if "not_reached" in c:
        return (f"{what} ({c['b']} - {c['a']}): not estimated: {c['not_reached']}; it stays in "
                "the Holm families with p = 1.")
    s, k = c["score"], c["pass_at_k"]
    t = s["test"]
    seeds = f"{s['seeds_b']} seeds against the start" if t["kind"] == "one_sample" else \
        f"{s['seeds_b']} seeds, paired" if t["kind"] == "paired" else \
        f"{s['seeds_a']} and {s['seeds_b']} seeds"
    return (f"{what} ({c['b']} - {c['a']}): {100 * t['delta']:+.2f} points, two-way "
            f"{100 * r['confidence']:.0f}% CI [{100 * s['difference']['low']:+.2f}, "
            f"{100 * s['difference']['high']:+.2f}]; seed-level {t['kind']} t over "
            f"{seeds}, p = {p_value(t['p_two_sided'])} (Holm "
            f"{p_value(s['p_holm'])}), TOST within +-{100 * r['margin']:.1f} points Holm p = "
            f"{p_value(s['p_equivalence_holm'])}: {WORDS[s['reading']]}. pass@k: "
            f"{_diff(k['difference'])} points.")


def verdict(r: dict[str, Any]) -> list[str]:
    """Plain sentences generated from the numbers (module docstring)."""
    lines = [plateau_sentence(r)]
    lines += [contrast_sentence(name, c, r) for name, c in r["contrasts"].items()]
    for arm, v in r["revival"].items():
        if v["revives"]:
            lines.append(f"{arm} revives the plateau by the pre-registered rule: the start was "
                         f"shown flat and {', '.join(v['contrasts'])} all read higher.")
        else:
            why = [] if v["start_flat"] else ["the start was not shown plateaued"]
            if v["not_higher"]:
                why.append(f"{', '.join(v['not_higher'])} do not read higher")
            lines.append(f"{arm} does not revive the plateau by the pre-registered rule: "
                         f"{'; '.join(why)}.")
    lines.append(f"What this does not show: anything beyond this tiny policy, its three "
                 f"generated task families, {r['max_response_tokens']}-token responses and "
                 f"{r['budget_rollouts']} rollouts per run.")
    return lines


def arms_table(r: dict[str, Any]) -> str:
    header = ["arm", "what it isolates", "N", "B", "LR", "ends at", "seeds", "RL steps",
              "RL steps at budget", "optimizer steps", f"rollouts at step {r['equal_steps']}"]
    rows = []
    for name, a in r["arms"].items():
        end = f"budget and step {r['equal_steps']}" if a["stop"] == "rollouts" else \
            f"step {r['equal_steps']}"
        at_budget = a.get("steps_at_budget")
        rows.append([name, a["about"], a["N"], a["B"], f"{a['lr']:.3g}", end, len(a["runs"]),
                     f"{_mean(a['steps']):.1f}", f"{_mean(at_budget):.1f}" if at_budget else "-",
                     f"{_mean(a['optimizer_steps']):.0f}",
                     f"{_mean(a['rollouts_at_steps']):.0f}" if a["rollouts_at_steps"] else
                     "not reached"])
    return markdown_table(header, "llrrrlrrrrr", rows)


def scores_table(r: dict[str, Any]) -> str:
    fams = [f for f in FAMILIES if f in r["start"]["score"]]
    points_of = [("start (warm-up policy)", r["start"])]
    for name, a in r["arms"].items():
        points_of += [(f"{name}@{p}", x) for p, x in a["at"].items()]
    rows = [[label, *(_pts(x["score"][f]) for f in fams), _pts(x["score"]["overall"]),
             _pts(x["pass_at_k"]["overall"])] for label, x in points_of]
    return markdown_table(["point", *fams, "overall avg@k", "overall pass@k"],
                          "l" + "r" * (len(fams) + 2), rows)


def contrasts_table(r: dict[str, Any]) -> str:
    header = ["contrast", "b - a", "avg@k points [two-way CI]", "seed test", "df", "p",
              "Holm p", "TOST Holm p", "reading", "pass@k points [CI]", "pass@k p"]
    rows = []
    for name, c in r["contrasts"].items():
        if "not_reached" in c:
            rows.append([name, f"{c['b']} - {c['a']}", "not reached", *["-"] * 5, "not_reached",
                         "-", "-"])
            continue
        s, k = c["score"], c["pass_at_k"]
        rows.append([name, f"{c['b']} - {c['a']}", _diff(s["difference"]), s["test"]["kind"],
                     f"{s['test']['df']:.1f}", p_value(s["test"]["p_two_sided"]),
                     p_value(s["p_holm"]), p_value(s["p_equivalence_holm"]), s["reading"],
                     _diff(k["difference"]), p_value(k["test"]["p_two_sided"])])
    return markdown_table(header, "llrlrrrrlrr", rows)


def rates_table(r: dict[str, Any], caption: str) -> str:
    predicted = (r["pool"] or {}).get("predicted_pass_rate", math.nan)
    rows = [[f"{name} ({a['N']})", f"{_pts(a['pass_rate'])}%"] for name, a in r["arms"].items()]
    table = markdown_table(["arm (N)", "dynamic-sampling pass rate"], "lr", rows)
    return (f"Predicted ProRL pass rate of the pool (start policy): {100 * predicted:.1f}%. "
            "Generation throughput and training seconds per arm: report.timings.json beside "
            f"this report, and the runs' MLflow records.\n\n{caption}\n\n{table}")


def pool_table(pool: dict[str, Any]) -> str:
    train, chosen = pool["train"], pool["pool"]
    rows = [[a["bin"], a["count"], b["count"]]
            for a, b in zip(train["histogram"], chosen["histogram"])]
    small, large = pool["n_small"], pool["n_large"]
    for key, label in ((f"keep_rate_n{small}", f"predicted pass rate at N = {small}"),
                       (f"keep_rate_n{large}", f"predicted pass rate at N = {large}"),
                       ("share_below_one_in_n", f"share solved in under 1 of {small} tries"),
                       ("share_rescued", f"share of groups all-wrong at N = {small}, not at "
                                         f"N = {large}"),
                       ("mean_pass", "mean pass rate")):
        rows.append([label, percent(train[key], 1, "%"), percent(chosen[key], 1, "%")])
    return markdown_table(["start pass rate", "train prompts", "pool prompts"], "lrr", rows)


CAPTIONS = {
    "arms": "Table: per arm, counts are the MEAN OVER ITS SEEDS (runs); N, B and LR are the "
            "arm's settings.",
    "scores": "Table: each score is the MEAN OVER SEEDS AND TEST INSTANCES (every instance "
              "weighs the same, tasks pooled; 'overall' pools every family's instances, not a "
              "mean of families), {evaluation}; pass@k from the same samples.",
    "contrasts": "Table: each difference is b - a of the MEAN OVER SEEDS AND TEST INSTANCES "
                 "(as the scores), {evaluation}; the interval is two-way bootstrap over seeds "
                 "and instances, the test has SEEDS as its unit (one mean per run).",
    "rates": "Table: training rollouts, not an evaluation: each rate is pooled over a run's "
             "training steps (kept / generated rollouts), then the MEAN OVER THE ARM'S SEEDS.",
    "pool": "Table: COUNTS OF PROMPTS per bin of the start policy's estimated pass rate (its "
            "training rollouts, not an evaluation); the rows below are shares of prompts.",
}
"""The statement above each table of `report.md`: what its figures average, over what unit, and
which evaluation (`{evaluation}`: `evaluation_words`)."""


def evaluation_words(r: dict[str, Any]) -> str:
    """`per instance the avg@k of its k = 8 evaluation samples, temperature 0.6, top-p 0.95`."""
    e = r["evaluation"]
    return (f"per instance the avg@k of its k = {e['samples']} evaluation samples, temperature "
            f"{e['temperature']:g}, top-p {e['top_p']:g}")


def markdown(r: dict[str, Any], names: dict[str, str]) -> str:
    counts = ", ".join(f"{n} {f}" for f, n in r["instances_per_family"].items())
    caption = {k: v.format(evaluation=evaluation_words(r)) for k, v in CAPTIONS.items()}
    text = [f"# Study {r['name']}", "",
            f"Every run continues the study's start policy on its prompt pool; scores in points "
            f"on the same {r['instances']} test instances ({counts}); intervals "
            f"{100 * r['confidence']:.0f}% two-way bootstrap over seeds and instances; tests "
            f"with seeds as the unit, Holm-adjusted across the contrasts; margin of every "
            f"'no change' +-{100 * r['margin']:.1f} points (TOST).", "", "## Verdict", "",
            *[f"- {line}" for line in r["verdict"]], "",
            "## Arms", "", caption["arms"], "", arms_table(r), "",
            "## Scores", "", caption["scores"], "", scores_table(r), "",
            "## Contrasts (pre-registered)", "", caption["contrasts"], "", contrasts_table(r), "",
            f"![score vs rollouts]({names['rollouts']})",
            f"![score vs RL steps]({names['steps']})", "",
            "## Dynamic sampling", "", rates_table(r, caption["rates"]), ""]
    if r["pool"] is not None:
        text += ["## The prompt pool (the start policy's pass rates)", "", caption["pool"], "",
                 pool_table(r["pool"]), "", f"![pool]({names['pool']})", ""]
    text += ["## The start point", "", plateau_sentence(r), "", f"![warm-up]({names['warmup']})",
             ""]
    return "\n".join(text)


def headline(r: dict[str, Any]) -> dict[str, Any]:
    """`metrics/study.json`: each contrast's difference with its two-way interval, seed-level p,
    Holm p, Holm TOST p, seeds and instances (`reached` 0 and the instances alone for a contrast
    not estimated); the plateau test; the revival rule per arm.
    Differences rounded to 4 decimals, p-values to 3 significant digits (never 0)."""
    def p3(x: float) -> float:
        return float(f"{x:.3g}") if math.isfinite(x) else math.nan

    out: dict[str, Any] = {"contrasts": {}}
    for name, c in r["contrasts"].items():
        if "not_reached" in c:
            out["contrasts"][name] = {"reached": 0, "instances": c["instances"]}
            continue
        s = c["score"]
        out["contrasts"][name] = {"reached": 1,
            "delta": round(s["test"]["delta"], 4), "ci_low": round(s["difference"]["low"], 4),
            "ci_high": round(s["difference"]["high"], 4), "p": p3(s["test"]["p_two_sided"]),
            "p_holm": p3(s["p_holm"]), "p_equivalence_holm": p3(s["p_equivalence_holm"]),
            "pass_at_k_delta": round(c["pass_at_k"]["test"]["delta"], 4),
            "seeds_a": s["seeds_a"], "seeds_b": s["seeds_b"], "instances": c["instances"]}
    w = r["plateau"]
    if w is not None and w.get("verdict") is not None:
        t = w["verdict"]["test"]
        out["plateau"] = {"flat": int(w["plateaued"]), "drift": round(t["slope"], 4),
                          "p_equivalence": p3(t["p_equivalence"]), "steps": w["steps"]}
    out["revives"] = {arm: int(v["revives"]) for arm, v in r["revival"].items()}
    return out


def write_headline(result: dict[str, Any], path: Path) -> None:
    """`headline(result)` as the DVC metrics file `path`."""
    atomic_write_text(path, json.dumps(headline(result), indent=2, sort_keys=True) + "\n")


def build_report(params: ExperimentParams, root: Path | str = ".") -> dict[str, Any]:
    """Read the runs, the start, the warm-up and the pool; write report.md, report.json and the
    PNGs under `study.out_dir`; return the report's numbers with the verdict."""
    root = Path(root)
    study = params.study
    out = root / study.out_dir
    results = load_results(params, root)
    start = read_start(root / start_path(study))["rows"][0]
    plateau = read_warmup(root / warmup_dir(params))
    pool_file = root / pool_dir(params) / POOL_FILE
    pool = json.loads(pool_file.read_text()) if pool_file.is_file() else None
    if pool is not None:  # the per-prompt estimates stay in pool.json
        pool = {k: v for k, v in pool.items() if k not in ("estimates", "pool_ids")}
    report = analyse(params, results, start, plateau, pool)
    report["verdict"] = verdict(report)
    arms = {name: [r for r in results if r.run.arm == name] for name in study.arms}
    figures.curves(arms, "rollouts", out / FIGURES["rollouts"], "rollouts generated")
    figures.curves(arms, "step", out / FIGURES["steps"], "RL steps (4 optimizer steps each)")
    figures.warmup(plateau, out / FIGURES["warmup"])
    figures.pool(pool, out / FIGURES["pool"])
    atomic_write_text(out / "report.md", markdown(report, FIGURES))
    stable = {**report, "arms": {n: split_timings(a)[0] for n, a in report["arms"].items()}}
    atomic_write_text(out / "report.json", json.dumps(stable, indent=1) + "\n")
    write_timings(out / TIMINGS, {"arms": {n: split_timings(a)[1]
                                           for n, a in report["arms"].items()}})
    return report
