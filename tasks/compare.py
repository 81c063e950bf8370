"""Prefect tasks of the comparison: resolve the arms' params, build the report, record it in MLflow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from brorl.compare import ArmResult, build_report, headline
from brorl.params import ExperimentParams, load_params
from brorl.files import atomic_write_text
from tasks import tracking

_TASK = dict(cache_policy=NO_CACHE, persist_result=False)
_PAIRED = {"delta": "delta", "ci_low": "ci_low", "ci_high": "ci_high", "p": "p_one_tailed",
           "p_two_sided": "p_two_sided", "dz": "effect_size_dz", "wilcoxon_p": "wilcoxon_p",
           "mde": "mde"}
"""Metric name -> the paired test's key in report.json."""
_EVAL_KEYS = ("eval_per_family", "eval_samples", "eval_temperature", "eval_top_p")
"""`train` fields the arms must share: the paired test scores the same instances the same way."""


@task(name="resolve-arms", **_TASK)
def resolve_arms(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each arm's resolved params, with the comparison's shared start and budget applied.

    Fails, naming the arms and values, if the arms would not start from the same checkpoint
    with the same budget and evaluation protocol: the comparison is only fair at equal start and
    budget (spec §5.1, §8), and the paired test needs the same instances scored the same way.
    """
    c = ExperimentParams.model_validate(params).compare
    shared = []
    if c.init_checkpoint is not None:
        shared.append(f"train.init_checkpoint={c.init_checkpoint}")
    if c.budget_rollouts is not None:
        shared.append(f"train.max_rollouts={c.budget_rollouts}")
    if c.budget_seconds is not None:
        shared.append(f"train.max_seconds={c.budget_seconds}")
    arms = {name: load_params(tracking.ROOT / path, shared) for name, path in c.arms.items()}
    fixes = {"init_checkpoint": "set compare.init_checkpoint", "max_rollouts":
             "set compare.budget_rollouts", "max_seconds": "set compare.budget_seconds"}
    for key in ("init_checkpoint", "max_rollouts", "max_seconds", "steps", *_EVAL_KEYS):
        values = {name: getattr(p.train, key) for name, p in arms.items()}
        if len(set(values.values())) > 1:
            raise ValueError(f"compare: arms differ in train.{key} {values}; "
                             f"{fixes.get(key, 'give the arms equal values')}.")
    return {name: p.model_dump(mode="json") for name, p in arms.items()}


def compare_metrics(result: dict[str, Any]) -> dict[str, float]:
    """Flat `compare/...` metrics of a report: final score and pass@1 per family and arm, the
    pooled pass rate and generation throughput per arm, and the first non-baseline arm's paired
    test against the baseline as `compare/paired_<q>` (report.json holds every arm's)."""
    metrics = {f"compare/{q}_{fam}_{arm}": v for q in ("score", "pass_at_1")
               for arm, row in result[f"final_{q}"].items() for fam, v in row.items()}
    metrics.update({f"compare/pass_rate_{a}": v for a, v in result["pass_rate"].items()})
    metrics.update({f"compare/rollouts_per_s_{a}": v for a, v in result["rollouts_per_s"].items()})
    test = result.get("paired_test") or {}
    metrics.update({f"compare/paired_{q}": test[k] for q, k in _PAIRED.items() if test})
    return metrics


@task(name="report", **_TASK)
def report(arm_params: dict[str, dict[str, Any]], report_dir: str,
           metrics_path: str | None = None, baseline: str = "prorl") -> dict[str, Any]:
    """The Markdown/JSON/PNG report from the arms' run folders, each arm tested against
    `baseline`; with `metrics_path`, its `headline` there too (the DVC stage's metrics)."""
    arms = [ArmResult.load(name, tracking.ROOT / p["train"]["run_dir"])
            for name, p in arm_params.items()]
    out = build_report(arms, tracking.ROOT / report_dir, baseline)
    if metrics_path is not None:
        path = tracking.ROOT / metrics_path
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(headline(out), indent=2) + "\n")
    return {**out, "report_dir": str(tracking.ROOT / report_dir)}


@task(name="compare-mlflow", **_TASK)
def log_report(params: dict[str, Any], result: dict[str, Any], run_id: str | None = None) -> str:
    """The comparison's MLflow run (the arms' parent when they were trained here): report attached."""
    p = ExperimentParams.model_validate(params)
    uri = tracking.resolve_tracking_uri(p.tracking.tracking_uri)
    client = MlflowClient(uri)
    if run_id is None:
        run_id = create_mlflow_run(params)
    tracking.log_params(uri, run_id, p.model_dump(mode="json", include={"name", "compare"}))
    metrics = {k: [v] for k, v in compare_metrics(result).items()}
    tracking.log_metric_series(uri, run_id, [0], metrics)
    folder = Path(result["report_dir"])
    for name in ("report.md", "report.json", "scores.png", "pass_at_1.png"):
        client.log_artifact(run_id, str(folder / name), artifact_path="report")
    client.set_terminated(run_id, status="FINISHED")
    return run_id


@task(name="create-compare-run", **_TASK)
def create_mlflow_run(params: dict[str, Any]) -> str:
    """A new MLflow run for the comparison (status RUNNING until the report is logged)."""
    p = ExperimentParams.model_validate(params)
    uri = tracking.resolve_tracking_uri(p.tracking.tracking_uri)
    experiment_id = tracking.ensure_experiment(p.tracking.experiment, uri)
    tags = {"stage": "compare", "git_commit": tracking.git_commit(),
            "arms": ",".join(p.compare.arms)}
    return MlflowClient(uri).create_run(experiment_id, run_name=f"{p.name}-compare",
                                        tags=tags).info.run_id
