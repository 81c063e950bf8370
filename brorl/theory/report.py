"""Simulator outputs: seed merging, the results table, curve files and the Fig.-3-style figure.

Pure file writers (matplotlib's Agg backend, csv, json); nothing here knows about MLflow or DVC.
The figure mirrors BroRL Fig. 3 (§4.1): Q_pos, % of correct tokens improved and worst drop
against step, one line per N (mean over seeds, shaded +-1 std).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

from brorl.runs.files import atomic_write_text
from brorl.theory.simulator import METRICS, SimulationResult, summarize

PANELS = (("q_pos", "Correct prob. mass Q_pos"), ("pct_improved", "% correct tokens improved"),
          ("worst_drop", "Worst drop min(p_i(t) - p_i(0)), i in P"))
PANELS_KEYS = tuple(key for key, _ in PANELS)


def _at_step(result: SimulationResult, metric: str, step: int) -> tuple[float, float]:
    col = int((result.steps == step).nonzero()[0, 0])
    mean, std = summarize(result, metric)
    return float(mean[col]), float(std[col])


def summary_metrics(results: Sequence[SimulationResult], steps: Sequence[int]) -> dict:
    """Nested dict N -> step -> metric -> {mean, std}, for `metrics/simulate.json`."""
    return {
        f"N={r.rollouts}": {
            f"step_{s}": {m: dict(zip(("mean", "std"), _at_step(r, m, s))) for m in PANELS_KEYS}
            for s in steps
        }
        for r in results
    }


def headline(results: Sequence[SimulationResult]) -> dict[str, float]:
    """`q_pos_gain`: Q_pos at the last step, largest N minus smallest N (mean over seeds): how
    much broader sampling keeps of the correct mass (BroRL §4.1, Fig. 3 left). Named apart from
    the comparison's `delta` (a score difference), so `dvc metrics show` gives each its column."""
    ordered = sorted(results, key=lambda r: r.rollouts)
    last = int(ordered[0].steps[-1])
    small, large = (_at_step(r, "q_pos", last)[0] for r in (ordered[0], ordered[-1]))
    return {"q_pos_gain": round(float(large - small), 4)}


def results_table(results: Sequence[SimulationResult], steps: Sequence[int]) -> str:
    """Markdown table: one row per N, a 'Q_pos / % improved / worst drop' cell per step (means)."""
    seeds = len(results[0].seeds) if results else 0
    head = "| N | " + " | ".join(f"step {s}" for s in steps) + " |"
    rule = "|---|" + "---|" * len(steps)
    rows = []
    for r in results:
        cells = []
        for s in steps:
            q, qs = _at_step(r, "q_pos", s)
            imp, imps = _at_step(r, "pct_improved", s)
            worst, _ = _at_step(r, "worst_drop", s)
            cells.append(f"{q:.4f}±{qs:.4f} / {imp:.1f}%±{imps:.1f} / {worst:+.1e}")
        rows.append(f"| {r.rollouts} | " + " | ".join(cells) + " |")
    note = (f"Each cell: Q_pos / % correct tokens improved / worst drop, mean ± std over "
            f"{seeds} seeds (worst drop: mean).")
    return "\n".join([head, rule, *rows, "", note]) + "\n"


def write_curves(results: Sequence[SimulationResult], out_dir: Path) -> dict[str, Path]:
    """Long-format CSV (one row per N, step; seed means and stds) and the same as JSON."""
    rows = []
    for r in results:
        stats = {m: summarize(r, m) for m in METRICS}
        for col, step in enumerate(r.steps.tolist()):
            row: dict[str, float | int] = {"rollouts": r.rollouts, "step": step}
            for m, (mean, std) in stats.items():
                row[m] = float(mean[col])
                row[f"{m}_std"] = float(std[col])
            rows.append(row)
    csv_path, json_path = out_dir / "curves.csv", out_dir / "curves.json"
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(csv_path, text.getvalue())
    atomic_write_text(json_path, json.dumps(rows, allow_nan=True))
    return {"csv": csv_path, "json": json_path}


def plot_figure(results: Sequence[SimulationResult], path: Path) -> Path:
    """Three-panel PNG like the paper's Fig. 3, one line per N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    for ax, (metric, title) in zip(axes, PANELS):
        for r in results:
            mean, std = summarize(r, metric)
            steps = r.steps.numpy()
            ax.plot(steps, mean.numpy(), label=f"N={r.rollouts}")
            ax.fill_between(steps, (mean - std).numpy(), (mean + std).numpy(), alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[2].axhline(0.0, color="black", linewidth=0.8)
    axes[0].legend(title="rollouts per step")
    seeds = len(results[0].seeds) if results else 0
    fig.suptitle(f"Token-level simulator (BroRL §4.1): mean ± std over {seeds} seeds")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
