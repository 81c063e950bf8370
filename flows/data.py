"""Flow `data`: build the problem splits of one experiment (`brorl data --params FILE`).

Composition only: load params, call the `data` task (splits to `data.path`, counts to
`<tracking.metrics_dir>/<data_label>.json` for DVC: `data.json` for `outputs/data/problems`),
record both in one MLflow run, return the summary.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows import run_stage
from tasks.data import build_data, log_data


@flow(name="data")
def data(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Build, split and save the problems named by the params file's `data` section."""
    return run_stage(build_data, log_data, {"data"}, params_path, overrides)
