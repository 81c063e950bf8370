"""Flow `compare`: ProRL and BroRL from the same start at an equal budget, then the report.

`brorl compare --params params/compare.yaml`. Composition only: resolve the arms
(shared start and budget applied and checked), train each arm as a `train-arm` subflow when
`compare.train_arms` (resuming earlier progress; their MLflow runs are children of the
comparison's run), then write the report (Markdown, JSON, PNG; each arm tested against
`compare.baseline`) and attach it in MLflow.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from brorl.params import load_params
from flows.train import train_arm
from tasks import compare as c


@flow(name="compare")
def compare(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Train (optionally) and compare the arms of `compare.arms`."""
    params = load_params(params_path, overrides or [])
    arms = c.resolve_arms(params)
    run_id = None
    if params.compare.train_arms:
        run_id = c.create_mlflow_run(params)
        for arm in arms.values():
            train_arm(arm, arm.name, parent_run_id=run_id)
    metrics_path = f"{params.tracking.metrics_dir}/{params.compare_label}.json"
    result = c.report(arms, params.compare.report_dir, metrics_path, params.compare.baseline)
    result["mlflow_run_id"] = c.log_report(params, result, run_id)
    return result
