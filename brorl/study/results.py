"""A study's finished runs read from their folders: test evaluations at the study's points,
per-instance values, pooled rates.

Each run folder holds `summary.json` (per-step metrics in `history`) and `evals.jsonl`, one row per
(step, split: the hold-out, the study's primary endpoint, and the full test split, `RunResult.on`) with per-instance `score` (the family's headline quantity: pass@1 for math and code,
mean reward for reasoning, ProRL (arXiv 2505.24864) §3.4), `pass_at_1` (avg@k: the share of the k
samples that are correct) and `families`, in `problem_ids` order. A run is scored at three points:
`start` (step 0, the shared start evaluation), `steps` (the row at `study.equal_steps`) and `budget`
(the row at exactly `study.budget_rollouts` rollouts, for an arm that stops on rollouts: the step
that spent the budget, evaluated whether or not the run went on to `equal_steps`).

Per instance, `values_of(row, "pass_at_k")` is pass@k with k = the row's samples: 1 when any sample
was correct (the unbiased estimator with n = k), beside avg@k (BroRL App. D reports avg@16 as
pass@1; ProRL (arXiv 2505.24864) §4 reports pass@k).

Pooled rates (BroRL §4.2.4, Table 2) are `brorl.evaluation.reporting.RunRecord`'s, as in the comparison.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from brorl.evaluation.protocol import read_evals, read_run
from brorl.evaluation.reporting import RunRecord
from brorl.evaluation.scoring import pass_at_k
from brorl.study.plan import StudyRun

METRICS = ("score", "pass_at_k")
"""The per-instance values the report compares: the family score (avg@k) and pass@k."""


def families_of(row: dict[str, Any]) -> list[str]:
    return row.get("families") or [i.split("/")[0] for i in row["problem_ids"]]


def samples_of(row: dict[str, Any]) -> int | None:
    """The row's samples per instance (k), None for a row that does not record them."""
    return row.get("samples")


def values_of(row: dict[str, Any], key: str = "score", k: int | None = None) -> dict[str, float]:
    """Instance id -> its `key`: `score`, `pass_at_1`, or `pass_at_k`: with `k` the unbiased
    pass@k from the row's n samples (c = avg@n x n correct, `brorl.evaluation.scoring.pass_at_k`), without
    it pass@n (1.0 when any of the n samples was correct, from avg@n > 0)."""
    if key == "pass_at_k":
        if k is None:
            return {i: float(v > 0) for i, v in zip(row["problem_ids"], row["pass_at_1"],
                                                      strict=True)}
        n = samples_of(row)
        if n is None or k > n:
            raise ValueError(f"pass@{k} needs at least {k} samples per instance; the row of "
                             f"step {row['step']} has {n}.")
        return {i: pass_at_k(n, round(v * n), k)
                for i, v in zip(row["problem_ids"], row["pass_at_1"], strict=True)}
    return dict(zip(row["problem_ids"], row[key], strict=True))


@dataclass(frozen=True)
class RunResult(RunRecord):
    """One finished run of the study: which run, its summary and its test evaluations (by
    step); pooled rates from `RunRecord`."""

    run: StudyRun
    holdout: tuple[dict[str, Any], ...] = ()
    """The run's hold-out rows by step (the primary endpoint; `evals` holds the full test
    split's)."""

    @classmethod
    def load(cls, run: StudyRun, folder: Path) -> RunResult:
        summary, rows = read_run(folder, f"study run {run.id} has not finished; run it (make "
                                         "study, or brorl study --run ID).")
        holdout = tuple(read_evals(folder / "evals.jsonl", "holdout"))
        return cls(summary=summary, evals=rows, run=run, holdout=holdout)

    def on(self, split: str) -> RunResult:
        """This run with `split`'s rows as its `evals` (`test` or `holdout`)."""
        if split == "test":
            return self
        if not self.holdout:
            raise ValueError(f"run {self.run.id} has no {split} evaluation: it ran before the "
                             "study scored a hold-out split; rerun it (make study).")
        return dataclasses.replace(self, evals=list(self.holdout))

    @property
    def final(self) -> dict[str, Any]:
        return self.evals[-1]

    def row_at(self, step: int) -> dict[str, Any] | None:
        """The evaluation row at `step`, None when the run has none."""
        return next((row for row in self.evals if row["step"] == step), None)

    def at_step(self, step: int) -> dict[str, Any]:
        """The evaluation row at `step`; a ValueError naming the run when it has none."""
        if (row := self.row_at(step)) is not None:
            return row
        raise ValueError(f"run {self.run.id} has no test evaluation at step {step} (its "
                         f"evaluations: steps {[r['step'] for r in self.evals]}); its budget "
                         "ended before the equal-steps point: raise study.budget_rollouts.")

    def at_budget(self, budget: int) -> dict[str, Any]:
        """The evaluation row at exactly `budget` rollouts (the step that spent the budget); a
        ValueError naming the run when it has none."""
        row = next((row for row in self.evals if row["rollouts"] == budget), None)
        if row is None:
            raise ValueError(f"run {self.run.id} has no evaluation at its budget of {budget} "
                             f"rollouts (its evaluations: rollouts "
                             f"{[r['rollouts'] for r in self.evals]}): rerun it.")
        return row

    @property
    def train_seconds(self) -> float:
        return float(self.summary.get("train_seconds", self.final["seconds"]))

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken: the update's mini-batches summed over the steps (a step whose
        draws kept no group has none)."""
        return int(sum(m.get("update/optimizer_steps", 0.0) for m in self.history))


def instance_order(results: list[RunResult]) -> tuple[list[str], list[str]]:
    """The instance ids every run was scored on (the first run's final order) and their families;
    a ValueError when the runs were scored on different instances (`train.eval_seed` differs)."""
    first = results[0].final
    ids = list(first["problem_ids"])
    for r in results:
        for row in r.evals:
            if set(row["problem_ids"]) != set(ids):
                raise ValueError(
                    f"run {r.run.id} step {row['step']} was scored on other instances than run "
                    f"{results[0].run.id}: every run of a study needs the same train.eval_seed, "
                    "train.eval_per_family and data.")
    return ids, families_of(first)


def table(values: list[dict[str, float]], ids: list[str]) -> np.ndarray:
    """`[runs, instances]` of per-instance values in `ids` order."""
    return np.array([[v[i] for i in ids] for v in values], dtype=float)
