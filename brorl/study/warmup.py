"""The study's warm-up: ProRL from `train.init_checkpoint` (the base) until its validation curve
is shown flat, or a cap (the paper starts BroRL from a model that plateaued under ProRL, BroRL
§4.2.1, Fig. 1).

"Flat" is an equivalence test, not the absence of a significant slope: over the last
`study.warmup.window` validation evaluations (>= 5, on >= 300 instances), the least-squares
line through the per-evaluation mean scores against rollouts (`brorl.evaluation.stats.evaluation_slope_test`:
the evaluations are the unit, df = window - 2; the instances of one evaluation share its policy
and are no independent replicates of the slope) shows by TOST that the drift over one study run
(slope x `study.budget_rollouts`) lies within +-`study.warmup.margin`, at `study.alpha` divided
by the number of tests the warm-up may run (`StudyWarmup.looks`: stopping at the first pass
would otherwise inflate a false "flat"). The warm-up runs `warmup.eval_every` steps at a time
(`brorl.train.Run.train(max_steps=)`: the run's own loop, evaluations, checkpoints and resume)
and tests after each evaluation; it stops when the test passes or at `warmup.max_steps`, and
`plateau.json` records which (a capped warm-up is reported as not shown plateaued).
`plateau_test` also gives the instances-as-unit slope test beside it (`slope_test`), as a
record of what the earlier plan tested.

The warm-up trains on the pipeline's whole train split with the baseline arm's shape (the
study's recipe); the pool (`brorl.study.pool`) is chosen afterwards at its final policy.

Deliberately ignored: test instances (the stop is chosen on validation only), early stopping on
anything but this test.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from brorl.evaluation.protocol import read_evals
from brorl.evaluation.stats import evaluation_slope_test, slope_test
from brorl.runs.files import atomic_write_text

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.params.study import StudyParams
    from brorl.train import Driver, Run

PLATEAU_FILE = "plateau.json"


def plateau_test(rows: list[dict[str, Any]], study: StudyParams) -> dict[str, Any] | None:
    """The slope test over the last `warmup.window` validation rows (module docstring); None
    before there are that many. Rollouts are in units of the study's budget, so the slope is the
    score drift over one study run."""
    w = study.warmup
    if len(rows) < w.window:
        return None
    last = rows[-w.window:]
    ids = last[0]["problem_ids"]
    if len(ids) < w.min_instances:
        raise ValueError(f"the warm-up's validation evaluations hold {len(ids)} instances; the "
                         f"plateau test needs >= {w.min_instances} (study.warmup.min_instances): "
                         "raise study.warmup.eval_per_family or use more validation data.")
    table = np.array([[dict(zip(r["problem_ids"], r["score"]))[i] for i in ids] for r in last])
    x = np.array([r["rollouts"] for r in last], dtype=float) / study.budget_rollouts
    test = evaluation_slope_test(table.mean(axis=1), x, margin=w.margin, alpha=study.alpha,
                                 instances=len(ids))
    level = study.alpha / w.looks
    return {"flat": bool(test.p_equivalence < level), "level": level, "unit": "evaluations",
            "test": asdict(test),
            "instances_as_unit": asdict(slope_test(table, x, margin=w.margin, alpha=study.alpha)),
            "steps": [r["step"] for r in last], "rollouts": [r["rollouts"] for r in last],
            "scores": table.mean(axis=1).tolist()}


def validation_rows(run: Run) -> list[dict[str, Any]]:
    """The run's validation rows, by step."""
    return [r for r in sorted(run.state.evals, key=lambda r: r["step"])
            if r.get("split") == "validation"]


def train_to_plateau(run: Run, study: StudyParams, driver: Driver | None = None) -> dict[str, Any]:
    """Train `run` (the warm-up, `brorl.study.plan.warmup_params`) `warmup.eval_every` steps at a time until
    `plateau_test` passes or the run reaches `warmup.max_steps`; the verdict with `stopped_by`
    ("flat" or "cap") and the steps and rollouts run."""
    w = study.warmup
    while True:
        verdict = plateau_test(validation_rows(run), study)
        if verdict is not None and verdict["flat"]:
            stopped_by = "flat"
            break
        if run.step_count >= w.max_steps:
            stopped_by = "cap"
            break
        run.train(driver, max_steps=w.eval_every)
    return {"stopped_by": stopped_by, "plateaued": stopped_by == "flat", "steps": run.step_count,
            "rollouts": run.state.rollouts, "margin": w.margin, "window": w.window,
            "budget_rollouts": study.budget_rollouts, "alpha": study.alpha,
            "verdict": verdict}


def frozen_warmup(params: ExperimentParams, root: Path) -> dict[str, Any] | None:
    """The frozen warm-up's plateau record (`brorl.study.frozen`: reused, never trained again),
    None when the warm-up is not frozen; a ValueError when frozen but missing or changed."""
    from brorl.study.frozen import check
    from brorl.study.plan import warmup_dir

    if not check(params, root, "warmup"):
        return None
    return json.loads((root / warmup_dir(params) / PLATEAU_FILE).read_text())


def write_plateau(folder: Path, record: dict[str, Any]) -> Path:
    """`<folder>/plateau.json`."""
    path = folder / PLATEAU_FILE
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    return path


def read_warmup(folder: Path) -> dict[str, Any] | None:
    """The warm-up's plateau record and validation curve (step, rollouts, mean instance score),
    or None when the folder holds neither."""
    path, evals = folder / PLATEAU_FILE, folder / "evals.jsonl"
    if not path.is_file() or not evals.is_file():
        return None
    rows = read_evals(evals, "validation")
    return {**json.loads(path.read_text()),
            "curve": [{"step": r["step"], "rollouts": r["rollouts"],
                       "score": float(np.mean(r["score"]))} for r in rows]}
