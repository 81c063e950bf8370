"""The study's report: `report.md` (the verdict, the design, the premise, the pool and hold-out,
scores, pass@k, contrasts, every seed), `report.json` (every number, `brorl.study.analysis`),
`seeds.md` (the per-seed table alone), PNG figures (`brorl.study.figures`) and the headline for
`dvc metrics show` (`headline`: per-seed values included).

Every sentence of the verdict is written from the numbers at report time: the premise's TOST
says whether the baseline is shown flat where the arms run; each contrast's reading (seed-level
t, Holm within its family, a TOST only where the plan reads one) says higher, lower, no change
beyond the margin, or inconclusive, with the effect the design detects beside it; the warm-up's
slope test (the evaluations as the unit); the pre-registered revival rule per arm. Scores are in points (percent):
avg@k of the family score (pass@1 for math and code, mean reward for reasoning, ProRL (arXiv
2505.24864) §3.4), pass@k beside it; cells and tables are `brorl.evaluation.reporting`'s, as in the
comparison.

The report's files are DVC outputs and hold no wall-clock figure: each arm's training and
evaluation seconds and generation throughput (`TIMING_KEYS`, from the runs' own timings files,
`brorl.evaluation.protocol.read_run`) go to `<out_dir>/report.timings.json` (`brorl.runs.timings`), and
`build_report` returns them with the rest.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brorl.evaluation.protocol import read_evals, read_start
from brorl.evaluation.reporting import markdown_table, p_value, percent, points
from brorl.families import ordered
from brorl.runs.files import atomic_write_text
from brorl.runs.timings import split_timings, write_timings
from brorl.study import figures, probe
from brorl.study.analysis import analyse
from brorl.study.plan import plan_runs, pool_dir, run_dir, warmup_dir
from brorl.study.pool import POOL_FILE
from brorl.study.results import RunResult
from brorl.study.start import start_path
from brorl.study.warmup import plateau_test, read_warmup

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

FIGURES = {"rollouts": "score_vs_rollouts.png", "steps": "score_vs_steps.png",
           "warmup": "warmup.png", "pool": "pool.png"}
REPORT_FILES = ("report.md", "report.json", "seeds.md", *FIGURES.values())
"""What `build_report` writes into `study.out_dir` (the DVC stage's outputs)."""
TIMINGS = "report"
"""`<out_dir>/report.timings.json` (`brorl.runs.timings.timings_path` of `<out_dir>/report`): each
arm's wall-clock figures, kept out of `REPORT_FILES`."""
WORDS = {"higher": "higher", "lower": "lower",
         "equivalent": "no change beyond the margin (equivalent by TOST)",
         "inconclusive": "inconclusive: no difference is shown",
         "not_reached": "not estimated: a run of one side has no evaluation at its point"}
SEEDS_TABLE = "seeds.md"
"""The per-seed table, written beside the report and committed in git (study/seeds.md) so a
reader needs no DVC remote."""


def load_results(params: ExperimentParams, root: Path) -> list[RunResult]:
    """Every run of the study's plan, read from its folder."""
    return [RunResult.load(run, root / run_dir(params.study, run))
            for run in plan_runs(params.study)]


def _pts(iv: dict[str, float]) -> str:
    """`61.69 [60.10, 63.20]` in points, or `61.69` when the interval is undefined."""
    if math.isnan(iv["low"]):
        return f"{100 * iv['mean']:.2f}"
    return points(iv["mean"], iv["low"], iv["high"])


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def plateau_sentence(r: dict[str, Any]) -> str:
    """The warm-up's slope test, the evaluations as the unit (`brorl.study.warmup`)."""
    w = r["plateau"]
    if w is None or w.get("retest") is None:
        return ("The warm-up record (plateau.json and at least `window` validation "
                "evaluations) is missing: its slope test is unknown here.")
    v = w["retest"]
    t = v["test"]
    drift = (f"a drift of {100 * t['slope']:+.2f} points per study run ({w['budget_rollouts']} "
             f"rollouts; {100 * r['confidence']:.0f}% CI [{100 * t['ci_low']:+.2f}, "
             f"{100 * t['ci_high']:+.2f}], df {t['df']:.0f}) over its last {t['evaluations']} "
             f"validation evaluations (steps {v['steps'][0]}-{v['steps'][-1]}, the evaluations "
             f"as the unit), TOST p = {p_value(t['p_equivalence'])} against "
             f"+-{100 * w['margin']:.1f} points at level {v['level']:.4g}")
    ended = f"it stopped at step {w['steps']} ({w['stopped_by']} under its own rule)"
    if v["flat"]:
        return f"The warm-up's validation curve is shown flat: {drift}; {ended}."
    return (f"The warm-up's validation curve is not shown flat: {drift}; {ended}. The premise "
            "that matters is tested where the arms run (below).")


def _detect(c: dict[str, Any]) -> str:
    d = c.get("detectable", math.nan)
    return "-" if math.isnan(d) else f"{100 * d:.1f}"


def contrast_sentence(name: str, c: dict[str, Any], r: dict[str, Any]) -> str:
    """One contrast's numbers and reading in words, the detectable effect beside it."""
    what = c["about"] or name
    side = f"({c['b']} - {c['a']})"
    if c["reading"] == "not_reached":
        return f"{what} {side}: not estimated: {c['primary'].get('not_reached', '')}."
    t = c["primary"]["score"]["test"]
    k = c["primary"]["pass_at_k"]["test"]
    sec = c["secondary"]
    words = (f"{what} {side}, {c['family']}: {100 * t['delta']:+.2f} points on the hold-out, "
             f"{100 * r['confidence']:.0f}% t CI [{100 * t['ci_low']:+.2f}, "
             f"{100 * t['ci_high']:+.2f}] (df {t['df']:.1f}), p = {p_value(t['p_two_sided'])}")
    if c["family"] != "premise":
        words += f" (Holm within the {c['family']} family {p_value(c['p_holm'])})"
    if c["equivalence"]:
        words += (f", TOST within +-{100 * r['margin']:.1f} points p = "
                  f"{p_value(t['p_equivalence'])} (its power at no change "
                  f"{c.get('equivalence_power', math.nan):.2f})")
    words += (f": {WORDS[c['reading']]}. The design detects {_detect(c)} points with power "
              f"{r['power']:.0%} at level {c['detectable_level']:.3g}; pass@"
              f"{r['evaluation']['samples'].get('holdout', '')} {100 * k['delta']:+.2f} points "
              f"(p {p_value(k['p_two_sided'])})")
    if "not_reached" not in sec:
        st = sec["score"]["test"]
        words += (f"; full test split {100 * st['delta']:+.2f} points [{100 * st['ci_low']:+.2f}, "
                  f"{100 * st['ci_high']:+.2f}]")
    return words + "."


def verdict(r: dict[str, Any]) -> list[str]:
    """Plain sentences generated from the numbers (module docstring)."""
    order = sorted(r["contrasts"], key=lambda n: ("premise", "confirmatory", "exploratory")
                   .index(r["contrasts"][n]["family"]))
    lines = [contrast_sentence(name, r["contrasts"][name], r) for name in order]
    lines.append(plateau_sentence(r))
    for arm, v in r["revival"].items():
        if v["revives"]:
            lines.append(f"{arm} revives the plateau by the pre-registered rule: the premise "
                         f"is shown and {', '.join(v['contrasts'])} all read higher.")
        else:
            why = [] if v["premise_shown"] else ["the premise (no change of the baseline on "
                                                 "the hold-out) is not shown"]
            if v["not_higher"]:
                why.append(f"{', '.join(v['not_higher'])} do not read higher")
            lines.append(f"{arm} does not revive the plateau by the pre-registered rule: "
                         f"{'; '.join(why)}. An inconclusive contrast is no evidence of no "
                         "effect: effects below its detectable size stay open.")
    lines.append(f"What this does not show: anything beyond this tiny policy, its three "
                 f"generated task families, {r['max_response_tokens']}-token responses and "
                 f"{r['budget_rollouts']} rollouts per run.")
    return lines


def arms_table(r: dict[str, Any]) -> str:
    header = ["arm", "what it isolates", "N", "B", "LR", "ends at", "seeds", "RL steps",
              "RL steps at budget", "optimizer steps", f"rollouts at step {r['equal_steps']}",
              "keep rate %"]
    rows = []
    for name, a in r["arms"].items():
        end = f"budget and step {r['equal_steps']}" if a["stop"] == "rollouts" else \
            f"step {r['equal_steps']}"
        at_budget = a.get("steps_at_budget")
        rows.append([name, a["about"], a["N"], a["B"], f"{a['lr']:.3g}", end, len(a["runs"]),
                     f"{_mean(a['steps']):.1f}", f"{_mean(at_budget):.1f}" if at_budget else "-",
                     f"{_mean(a['optimizer_steps']):.0f}",
                     f"{_mean(a['rollouts_at_steps']):.0f}" if a["rollouts_at_steps"] else
                     "not reached", _pts(a["pass_rate"])])
    return markdown_table(header, "llrrrlrrrrrr", rows)


def _points_of(r: dict[str, Any], endpoint: str) -> list[tuple[str, dict[str, Any]]]:
    out = [(f"start ({r['start_replicates']} draws)", r["start"][endpoint])]
    for name, a in r["arms"].items():
        out += [(f"{name}@{p}", x) for p, x in a["at"][endpoint].items()]
    return out


def scores_table(r: dict[str, Any], endpoint: str) -> str:
    fams = ordered(set(r["start"][endpoint]["score"]) - {"overall"})
    ks = list(r["start"][endpoint]["pass_at"])
    top = ks[-1] if ks else None
    rows = [[label, *(_pts(x["score"][f]) for f in fams), _pts(x["score"]["overall"]),
             _pts(x["pass_at"][top]) if top else "-"] for label, x in _points_of(r, endpoint)]
    return markdown_table(["point", *fams, "overall avg@k", f"overall pass@{top}"],
                          "l" + "r" * (len(fams) + 2), rows)


def pass_at_table(r: dict[str, Any]) -> str:
    ks = list(r["start"]["primary"]["pass_at"])
    rows = [[label, *(f"{100 * x['pass_at'][k]['mean']:.2f}" for k in ks)]
            for label, x in _points_of(r, "primary")]
    return markdown_table(["point", *(f"pass@{k}" for k in ks)], "l" + "r" * len(ks), rows)


def contrasts_table(r: dict[str, Any]) -> str:
    header = ["contrast", "family", "b - a", "hold-out points [t CI]", "df", "p", "Holm p",
              "TOST p", "reading", "detectable", "pass@k points", "full test points [t CI]"]
    rows = []
    for name, c in r["contrasts"].items():
        if c["reading"] == "not_reached":
            rows.append([name, c["family"], f"{c['b']} - {c['a']}", "not reached", *["-"] * 4,
                         "not_reached", _detect(c), "-", "-"])
            continue
        t, k = c["primary"]["score"]["test"], c["primary"]["pass_at_k"]["test"]
        sec = "-" if "not_reached" in c["secondary"] else points(
            c["secondary"]["score"]["test"]["delta"], c["secondary"]["score"]["test"]["ci_low"],
            c["secondary"]["score"]["test"]["ci_high"], signed=True)
        rows.append([name, c["family"], f"{c['b']} - {c['a']}",
                     points(t["delta"], t["ci_low"], t["ci_high"], signed=True),
                     f"{t['df']:.1f}", p_value(t["p_two_sided"]), p_value(c["p_holm"]),
                     p_value(t["p_equivalence"]) if c["equivalence"] else "not read",
                     c["reading"], _detect(c), f"{100 * k['delta']:+.2f}", sec])
    return markdown_table(header, "lllrrrrrlrrr", rows)


def seeds_table(r: dict[str, Any]) -> str:
    """Per run: seed, steps, keep rate and the primary and secondary scores at each point."""
    header = ["run", "seed", "RL steps", "keep rate %", "point", "hold-out avg@k",
              "hold-out pass@k", "full test avg@k"]
    rows = []
    for i, row in enumerate(r["start"]["primary"]["score"]["overall"]["values"]):
        top = list(r["start"]["primary"]["pass_at"])[-1]
        rows.append(["start", f"draw {i}", 0, "-", "start", f"{100 * row:.2f}",
                     f"{100 * r['start']['primary']['pass_at'][top]['values'][i]:.2f}",
                     f"{100 * r['start']['secondary']['score']['overall']['values'][i]:.2f}"])
    for name, a in r["arms"].items():
        for point, x in a["at"]["primary"].items():
            top = list(x["pass_at"])[-1]
            sec = a["at"]["secondary"][point]["score"]["overall"]["values"]
            for j, run in enumerate(a["runs"]):
                rows.append([run, a["seeds"][j], a["steps"][j],
                             f"{100 * a['pass_rate']['values'][j]:.1f}", point,
                             f"{100 * x['score']['overall']['values'][j]:.2f}",
                             f"{100 * x['pass_at'][top]['values'][j]:.2f}",
                             f"{100 * sec[j]:.2f}"])
    return markdown_table(header, "lrrrlrrr", rows)


def pool_table(pool: dict[str, Any]) -> str:
    parts = [("train", "train prompts"), ("pool", "pool prompts"), ("holdout", "hold-out prompts")]
    parts = [(k, label) for k, label in parts if k in pool]
    rows = [[cells[0]["bin"], *(c["count"] for c in cells)]
            for cells in zip(*(pool[k]["histogram"] for k, _ in parts))]
    small, large = pool["n_small"], pool["n_large"]
    for key, label in ((f"keep_rate_n{small}", f"predicted pass rate at N = {small}"),
                       (f"keep_rate_n{large}", f"predicted pass rate at N = {large}"),
                       ("share_below_one_in_n", f"share solved in under 1 of {small} tries"),
                       ("share_rescued", f"share of groups all-wrong at N = {small}, not at "
                                         f"N = {large}"),
                       ("mean_pass", "mean pass rate")):
        rows.append([label, *(percent(pool[k][key], 1, "%") for k, _ in parts)])
    return markdown_table(["start pass rate", *(label for _, label in parts)],
                          "l" + "r" * len(parts), rows)


CAPTIONS = {
    "arms": "Table: per arm, counts are the MEAN OVER ITS SEEDS (runs); N, B and LR are the "
            "arm's settings; keep rate: kept / generated training rollouts, mean over seeds "
            "[t CI].",
    "scores": "Table: each score is the MEAN OVER SEEDS (start: over its draws) of each run's "
              "MEAN OVER INSTANCES (tasks pooled), {evaluation}, with the t interval over "
              "seeds; pass@k from the same samples (the unbiased estimator).",
    "pass_at": "Table: the hold-out's pass@k, unbiased estimator from the same samples, MEAN "
               "OVER SEEDS of the mean over instances: what N rollouts reach.",
    "contrasts": "Table: each difference is b - a of the per-seed means (a contrast with the "
                 "start: against its draws), the test and its t interval with SEEDS as the "
                 "unit (the interval excludes 0 exactly when p < {alpha}); Holm within the "
                 "family; detectable: the effect (points) the plan's design detects with "
                 "power {power} at the planned seeds.",
    "pool": "Table: COUNTS OF PROMPTS per bin of the start policy's estimated pass rate (its "
            "training rollouts, not an evaluation); the rows below are shares of prompts.",
    "seeds": "Table: every run at every point: the mean over the instances of the hold-out "
             "(primary) and of the full test split (secondary), in points.",
}
"""The statement above each table of `report.md`: what its figures average, over what unit, and
which evaluation (`{evaluation}`: `evaluation_words`)."""


def evaluation_words(r: dict[str, Any]) -> str:
    """`k = 64 samples per hold-out instance, 8 per test instance, temperature 0.6, top-p 0.95`."""
    e = r["evaluation"]
    per = ", ".join(f"{n} per {split} instance" for split, n in e["samples"].items())
    return f"k = {per}, temperature {e['temperature']:g}, top-p {e['top_p']:g}"


def markdown(r: dict[str, Any], names: dict[str, str]) -> str:
    counts = {e: ", ".join(f"{n} {f}" for f, n in c.items())
              for e, c in r["instances_per_family"].items()}
    caption = {k: v.format(evaluation=evaluation_words(r), alpha=f"{1 - r['confidence']:.2g}",
                           power=f"{r['power']:.0%}") for k, v in CAPTIONS.items()}
    text = [f"# Study {r['name']}", "",
            f"Every run continues the study's frozen start on its prompt pool. Primary endpoint: "
            f"the score on the {r['instances']['primary']} hold-out instances ({counts['primary']}),"
            f" drawn from the pool's difficulty band before the pool; secondary: the "
            f"{r['instances']['secondary']} instances of the full test split "
            f"({counts['secondary']}). Tests with seeds as the unit, {100 * r['confidence']:.0f}% "
            f"t intervals, Holm within each family; the TOST margin +-{100 * r['margin']:.1f} "
            "points.", "", "## Verdict", "",
            *[f"- {line}" for line in r["verdict"]], "",
            "## Arms", "", caption["arms"], "", arms_table(r), "",
            "## Scores on the hold-out (primary)", "", caption["scores"], "",
            scores_table(r, "primary"), "",
            "## pass@k on the hold-out", "", caption["pass_at"], "", pass_at_table(r), "",
            "## Scores on the full test split (secondary)", "", caption["scores"], "",
            scores_table(r, "secondary"), "",
            "## Contrasts (pre-registered)", "", caption["contrasts"], "", contrasts_table(r), "",
            f"![score vs rollouts]({names['rollouts']})",
            f"![score vs RL steps]({names['steps']})", ""]
    if r["pool"] is not None:
        text += ["## The prompt pool and the hold-out (the start policy's pass rates)", "",
                 caption["pool"], "", pool_table(r["pool"]), "", f"![pool]({names['pool']})", ""]
    if r.get("probe") is not None:
        text += ["## A real-model probe of the mechanism (exploratory)", "",
                 f"`python -m brorl.study.probe` ({probe.DEFAULT_OUT}, its checkpoint "
                 f"{r['probe'].get('checkpoint', '')}):", "", probe.render(r["probe"]), ""]
    text += ["## The warm-up", "", plateau_sentence(r), "", f"![warm-up]({names['warmup']})",
             "", "## Every seed", "", caption["seeds"], "", seeds_table(r), ""]
    return "\n".join(text)


def headline(r: dict[str, Any]) -> dict[str, Any]:
    """`metrics/study.json`: per contrast its family, difference with its t interval, df,
    p, Holm p, TOST p where read, reading, detectable effect and the per-seed values of both
    sides (`reached` 0 for a contrast not estimated); per arm the per-seed scores at each
    point, steps and keep rates; the start's draws; pool and hold-out sizes; the warm-up's slope
    test; the revival rule per arm. Values rounded to 4 decimals, p-values to 3 significant
    digits."""
    def p3(x: float) -> float:
        return float(f"{x:.3g}") if math.isfinite(x) else math.nan

    def r4(xs: list[float]) -> list[float]:
        return [round(x, 4) for x in xs]

    out: dict[str, Any] = {"contrasts": {}, "arms": {}}
    for name, c in r["contrasts"].items():
        if c["reading"] == "not_reached":
            out["contrasts"][name] = {"reached": 0, "family": c["family"]}
            continue
        t = c["primary"]["score"]["test"]
        row = {"reached": 1, "family": c["family"], "reading": c["reading"],
               "delta": round(t["delta"], 4), "ci_low": round(t["ci_low"], 4),
               "ci_high": round(t["ci_high"], 4), "df": round(t["df"], 2),
               "p": p3(t["p_two_sided"]), "p_holm": p3(c["p_holm"]),
               "detectable": c["detectable"],
               "pass_at_k_delta": round(c["primary"]["pass_at_k"]["test"]["delta"], 4),
               "a_values": r4(c["primary"]["score"]["a"]),
               "b_values": r4(c["primary"]["score"]["b"])}
        if c["equivalence"]:
            row["p_equivalence"] = p3(t["p_equivalence"])
        if "not_reached" not in c["secondary"]:
            row["test_split_delta"] = round(c["secondary"]["score"]["test"]["delta"], 4)
        out["contrasts"][name] = row
    for name, a in r["arms"].items():
        out["arms"][name] = {
            "seeds": a["seeds"], "steps": a["steps"], "keep_rate": r4(a["pass_rate"]["values"]),
            **{f"holdout_{p}": r4(x["score"]["overall"]["values"])
               for p, x in a["at"]["primary"].items()},
            **{f"test_{p}": r4(x["score"]["overall"]["values"])
               for p, x in a["at"]["secondary"].items()}}
    out["start"] = {"holdout": r4(r["start"]["primary"]["score"]["overall"]["values"]),
                    "test": r4(r["start"]["secondary"]["score"]["overall"]["values"])}
    if r["pool"] is not None:
        out["pool"] = {"prompts": r["pool"]["pool"]["prompts"],
                       "holdout": r["pool"].get("holdout", {}).get("prompts", 0)}
    w = r["plateau"]
    if w is not None and w.get("retest") is not None:
        t = w["retest"]["test"]
        out["warmup"] = {"flat": int(w["retest"]["flat"]), "drift": round(t["slope"], 4),
                         "p_equivalence": p3(t["p_equivalence"]), "df": t["df"],
                         "steps": w["steps"]}
    out["revives"] = {arm: int(v["revives"]) for arm, v in r["revival"].items()}
    return out


def write_headline(result: dict[str, Any], path: Path) -> None:
    """`headline(result)` as the DVC metrics file `path`."""
    atomic_write_text(path, json.dumps(headline(result), indent=2, sort_keys=True) + "\n")


def write_seeds(result: dict[str, Any], path: Path) -> None:
    """The per-seed table (`seeds_table`) as a Markdown file `path`."""
    atomic_write_text(path, f"# Study {result['name']}: every seed\n\n{CAPTIONS['seeds']}\n\n"
                      f"{seeds_table(result)}\n")


def start_rows(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Split -> the start's rows, one per draw (`brorl.study.start`)."""
    start = read_start(path)
    draws = start.get("replicates") or [start["rows"]]
    splits = {row["split"] for row in draws[0]}
    return {split: [row for rows in draws for row in rows if row["split"] == split]
            for split in splits}


def build_report(params: ExperimentParams, root: Path | str = ".") -> dict[str, Any]:
    """Read the runs, the start, the warm-up and the pool; write report.md, report.json,
    seeds.md and the PNGs under `study.out_dir`; return the report's numbers with the verdict."""
    root = Path(root)
    study = params.study
    out = root / study.out_dir
    results = load_results(params, root)
    start = start_rows(root / start_path(study))
    plateau = read_warmup(root / warmup_dir(params))
    if plateau is not None:  # the slope test of this plan, on the warm-up's curve as it is
        plateau["retest"] = plateau_test(read_evals(root / warmup_dir(params) / "evals.jsonl",
                                                    "validation"), study)
    pool_file = root / pool_dir(params) / POOL_FILE
    pool = json.loads(pool_file.read_text()) if pool_file.is_file() else None
    if pool is not None:  # the per-prompt estimates stay in pool.json
        pool = {k: v for k, v in pool.items() if k not in ("estimates", "pool_ids",
                                                            "holdout_ids")}
    report = analyse(params, results, start, plateau, pool)
    report["verdict"] = verdict(report)
    probe_file = root / probe.DEFAULT_OUT  # the real-model probe, when it has run
    report["probe"] = {k: v for k, v in json.loads(probe_file.read_text()).items()
                       if k != "seconds"} if probe_file.is_file() else None
    arms = {name: [r.on("holdout") for r in results if r.run.arm == name] for name in study.arms}
    figures.curves(arms, "rollouts", out / FIGURES["rollouts"], "rollouts generated")
    figures.curves(arms, "step", out / FIGURES["steps"], "RL steps (4 optimizer steps each)")
    figures.warmup(plateau, out / FIGURES["warmup"])
    figures.pool(pool, out / FIGURES["pool"])
    atomic_write_text(out / "report.md", markdown(report, FIGURES))
    write_seeds(report, out / SEEDS_TABLE)
    stable = {**report, "arms": {n: split_timings(a)[0] for n, a in report["arms"].items()}}
    atomic_write_text(out / "report.json", json.dumps(stable, indent=1) + "\n")
    write_timings(out / TIMINGS, {"arms": {n: split_timings(a)[1]
                                           for n, a in report["arms"].items()}})
    return report
