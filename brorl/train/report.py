"""A finished run's small result files for DVC: headline metrics (JSON) and the evaluation curve (CSV).

`headline` is what `dvc metrics show` prints for an arm: the last evaluation's score per family
and the rollouts spent (details: the run's `summary.json` and `evals.jsonl`). `eval_csv` has one row per
evaluation (step, rollouts, training seconds, pass@1 per family and their mean), the data of
`dvc plots`. Both come from the run's state (`brorl.train.run.RunState`) alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from brorl.train.checkpoint import atomic_write_text


def headline(state: Any) -> dict[str, float]:
    """What `dvc metrics show` prints for an arm: the last evaluation's score per family (the
    paper's: pass@1 for math and code, mean reward for reasoning) and the rollouts spent."""
    metrics: dict[str, float] = {}
    if state.evals:
        for family, row in sorted(state.evals[-1]["scores"]["family"].items()):
            metrics[family] = round(row["score"], 4)
    metrics["rollouts"] = float(state.rollouts)
    return metrics


def eval_csv(evals: list[dict[str, Any]]) -> str:
    """`step,rollouts,seconds,pass_at_1_<family>...,pass_at_1_mean`, one row per evaluation."""
    families = sorted(evals[-1]["scores"]["family"]) if evals else []
    lines = ["step,rollouts,seconds," + ",".join(f"pass_at_1_{f}" for f in families)
             + ",pass_at_1_mean"]
    for r in evals:
        passes = [r["scores"]["family"][f]["pass_at_1"] for f in families]
        mean = sum(passes) / len(passes) if passes else 0.0
        lines.append(f"{r['step']},{int(r['rollouts'])},{r['seconds']:.2f},"
                     + ",".join(f"{v:.4f}" for v in passes) + f",{mean:.4f}")
    return "\n".join(lines) + "\n"


def dvc_files(state: Any, metrics_path: Path, plot_path: Path) -> None:
    """Write the headline metrics JSON and the evaluation CSV, atomically."""
    atomic_write_text(metrics_path, json.dumps(headline(state), indent=2, sort_keys=True) + "\n")
    atomic_write_text(plot_path, eval_csv(state.evals))
