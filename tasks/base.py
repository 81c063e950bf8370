"""Prefect task `base`: warm the tiny policy up on the data's splits, save it, write its metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

import tracking
from brorl.base import BaseConfig, make_base_checkpoint, split_report
from brorl.data import load_split
from brorl.params import ExperimentParams
from brorl.policy import save_policy
from brorl.runs.files import atomic_write_text
from brorl.runs.machine import machine_path, write_machine
from brorl.runs.timings import read_timings, split_timings, timings_path, write_timings


def base_metrics(report: dict, target_pass_low: float, target_pass_high: float) -> dict[str, float]:
    """Flat `base/<quantity>[_<family>]` metrics from a `make_base_checkpoint` report.

    `base/in_band` is 1 when every family's held-out pass@1 lies in [low, high], else 0.
    """
    metrics = {"base/steps": float(report["steps"]),
               "base/selected_step": float(report["selected_step"]),
               "base/train_seconds": round(report["train_seconds"], 1),
               "base/test_seconds": round(report["test_seconds"], 1)}
    families = report["test"]["family"]
    for family, scores in families.items():
        metrics[f"base/pass_at_1_{family}"] = scores["pass_at_1"]
        metrics[f"base/reward_mean_{family}"] = scores["reward_mean"]
        metrics[f"base/score_{family}"] = scores["score"]
    in_band = all(target_pass_low <= s["pass_at_1"] <= target_pass_high for s in families.values())
    metrics["base/in_band"] = float(in_band)
    return metrics


@task(name="base", cache_policy=NO_CACHE, persist_result=False)
def train_base(params: ExperimentParams) -> dict[str, Any]:
    """Warm up on the splits at `data.path`, save the HF folder at `base.path`; the headline
    (the paper's score per family) to `<tracking.metrics_dir>/<base_label>.json` for DVC, every
    metric to `<base>/../report.json` but the wall-clock ones (`base/train_seconds`,
    `base/test_seconds`, each check's seconds), which go beside the stage's folder `<base>/..`
    (`outputs/base.timings.json`, `brorl.runs.timings`), never inside it, as does the machine's
    record (`outputs/base.machine.json`, `brorl.runs.machine`).

    `base/in_band` reports the held-out scores against [target_pass_low, target_pass_high].
    """
    config, path = BaseConfig.from_params(params), params.base.path
    metrics_path = tracking.stage_metrics(params, params.base_label)
    splits = {name: load_split(params.data.path, name) for name in ("train", "validation", "test")}
    model, tokenizer, report = make_base_checkpoint(
        splits["train"], splits["validation"], splits["test"], config)
    save_policy(model, tokenizer, path)
    metrics = base_metrics(report, config.target_pass_low, config.target_pass_high)
    headline = {family: round(row["score"], 4) for family, row in report["test"]["family"].items()}
    atomic_write_text(Path(metrics_path), json.dumps(headline, indent=2, sort_keys=True) + "\n")
    (stable, timings), (kept, clock) = split_report(report), split_timings(metrics)
    atomic_write_text(Path(path).parent / "report.json",
                      json.dumps({**stable, "metrics": kept}, indent=2) + "\n")
    write_timings(Path(path).parent, {**clock, "history": timings["history"]})
    write_machine(Path(path).parent)  # what else than the seed and params decided it
    return {"path": path, "metrics_path": metrics_path, "metrics": metrics}


@task(name="base-mlflow", cache_policy=NO_CACHE, persist_result=False)
def log_base(logged: dict, result: dict, experiment: str, tracking_uri: str) -> str:
    """One MLflow run: params, the validation curve per family (with the warm-up's seconds at
    each check), final metrics, the report and its timings."""
    report_path = Path(result["path"]).parent / "report.json"
    history = json.loads(report_path.read_text())["history"]
    clock = read_timings(Path(result["path"]).parent).get("history", [])
    steps = [h["step"] for h in history]
    series = {f"base/val_pass_at_1_{f}": [h["pass_at_1"][f] for h in history]
              for f in history[0]["pass_at_1"]}
    series["base/loss"] = [h["loss"] for h in history]  # NaN at step 0 is skipped
    if [h["step"] for h in clock] == steps:
        series["base/check_seconds"] = [h["seconds"] for h in clock]
    with tracking.mlflow_run(experiment, tracking_uri, "base", {"stage": "base"}) as run_id:
        tracking.log_params(tracking_uri, run_id, logged)
        tracking.log_metric_series(tracking_uri, run_id, steps, series)
        tracking.log_metric_series(tracking_uri, run_id, [steps[-1]],
                                   {k: [v] for k, v in result["metrics"].items()})
        tracking.log_artifacts(tracking_uri, run_id, [Path(result["metrics_path"]), report_path,
                                                      timings_path(report_path.parent),
                                                      machine_path(report_path.parent)])
    return run_id
