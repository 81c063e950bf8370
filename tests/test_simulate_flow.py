"""The `simulate` flow under Prefect's test harness with the CI params and a temporary MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from flows.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]


def test_simulate_flow_leaves_parent_and_child_runs_metrics_figure_and_files(
        prefect_harness, mlflow_uri, tmp_path):
    overrides = [f"tracking.output_dir={tmp_path / 'out'}", f"tracking.metrics_dir={tmp_path / 'm'}",
                 f"tracking.plots_dir={tmp_path / 'plots'}"]
    summary = simulate(params_path=str(ROOT / "params/simulate_ci.yaml"), overrides=overrides)

    client = MlflowClient(mlflow_uri)
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.data.params["simulate.vocab_size"] == "8000"
    assert parent.info.status == "FINISHED"
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"simulate.png", "curves.csv", "curves.json", "results.md"} <= names
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(c.data.tags["rollouts_per_prompt"] for c in children) == ["4", "4096"]
    history = client.get_metric_history(children[0].info.run_id, "simulate/q_pos")
    assert [m.step for m in history] == [0, 20, 40, 60]  # steps 60, log_every 20

    summary = json.loads((tmp_path / "out" / "simulate" / "summary.json").read_text())
    big, small = summary["N=4096"]["step_60"], summary["N=4"]["step_60"]
    assert big["q_pos"]["mean"] > small["q_pos"]["mean"]
    headline = json.loads((tmp_path / "m" / "simulate.json").read_text())  # DVC's metrics
    assert headline == {"q_pos_gain": round(big["q_pos"]["mean"] - small["q_pos"]["mean"], 4)}
    png = (tmp_path / "out" / "simulate" / "simulate.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (tmp_path / "plots" / "simulate" / "curves.csv").read_text().startswith("rollouts,step,")
