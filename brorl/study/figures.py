"""The study's PNG figures: score against rollouts and against training seconds per arm, the
N-sweep, the warm-up's validation curve, the live shrinkage diagnostics against rollouts.

Curves of several seeds: each run's curve (a family's mean per-instance score at each test
evaluation) is interpolated linearly onto a common grid (0 to the budget; 0 to the arm's
shortest final training time), then the mean over seeds is drawn as a line and the range over
seeds (min to max) as a band. Our choice; the intervals of the report are in its tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from brorl.study.results import FAMILIES, RunResult, families_of, values_of

PANELS = (*FAMILIES, "overall")


def family_means(row: dict[str, Any]) -> dict[str, float]:
    """Mean per-instance score of each family in an evaluation row, and over all instances."""
    values, families = list(values_of(row).values()), families_of(row)
    out = {f: float(np.mean([v for v, g in zip(values, families) if g == f]))
           for f in FAMILIES if f in families}
    out["overall"] = float(np.mean(values))
    return out


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curves(arms: dict[str, list[RunResult]], key: str, path: Path, label: str) -> Path:
    """Score per family (and overall) against `key` (`rollouts` or `seconds`), per arm."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.6), squeeze=False)
    for name, runs in arms.items():
        end = min(float(r.final[key]) for r in runs)
        grid = np.linspace(0.0, end, 41)
        for col, panel in enumerate(PANELS):
            ys = []
            for r in runs:
                xs = [float(e[key]) for e in r.evals]
                ys.append(np.interp(grid, xs,
                                    [family_means(e).get(panel, np.nan) for e in r.evals]))
            ys = np.array(ys)
            ax = axes[0][col]
            label_n = f"{name} (N={runs[0].run.rollouts_per_prompt}, {len(runs)} seeds)"
            line = ax.plot(grid, ys.mean(axis=0), label=label_n)[0]
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), alpha=0.2, color=line.get_color())
            ax.set_title(panel)
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out score (mean line, seed range)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


SHRINKAGE_PANELS = (
    ("diag/heldout/q_pos", "held-out Q_pos (mean ref. token prob.)"),
    ("diag/heldout/pct_improved_since_start", "% held-out ref. tokens above start"),
    ("diag/heldout/worst_drop_since_start", "worst held-out drop since start"),
    ("diag/unsolved/q_pos_delta", "unsolved prompts: Q_pos change per update"))
"""The live shrinkage diagnostics drawn against rollouts (`brorl.train.diagnostics`)."""


def shrinkage(arms: dict[str, list[RunResult]], path: Path) -> Path:
    """Each `SHRINKAGE_PANELS` metric against rollouts generated, per arm: the mean over seeds
    (each run interpolated onto a grid over the range all its runs' updates cover) and the seed
    range, as `curves` draws scores."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(SHRINKAGE_PANELS), figsize=(4 * len(SHRINKAGE_PANELS), 3.6),
                             squeeze=False)
    for name, runs in arms.items():
        for col, (key, title) in enumerate(SHRINKAGE_PANELS):
            series = [[(m["generate/rollouts_total"], m[key])
                       for m in r.summary.get("history", []) if key in m] for r in runs]
            series = [np.array(points) for points in series if points]
            ax = axes[0][col]
            if series:  # the common range of the runs' updates, so no run is extrapolated
                grid = np.linspace(max(p[0, 0] for p in series), min(p[-1, 0] for p in series), 41)
                ys = np.array([np.interp(grid, p[:, 0], p[:, 1]) for p in series])
                label = f"{name} (N={runs[0].run.rollouts_per_prompt}, {len(ys)} seeds)"
                line = ax.plot(grid, ys.mean(axis=0), label=label)[0]
                ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), alpha=0.2,
                                color=line.get_color())
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("rollouts generated")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


def sweep(points: list[dict[str, Any]], peak: dict[str, Any], path: Path) -> Path:
    """Score at the budget, pooled pass rate and rollouts/s against N (log scale), intervals."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    ns = [p["N"] for p in points]
    for ax, key, label in zip(axes, ("score", "pass_rate", "rollouts_per_s"),
                              ("score at the budget", "dynamic-sampling pass rate",
                               "generation rollouts/s")):
        mean = np.array([p[key]["mean"] for p in points])
        low = np.array([p[key]["low"] for p in points])
        high = np.array([p[key]["high"] for p in points])
        err = np.nan_to_num(np.vstack([mean - low, high - mean]))
        ax.errorbar(ns, mean, yerr=err, marker="o", capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("N (rollouts per prompt)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].axvline(peak["N"], color="grey", linestyle="--", label=f"peak N = {peak['N']}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


def warmup(curve: dict[str, Any], path: Path) -> Path:
    """The warm-up's validation score (mean over families) against its step, to the start."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    steps = [p["step"] for p in curve["points"]]
    ax.plot(steps, [p["score_mean"] for p in curve["points"]], marker="o")
    ax.axvline(curve["start_step"], color="grey", linestyle="--", label="study start")
    ax.set_xlabel("warm-up step")
    ax.set_ylabel("validation score (mean of families)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, plt, path)


def placeholder(text: str, path: Path) -> Path:
    """A figure that says why there is nothing to draw (DVC expects every declared output)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 2))
    ax.text(0.5, 0.5, text, ha="center", va="center")
    ax.set_axis_off()
    return _save(fig, plt, path)


def _save(fig, plt, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
