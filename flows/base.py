"""Flow `base`: the middling base checkpoint (`python -m flows.base --params FILE`).

Composition only: load params, call the `base` task on the `data` stage's output (checkpoint
at `base.path`, metrics at `<tracking.metrics_dir>/<base_label>.json` for DVC, `base.json` for
`outputs/base/checkpoint`; the warm-up history at `<base.path>/../report.json`), record them
in one MLflow run, return the summary.
"""

from __future__ import annotations

if __name__ == "__main__":  # arguments and inputs checked before prefect and torch load
    from entrypoints.entry import main

    main("base")

from typing import Any

from prefect import flow

from brorl.params import load_params
import tracking
from tasks.base import log_base, train_base


@flow(name="base")
def base(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Warm the model stage's checkpoint up with the `base` section's knobs."""
    params = load_params(params_path, overrides or [])
    metrics_path = tracking.ROOT / params.tracking.metrics_dir / f"{params.base_label}.json"
    result = train_base(params, str(metrics_path))
    uri = tracking.resolve_tracking_uri(params.tracking.tracking_uri)
    logged = {"name": params.name, **params.model_dump(mode="json", include={"model", "base"})}
    run_id = log_base(logged, result, params.tracking.experiment, uri)
    return {**result, "mlflow_run_id": run_id}
