"""Flow `evaluate`: a checkpoint's held-out pass@1 per family (`brorl evaluate --params F`).

Composition only. The checkpoint is `checkpoint` (any local HF folder) or, by default, the run's
final policy / newest checkpoint / starting point (`brorl.runs.folder.policy_to_evaluate`).
Served as a scheduled deployment by `commands/deploy.py` (nightly evaluation of the newest
checkpoint).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from brorl.params import load_params
from tasks import evaluate as e


@flow(name="evaluate")
def evaluate(params_path: str, overrides: list[str] | None = None,
             checkpoint: str | None = None) -> dict[str, Any]:
    """Score `checkpoint` (default: the params' run) on the test split; record it in MLflow."""
    params = load_params(params_path, overrides or [])
    return e.record(params, e.evaluate_checkpoint(params, checkpoint))
