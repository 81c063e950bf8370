"""A study's finished runs read from their folders: evaluations, per-instance scores, pooled rates.

Each run folder holds `summary.json` (per-step metrics in `history`) and `evals.jsonl`, one row
per (step, split) with per-instance `score` (the family's headline quantity: pass@1 for math and
code, mean reward for reasoning, spec §7.1), `pass_at_1` and `families` in `problem_ids` order.
Only test rows are read (rows without `split` are test rows of older runs; rows without `score`
fall back to `pass_at_1`, without `families` to the id's `family/` prefix).

Pooled rates (our reading of spec §5.5, Table 2): the dynamic-sampling pass rate is
sum(pass_rate x rollouts generated) / sum(rollouts generated) over the run's steps, the
generation throughput sum(rollouts) / sum(generation seconds); never a mean of per-step ratios.

Deliberately ignored: validation rows (model selection lives in the warm-up, not in a study run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from brorl.compare import pooled_pass_rate, pooled_throughput
from brorl.evals import read_run
from brorl.study.plan import StudyRun

FAMILIES = ("math", "code", "reasoning")


def families_of(row: dict[str, Any]) -> list[str]:
    return row.get("families") or [i.split("/")[0] for i in row["problem_ids"]]


def values_of(row: dict[str, Any], key: str = "score") -> dict[str, float]:
    """Instance id -> its `key` (`score`, falling back to `pass_at_1`, or `pass_at_1`)."""
    values = row.get(key) if key in row else row["pass_at_1"]
    return dict(zip(row["problem_ids"], values, strict=True))


@dataclass(frozen=True)
class RunResult:
    """One finished run: which run, its summary and its test evaluations (by step)."""

    run: StudyRun
    summary: dict[str, Any]
    evals: list[dict[str, Any]]

    @classmethod
    def load(cls, run: StudyRun, folder: Path) -> RunResult:
        summary, rows = read_run(folder, f"study run {run.id} has not finished; run it (dvc "
                                         "repro study_report, or python -m flows.study --run ID).")
        return cls(run, summary, rows)

    @property
    def final(self) -> dict[str, Any]:
        return self.evals[-1]

    @property
    def train_seconds(self) -> float:
        return float(self.summary.get("train_seconds", self.final["seconds"]))

    @property
    def pass_rate(self) -> float:
        """Pooled dynamic-sampling pass rate (`filter/pass_rate`, the active keep rule)."""
        return pooled_pass_rate(self.summary.get("history", []))

    @property
    def rollouts_per_s(self) -> float:
        """Pooled generation throughput: rollouts / generation seconds over the run's steps."""
        return pooled_throughput(self.summary.get("history", []))

    def at(self, key: str, x: float) -> dict[str, float]:
        """Instance id -> score at `key` (`rollouts` or `seconds`) = x, linear between the two
        evaluations around x (the evaluation itself when one is at x). Our choice for scores
        between evaluations; x beyond the last evaluation is refused (no extrapolation)."""
        xs = np.array([float(r[key]) for r in self.evals])
        if not xs[0] <= x <= xs[-1] + 1e-9:
            raise ValueError(f"run {self.run.id}: {key} = {x} is outside its evaluations "
                             f"[{xs[0]}, {xs[-1]}]; interpolate only inside a run.")
        hi = min(int(np.searchsorted(xs, x, side="left")), len(xs) - 1)
        if xs[hi] == x or hi == 0:
            return values_of(self.evals[hi])
        lo = hi - 1
        w = (x - xs[lo]) / (xs[hi] - xs[lo])
        a, b = values_of(self.evals[lo]), values_of(self.evals[hi])
        return {i: (1 - w) * a[i] + w * b[i] for i in a}


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
