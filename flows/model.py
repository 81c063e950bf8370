"""Flow `model`: the starting checkpoint (`brorl model --params FILE`).

Composition only: load params, call the `model` task (a Hugging Face folder at `model.path`
converted from a GGUF file, built from config, or the card of a local HF folder; its headline at
`<tracking.metrics_dir>/<model_label>.json` for DVC), record it in one MLflow run, return the
summary.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows import run_stage
from tasks.model import log_model, make_model


@flow(name="model")
def model(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Make the checkpoint the `model` section names."""
    return run_stage(make_model, log_model, {"model"}, params_path, overrides)
