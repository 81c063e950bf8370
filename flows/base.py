"""Flow `base`: the middling base checkpoint (`brorl base --params FILE`).

Composition only: load params, call the `base` task on the `data` stage's output (checkpoint
at `base.path`, metrics at `<tracking.metrics_dir>/<base_label>.json` for DVC, `base.json` for
`outputs/base/checkpoint`; the warm-up history at `<base.path>/../report.json`), record them
in one MLflow run, return the summary.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows import device_slot, run_stage
from tasks.base import log_base, train_base


@flow(name="base")
def base(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Warm the model stage's checkpoint up with the `base` section's knobs."""
    with device_slot():  # a deployment's run: one training per device
        return run_stage(train_base, log_base, {"model", "base"}, params_path, overrides)
