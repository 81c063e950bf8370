"""The ProRL-vs-BroRL report: the paper's Table 1 and Table 2 layouts, a paired test, two plots.

Inputs are each arm's run outputs: `summary.json` (per-step metrics) and `evals.jsonl` (one line
per held-out evaluation: step, seconds, rollouts, per-family scores, per-instance pass@1 over the
same problem ids). Table 1 (spec §5.1): for each evaluation, steps, wall time, rollouts and
pass@1 per family. Table 2 (spec §5.5): N, prompts per step, the dynamic-sampling pass rate and
generation throughput. The paired test compares the arms' last evaluations instance by instance
(`brorl.evaluate.paired_comparison`, spec §5.3: the paper uses a paired t-test).

Deliberately ignored: confidence bands over seeds (one seed per arm on CPU).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brorl.evaluate import paired_comparison

FAMILIES = ("math", "code", "reasoning")


@dataclass(frozen=True)
class ArmResult:
    """One arm's outputs, read from its run folder."""

    name: str
    summary: dict[str, Any]
    evals: list[dict[str, Any]]

    @classmethod
    def load(cls, name: str, run_dir: str | Path) -> ArmResult:
        run_dir = Path(run_dir)
        summary_path, evals_path = run_dir / "summary.json", run_dir / "evals.jsonl"
        for path in (summary_path, evals_path):
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: train arm {name!r} first "
                                        "(python -m flows.train, or the compare flow).")
        evals = [json.loads(line) for line in evals_path.read_text().splitlines() if line.strip()]
        last = {}
        for record in evals:  # one record per step (a resumed run rewrites the file from its state)
            last[record["step"]] = record
        return cls(name, json.loads(summary_path.read_text()), [last[k] for k in sorted(last)])

    def mean_metric(self, key: str) -> float:
        values = [m[key] for m in self.summary["history"] if key in m and m.get("train/step", 0) > 0]
        return sum(values) / len(values) if values else math.nan


def _pass(record: dict, family: str) -> float:
    return record["scores"]["family"].get(family, {}).get("pass_at_1", math.nan)


def table1(arms: list[ArmResult]) -> str:
    """Markdown: pass@1 per family at each evaluation, with steps, time and rollouts."""
    lines = ["| arm | step | time (s) | rollouts | " + " | ".join(f.capitalize() for f in FAMILIES)
             + " |", "|---|---:|---:|---:|" + "---:|" * len(FAMILIES)]
    for arm in arms:
        for r in arm.evals:
            cells = " | ".join(f"{100 * _pass(r, f):.2f}" for f in FAMILIES)
            lines.append(f"| {arm.name} | {r['step']} | {r['seconds']:.1f} | {int(r['rollouts'])} "
                         f"| {cells} |")
    return "\n".join(lines)


def table2(arms: list[ArmResult]) -> str:
    """Markdown: N, B, pass rate and throughput per arm (means over the arm's steps)."""
    lines = ["| arm | N | prompts/step | pass rate | rollouts/s | tokens/s | s/step |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for arm in arms:
        lines.append(
            f"| {arm.name} | {arm.summary.get('rollouts_per_prompt', '?')} "
            f"| {arm.summary.get('prompts_per_step', '?')} "
            f"| {100 * arm.mean_metric('filter/pass_rate'):.1f}% "
            f"| {arm.mean_metric('generate/rollouts_per_s'):.1f} "
            f"| {arm.mean_metric('generate/tokens_per_s'):.0f} "
            f"| {arm.mean_metric('train/seconds'):.2f} |")
    return "\n".join(lines)


def paired(a: ArmResult, b: ArmResult) -> dict[str, Any]:
    """Paired t-test of b over a on their last evaluations' common instances."""
    ea, eb = a.evals[-1], b.evals[-1]
    scores_a = dict(zip(ea["problem_ids"], ea["pass_at_1"]))
    scores_b = dict(zip(eb["problem_ids"], eb["pass_at_1"]))
    common = [i for i in ea["problem_ids"] if i in scores_b]
    result = paired_comparison([scores_a[i] for i in common], [scores_b[i] for i in common])
    return {"baseline": a.name, "arm": b.name, "instances": result.n, "delta": result.delta,
            "t": result.t, "p_one_tailed": result.p_one_tailed}


def plot(arms: list[ArmResult], path: Path) -> Path:
    """Pass@1 per family against wall time (top row) and against rollouts (bottom row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(FAMILIES), figsize=(4 * len(FAMILIES), 6.5), squeeze=False)
    for col, family in enumerate(FAMILIES):
        for row, (x_key, x_label) in enumerate((("seconds", "training time (s)"),
                                                ("rollouts", "rollouts generated"))):
            ax = axes[row][col]
            for arm in arms:
                ax.plot([r[x_key] for r in arm.evals], [_pass(r, family) for r in arm.evals],
                        marker="o", label=arm.name)
            ax.set_xlabel(x_label)
            ax.set_ylabel(f"{family} pass@1")
            ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("ProRL vs BroRL: held-out pass@1 (same start, equal budget)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build_report(arms: list[ArmResult], out_dir: str | Path) -> dict[str, Any]:
    """Write `report.md`, `report.json` and `pass_at_1.png` under `out_dir`; return the JSON."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    test = paired(arms[0], arms[-1]) if len(arms) >= 2 else None
    figure = plot(arms, out_dir / "pass_at_1.png")
    final = {arm.name: {f: _pass(arm.evals[-1], f) for f in FAMILIES} for arm in arms}
    text = [
        "# ProRL vs BroRL", "",
        "Both arms start from the same checkpoint with an equal budget. Pass@1 in percent on the "
        "same held-out instances (Table 1 layout, spec §5.1).", "",
        table1(arms), "",
        "## Dynamic-sampling pass rate and generation throughput (Table 2 layout, spec §5.5)", "",
        table2(arms), "",
    ]
    if test is not None:
        text += ["## Paired test on the last evaluation", "",
                 f"{test['arm']} - {test['baseline']} over {test['instances']} instances: "
                 f"mean difference {test['delta']:+.4f} pass@1, t = {test['t']:.3f}, "
                 f"one-tailed p = {test['p_one_tailed']:.4f}.", ""]
    text += [f"![pass@1]({figure.name})", ""]
    (out_dir / "report.md").write_text("\n".join(text))
    report = {"final_pass_at_1": final, "paired_test": test,
              "arms": {a.name: {k: a.summary[k] for k in ("steps", "rollouts", "train_seconds",
                                                          "stopped_by") if k in a.summary}
                       for a in arms},
              "pass_rate": {a.name: a.mean_metric("filter/pass_rate") for a in arms},
              "rollouts_per_s": {a.name: a.mean_metric("generate/rollouts_per_s") for a in arms}}
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, allow_nan=True) + "\n")
    return report
