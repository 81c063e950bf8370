"""The study's PNG figures: the overall score against rollouts and against RL steps per arm, the
warm-up's validation curve with its slope window, the start's pass-rate histogram.

Curves of several seeds: each run's curve (its mean per-instance score at each test evaluation)
is interpolated linearly onto a common grid (0 to the arm's shortest run), then the mean over
seeds is drawn as a line and the range over seeds (min to max) as a band. Our choice; the
intervals of the report are in its tables. A figure with nothing to draw says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from brorl.study.results import RunResult


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curves(arms: dict[str, list[RunResult]], key: str, path: Path, label: str) -> Path:
    """Overall test score (points) against `key` (`rollouts` or `step`), per arm."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, runs in arms.items():
        end = min(float(r.final[key]) for r in runs)
        grid = np.linspace(0.0, end, 41)
        ys = np.array([np.interp(grid, [float(e[key]) for e in r.evals],
                                 [100 * float(np.mean(e["score"])) for e in r.evals])
                       for r in runs])
        line = ax.plot(grid, ys.mean(axis=0), label=f"{name} ({len(runs)} seeds)")[0]
        ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), alpha=0.2, color=line.get_color())
    ax.set_xlabel(label)
    ax.set_ylabel("test score, points (mean line, seed range)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


def warmup(record: dict[str, Any] | None, path: Path) -> Path:
    """The warm-up's validation score (points) against rollouts, its slope window marked."""
    if record is None or not record.get("curve"):
        return placeholder("no warm-up record", path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    curve = record["curve"]
    ax.plot([p["rollouts"] for p in curve], [100 * p["score"] for p in curve], marker="o")
    verdict = record.get("verdict")
    if verdict is not None:
        x = np.array(verdict["rollouts"], dtype=float)
        slope = verdict["test"]["slope"] / record["budget_rollouts"]  # score per rollout
        centre = np.mean(verdict["scores"])
        ax.plot(x, 100 * (centre + slope * (x - x.mean())), color="grey", linestyle="--",
                label=f"slope window ({'flat' if record['plateaued'] else 'not shown flat'})")
        ax.legend(fontsize=8)
    ax.set_xlabel("warm-up rollouts")
    ax.set_ylabel("validation score, points")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, plt, path)


def pool(record: dict[str, Any] | None, path: Path) -> Path:
    """Histogram of the start's estimated pass rates: the train split and the pool."""
    if record is None:
        return placeholder("no pool record", path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    bins = [b["bin"] for b in record["train"]["histogram"]]
    x = np.arange(len(bins))
    for offset, (key, label) in zip((-0.2, 0.2), (("train", "train split"), ("pool", "pool"))):
        ax.bar(x + offset, [b["count"] for b in record[key]["histogram"]], width=0.4, label=label)
    ax.set_xticks(x, bins, rotation=30, fontsize=7)
    ax.set_xlabel("start policy's estimated pass rate")
    ax.set_ylabel("prompts")
    ax.legend(fontsize=8)
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
