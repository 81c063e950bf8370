"""The eval record: one row per (step, split) of a run's held-out evaluations, and its metrics.

`RunState.evals` and `<run_dir>/evals.jsonl` hold these rows (`eval_record`):
{"step", "split" ("test" | "validation"), "seconds" (training seconds so far, evaluation and
checkpoints excluded), "rollouts" (generated so far), "scores" (`brorl.evaluate.score_rewards`
with k_values (1, k), k = samples per instance), "problem_ids", "families", "pass_at_1" (per
instance: the share of its k samples that are correct, avg@k), "score" (per instance: the
family's headline quantity, `brorl.evaluate.HEADLINE`, spec §7.1)}. Rows without "split" (older
files) count as test rows.

`eval_metrics` names a row's figures: test rows `eval/<q>_<family>` (q: pass_at_1, pass_at_<k>,
reward_mean, score), `eval/score_mean` (the mean over families of the family score) and
`eval/pass_at_1_mean`; validation rows the same names under `val/`. Model selection and the
plateau rule read `val/score_mean` only, never a test figure (issue: selection bias).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from brorl.evaluate import evaluate_policy, instance_scores
from brorl.types import Problem

PREFIX = {"test": "eval", "validation": "val"}
"""Metric prefix of each evaluated split."""
SELECTION_METRIC = "val/score_mean"
"""The one figure the plateau rule and the best evaluation follow."""


def row_split(row: dict[str, Any]) -> str:
    """The split of an eval row; rows written before splits existed are test rows."""
    return row.get("split", "test")


def rows_by_step(rows: Sequence[dict[str, Any]], split: str = "test") -> list[dict[str, Any]]:
    """The rows of `split`, the last one of each step winning (an older file may repeat a
    step), ordered by step."""
    last = {r["step"]: r for r in rows if row_split(r) == split}
    return [last[step] for step in sorted(last)]


def read_evals(path: str | Path, split: str = "test") -> list[dict[str, Any]]:
    """`rows_by_step` of an `evals.jsonl` file."""
    lines = Path(path).read_text().splitlines()
    return rows_by_step([json.loads(line) for line in lines if line.strip()], split)


def read_run(folder: str | Path, missing: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A finished run folder's `summary.json` and its test rows by step (`read_evals`).

    `missing` ends the error when a file is absent (how to produce it); a folder without test
    rows is refused (its run must evaluate the test split)."""
    folder = Path(folder)
    for name in ("summary.json", "evals.jsonl"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} is missing: {missing}")
    rows = read_evals(folder / "evals.jsonl", "test")
    if not rows:
        raise ValueError(f"{folder / 'evals.jsonl'} has no test rows: the run must evaluate the "
                         'test split (train.eval_splits must include "test").')
    return json.loads((folder / "summary.json").read_text()), rows


def eval_record(step: int, split: str, seconds: float, rollouts: int,
                problems: Sequence[Problem], scores: dict[str, Any],
                rewards: np.ndarray) -> dict[str, Any]:
    """One eval row (see the module docstring) from `evaluate_policy`'s scores and rewards."""
    per = instance_scores(problems, rewards)
    return {"step": step, "split": split, "seconds": seconds, "rollouts": rollouts,
            "scores": scores, "problem_ids": [p.id for p in problems],
            "families": [p.family for p in problems], "pass_at_1": per["pass_at_1"],
            "score": per["score"]}


def score_policy(model, tokenizer, problems: Sequence[Problem], *, split: str, samples: int,
                 temperature: float, top_p: float, max_new_tokens: int, seed: int,
                 workers: int | None, step: int = 0, seconds: float = 0.0,
                 rollouts: int = 0) -> dict[str, Any]:
    """The eval row of a policy: `samples` samples of each instance (avg@k, pass@k beside pass@1)
    under one seed; the run's evaluations and the `evaluate` flow both score through here."""
    scores, rewards = evaluate_policy(
        model, tokenizer, problems, n=samples, k_values=sorted({1, samples}),
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
        workers=workers)
    return eval_record(step, split, seconds, rollouts, problems, scores, rewards)


def read_start(path: str | Path) -> dict[str, Any]:
    """A start evaluation scored once for several runs from one policy: `{"protocol":
    Run.eval_protocol(), "rows": [eval rows of step 0]}` (`brorl.study.start`,
    `Run.train(start=)`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: score the start first (the study's "
                                "study_start stage, python -m flows.study --start).")
    start = json.loads(path.read_text())
    if set(start) != {"protocol", "rows"} or any(r["step"] != 0 for r in start["rows"]):
        raise ValueError(f"{path}: not a start evaluation (protocol and step-0 rows); score it "
                         "again (python -m flows.study --start).")
    return start


def eval_metrics(row: dict[str, Any]) -> dict[str, float]:
    """`<prefix>/<q>_<family>`, `<prefix>/score_mean` and `<prefix>/pass_at_1_mean` of a row."""
    prefix = PREFIX[row_split(row)]
    families = row["scores"]["family"]
    metrics = {f"{prefix}/{q}_{fam}": v for fam, fam_row in families.items()
               for q, v in fam_row.items()
               if q in ("reward_mean", "score") or q.startswith("pass_at_")}
    for q in ("score", "pass_at_1"):
        values = [fam_row[q] for fam_row in families.values()]
        metrics[f"{prefix}/{q}_mean"] = sum(values) / len(values) if values else math.nan
    return metrics


def evals_jsonl(rows: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)
