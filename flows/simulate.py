"""The `simulate` flow: the paper's token-level simulator sweep (BroRL §4.1, Fig. 3).

One task run per N with every seed, one after another (each uses both cores: the seeds run as
rows of one tensor, in cache-sized batches, on torch's threads), then the report task, then
MLflow: a parent run with the resolved params and artifacts, a child run per N with per-step
metrics.
Run: `brorl simulate --params params/simulate.yaml [-S simulate.steps=200]`.
"""

from __future__ import annotations

from prefect import flow

import tracking
from brorl.params import load_params
from brorl.system.checkout import find_root
from tasks.simulate import log_to_mlflow, simulate_run, write_report


@flow(name="simulate")
def simulate(params_path: str, overrides: list[str] | None = None) -> dict:
    """Run the sweep; returns the output paths and the MLflow parent run id."""
    params = load_params(params_path, overrides or [])
    sim = params.simulate
    seeds = [sim.seed + k for k in range(sim.num_seeds)]
    merged = [simulate_run(params, n, seeds) for n in sorted(set(sim.rollouts_per_prompt))]
    where, root = params.tracking, find_root()
    out_dir = root / where.output_dir / "simulate"
    paths = write_report(merged, out_dir, root / where.plots_dir / "simulate",
                         root / where.metrics_dir / "simulate.json", sim.report_steps)
    uri = tracking.resolve_tracking_uri(params.tracking.tracking_uri)
    run_id = log_to_mlflow(params, merged,
                           [paths["figure"], paths["csv"], paths["json"], paths["table"]], uri)
    print(f"simulate: results in {out_dir}; MLflow run {run_id} at {uri}")
    return {**{k: str(v) for k, v in paths.items()}, "mlflow_run_id": run_id}
