"""The vocabulary both reports are written in: the comparison (`brorl.evaluation.compare`) and the study
(`brorl.study.report`).

- `RunRecord`: a finished run read from its folder (`brorl.evaluation.protocol.read_run`): its summary, whose
  `history` holds the per-step metrics, and its test evaluations by step.
- Pooled rates (BroRL §4.2.4, Table 2): the dynamic-sampling pass rate is sum(pass rate x rollouts
  generated) / sum(rollouts generated) over the run's steps, the generation throughput
  sum(rollouts) / sum(generation seconds); never a mean of per-step ratios.
- Cells: scores in points (percent of 1) with their interval, percentages, p-values; Markdown
  tables from a header, one alignment letter per column and the rows' cells.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def pooled(history: list[dict[str, float]], numerator: str, denominator: str, *,
           weighted: bool = False) -> float:
    """Sum of `numerator` (times `denominator` when `weighted`: a per-step fraction) over sum
    of `denominator`, over the steps that logged both; NaN when none did."""
    steps = [m for m in history if numerator in m and denominator in m]
    total = sum(m[denominator] for m in steps)
    if not total:
        return math.nan
    return sum(m[numerator] * (m[denominator] if weighted else 1) for m in steps) / total


def pooled_pass_rate(history: list[dict[str, float]], key: str = "filter/pass_rate") -> float:
    """A run's pooled pass rate from its per-step metrics: sum(rate x rollouts generated) /
    sum(rollouts generated)."""
    return pooled(history, key, "filter/rollouts_generated", weighted=True)


def pooled_throughput(history: list[dict[str, float]]) -> float:
    """A run's pooled generation throughput: sum(rollouts) / sum(generation seconds)."""
    return pooled(history, "generate/rollouts", "generate/seconds")


@dataclass(frozen=True)
class RunRecord:
    """One finished run: its summary and its test evaluations (by step)."""

    summary: dict[str, Any]
    evals: list[dict[str, Any]]

    @property
    def history(self) -> list[dict[str, float]]:
        """The per-step metrics, in step order."""
        return self.summary.get("history", [])

    def pass_rate(self, key: str = "filter/pass_rate") -> float:
        """Pooled dynamic-sampling pass rate under `key` (the active keep rule by default)."""
        return pooled_pass_rate(self.history, key)

    def throughput(self) -> float:
        """Pooled generation throughput: rollouts / generation seconds over the run's steps."""
        return pooled_throughput(self.history)


def points(mean: float, low: float, high: float, *, digits: int = 2,
           signed: bool = False) -> str:
    """`61.69 [60.10, 63.20]`: a fraction and its interval in points, `digits` decimals, with
    a sign when `signed` (a difference)."""
    form = f"{'+' if signed else ''}.{digits}f"
    return f"{100 * mean:{form}} [{100 * low:{form}}, {100 * high:{form}}]"


def percent(value: float, digits: int = 2, unit: str = "") -> str:
    """A fraction in percent with `unit` after it, or `–` when it is NaN (not measured)."""
    return "–" if math.isnan(value) else f"{100 * value:.{digits}f}{unit}"


def p_value(p: float) -> str:
    """A p-value to 3 significant digits, `-` when the test is undefined."""
    return "-" if math.isnan(p) else f"{p:.3g}"


def markdown_table(header: Sequence[str], align: str, rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table: `align` has one letter per column, `l` (left) or `r` (right)."""
    rule = "|" + "".join("---|" if a == "l" else "---:|" for a in align)
    lines = [_row(header), rule, *(_row(cells) for cells in rows)]
    return "\n".join(lines)


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"
