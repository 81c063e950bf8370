"""Prefect tasks of the `simulate` stage: one N's simulator runs, the report, the MLflow records.

Each task wraps one brorl call. Results are small (a few hundred logged points per run) and are
passed in memory, never persisted by Prefect.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

import tracking
from brorl.params import ExperimentParams
from brorl.runs.files import atomic_write_text
from brorl.theory import report
from brorl.theory.simulator import METRICS, SimConfig, SimulationResult, simulate


@task(name="simulate_run", cache_policy=NO_CACHE, persist_result=False)
def simulate_run(params: ExperimentParams, rollouts: int, seeds: list[int]) -> SimulationResult:
    """One N's simulator runs, every seed (brorl batches the seeds and uses torch's threads)."""
    return simulate(SimConfig.from_params(params.simulate), rollouts, seeds)


@task(name="simulate_report", cache_policy=NO_CACHE, persist_result=False)
def write_report(merged: list[SimulationResult], out_dir: Path, plots_dir: Path,
                 metrics_path: Path, report_steps: list[int]) -> dict[str, Path]:
    """The results table, figure and every metric (out_dir), curves as CSV/JSON (plots_dir), the
    headline (`report.headline`) as DVC metrics."""
    paths = report.write_curves(merged, plots_dir)
    table = out_dir / "results.md"
    atomic_write_text(table, report.results_table(merged, report_steps))
    summary = report.summary_metrics(merged, report_steps)
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2, allow_nan=True))
    atomic_write_text(metrics_path, json.dumps(report.headline(merged), indent=2) + "\n")
    figure = report.plot_figure(merged, out_dir / "simulate.png")
    return {**paths, "table": table, "figure": figure, "metrics": metrics_path}


@task(name="simulate_log", cache_policy=NO_CACHE, persist_result=False)
def log_to_mlflow(params: ExperimentParams, merged: list[SimulationResult],
                  artifacts: list[Path], tracking_uri: str) -> str:
    """Parent run with the resolved params and artifacts, one child run per N with its curves
    and the simulator settings of its runs (`SimConfig`)."""
    config, experiment = SimConfig.from_params(params.simulate), params.tracking.experiment
    tags = {"stage": "simulate"}
    with tracking.mlflow_run(experiment, tracking_uri, "simulate", tags) as parent:
        tracking.log_params(tracking_uri, parent, params.model_dump(mode="json"))
        tracking.log_artifacts(tracking_uri, parent, artifacts)
        for result in merged:
            with tracking.mlflow_run(experiment, tracking_uri, f"simulate N={result.rollouts}",
                                     {**tags, "rollouts_per_prompt": str(result.rollouts)},
                                     parent_run_id=parent) as child:
                tracking.log_params(tracking_uri, child, {**asdict(config),
                                                          "rollouts_per_prompt": result.rollouts,
                                                          "seeds": list(result.seeds)})
                series = {}
                for m in METRICS:
                    series[f"simulate/{m}"] = result.curves[m].mean(0).tolist()
                    if len(result.seeds) > 1:
                        series[f"simulate/{m}_std"] = result.curves[m].std(0).tolist()
                tracking.log_metric_series(tracking_uri, child, result.steps.tolist(), series)
    return parent
