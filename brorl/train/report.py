"""A run's reports: the one human line per step, and a finished run's small result files for DVC:
headline metrics (JSON) and the evaluation curve (CSV).

`step_line` is what `python -m brorl.train` prints and the flow logs after each step.

`write_summary` writes the run's `summary.json` (`summary_record`) and, beside the run's folder,
the conditions of the machine that made it (`brorl.runs.machine`).

`headline` is what `dvc metrics show` prints for an arm: the last test evaluation's score per
family (`math`, `code`, `reasoning`), the last validation evaluation's as `val_<family>` (a
validation-only run such as the warm-up has only these), and the rollouts spent (details: the
run's `summary.json` and `evals.jsonl`). `eval_csv` has one row per evaluation of one split
(test when the run scored it, else validation): step, rollouts, the family scores and pass@1 and
their means, the data of `dvc plots`; no seconds (git tracks the file: a rerun that gives the same
scores must leave it unchanged; an evaluation's seconds are in the run's timings file and MLflow).
Both read the run's state (`brorl.train.state.RunState`) alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from brorl.evaluation.protocol import SELECTION_METRIC, row_split
from brorl.runs.files import atomic_write_text, checkout_relative
from brorl.runs.timings import split_timings


def _rows(evals: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    return [r for r in evals if row_split(r) == split]


def headline(state: Any) -> dict[str, float]:
    """What `dvc metrics show` prints for an arm: the last test (and validation, prefixed
    `val_`) evaluation's score per family (the paper's: pass@1 for math and code, mean reward
    for reasoning) and the rollouts spent."""
    metrics: dict[str, float] = {}
    for split, prefix in (("test", ""), ("validation", "val_")):
        rows = _rows(state.evals, split)
        if rows:
            for family, row in sorted(rows[-1]["scores"]["family"].items()):
                metrics[prefix + family] = round(row["score"], 4)
    metrics["rollouts"] = float(state.rollouts)
    return metrics


def eval_csv(evals: list[dict[str, Any]]) -> str:
    """`step,rollouts,split,score_<family>...,score_mean,pass_at_1_<family>...,pass_at_1_mean`,
    one row per evaluation of the test split (the validation split when the run
    scored no test rows)."""
    rows = _rows(evals, "test") or _rows(evals, "validation")
    families = sorted(rows[-1]["scores"]["family"]) if rows else []
    columns = [f"{q}_{f}" for q in ("score", "pass_at_1") for f in [*families, "mean"]]
    lines = ["step,rollouts,split," + ",".join(columns)]
    for r in rows:
        cells = []
        for q in ("score", "pass_at_1"):
            values = [r["scores"]["family"][f][q] for f in families]
            cells += [*values, sum(values) / len(values) if values else 0.0]
        lines.append(f"{r['step']},{int(r['rollouts'])},{row_split(r)},"
                     + ",".join(f"{v:.4f}" for v in cells))
    return "\n".join(lines) + "\n"


def summary_record(summary: dict[str, Any], history: list[dict[str, Any]],
                   root: str | Path) -> dict[str, Any]:
    """What `<run_dir>/summary.json` holds: the run's summary (`Run.finish`) without its
    wall-clock figures, the `history` given (the state's, without them), and its checkpoint
    and policy paths from the checkout `root`."""
    return {**split_timings(summary)[0], "history": history,
            "checkpoint": checkout_relative(summary["checkpoint"], root),
            "policy": checkout_relative(summary["policy"], root)}


def write_summary(run_dir: Path, summary: dict[str, Any], history: list[dict[str, Any]],
                  root: str | Path) -> None:
    """`<run_dir>/summary.json` (`summary_record`) and `<run_dir>.machine.json`
    (`brorl.runs.machine.write_machine`: what else than the seed and params decided the run)."""
    from brorl.runs.machine import write_machine

    record = summary_record(summary, history, root)
    atomic_write_text(run_dir / "summary.json", json.dumps(record, indent=1) + "\n")
    write_machine(run_dir)


def dvc_files(state: Any, metrics_path: Path, plot_path: Path) -> None:
    """Write the headline metrics JSON and the evaluation CSV, atomically."""
    atomic_write_text(metrics_path, json.dumps(headline(state), indent=2, sort_keys=True) + "\n")
    atomic_write_text(plot_path, eval_csv(state.evals))


def step_line(name: str, step: int, m: dict[str, float]) -> str:
    """One human line per step: reward, pass rate, throughput, held-out scores when evaluated
    (test per family, validation mean)."""
    parts = [f"{name} step {step}"]
    if "generate/rollouts" in m:
        parts.append(f"{m['generate/rollouts_per_s']:.0f} rollouts/s "
                     f"({int(m['generate/rollouts'])} rollouts, "
                     f"{int(m['generate/rollouts_total'])} total)")
        parts.append(f"reward {m['verify/reward_mean']:.3f}")
        parts.append(f"pass rate {100 * m['filter/pass_rate']:.0f}%")
    scores = [f"{k.removeprefix('eval/score_')} {v:.2f}" for k, v in sorted(m.items())
              if k.startswith("eval/score_") and k != "eval/score_mean"]
    if scores:
        parts.append("test score " + " ".join(scores))
    if SELECTION_METRIC in m:
        parts.append(f"validation score {m[SELECTION_METRIC]:.3f}")
    if "perf/tokens_per_s" in m:
        busy = (f"update {m['perf/tokens_per_s']:.0f} tokens/s, "
                f"padding {100 * m['perf/padding_share']:.0f}%")
        if "perf/mfu" in m:
            busy += f", MFU {100 * m['perf/mfu']:.0f}%"
        parts.append(busy)
    if "time/iteration" in m:
        parts.append(f"{m['time/iteration']:.1f} s")
    return " | ".join(parts)
