"""Flow `data`: build the problem splits of one experiment (`python -m flows.data --params FILE`).

Composition only: load params, call the `data` task, return its summary. No MLflow run yet
(the project's tracking helpers are not in place); counts go to `metrics/data.json` for DVC.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from brorl.params import load_params
from flows.entry import run_flow_cli
from tasks.data import build_data

METRICS = "metrics/data.json"


@flow(name="data")
def data(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Build, split and save the problems named by the params file's `data` section."""
    p = load_params(params_path, overrides or []).data
    return build_data(
        path=p.path, metrics_path=METRICS, seed=p.seed,
        validation_fraction=p.validation_fraction, test_fraction=p.test_fraction,
        math_per_task=p.math_per_task, math_max_operand=p.math_max_operand,
        code_per_task=p.code_per_task, reasoning_per_task=p.reasoning_per_task,
        reasoning_tasks=p.reasoning_tasks, math_jsonl=tuple(p.math_jsonl),
        code_jsonl=tuple(p.code_jsonl),
    )


if __name__ == "__main__":
    run_flow_cli(data)
