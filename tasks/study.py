"""Prefect tasks of a study: its plan, pool and start, a run's folder and progress line, its MLflow
parent run, the report. Each wraps one `brorl.study` call (or one MLflow exchange).

MLflow: one parent run per study, found by its tags (`stage=study`, `study=<name>`) and created
when missing, so reruns and resumed studies reuse it; the warm-up and each run are children. A
run that is started over has its earlier MLflow run deleted (soft: `mlflow gc` would purge it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from brorl.files import atomic_write_text
from brorl.params import ExperimentParams
from brorl.study import find_run, run_dir, run_params, warmup_params, write_plan
from brorl.study import progress as prog
from brorl.study.pool import write_pool
from brorl.study.report import build_report, headline
from brorl.study.start import score_start as score_start_rows
from brorl.study.start import start_path
import tracking

_TASK = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="study-plan", **_TASK)
def plan(params: dict[str, Any]) -> list[str]:
    """Write the plan files (`<out_dir>/plan/`); the run ids."""
    return write_plan(ExperimentParams.model_validate(params), tracking.ROOT)


@task(name="study-warmup-params", **_TASK)
def warmup(params: dict[str, Any]) -> dict[str, Any]:
    """The warm-up run's params (`brorl.study.plan.warmup_params`)."""
    return warmup_params(ExperimentParams.model_validate(params)).model_dump(mode="json")


@task(name="study-pool", **_TASK)
def pool(params: dict[str, Any]) -> dict[str, Any]:
    """Estimate the start's pass rates, choose and save the pool; its summary (no estimates)."""
    record = write_pool(ExperimentParams.model_validate(params), tracking.ROOT)
    return {k: v for k, v in record.items() if k not in ("estimates", "pool_ids")}


@task(name="study-start", **_TASK)
def score_start(params: dict[str, Any]) -> str:
    """Score the start evaluation every run shares; its file (`brorl.study.start`)."""
    p = ExperimentParams.model_validate(params)
    path = tracking.ROOT / start_path(p.study)
    atomic_write_text(path, json.dumps(score_start_rows(p, tracking.ROOT), indent=1,
                                       sort_keys=True) + "\n")
    return str(path)


def forget_run(tracking_uri: str, run_id: str) -> None:
    """Delete the MLflow run a cleared run folder named; one the store no longer holds (another
    tracking database, or deleted by hand) is already gone."""
    from mlflow.exceptions import MlflowException

    try:
        MlflowClient(tracking_uri).delete_run(run_id)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise


@task(name="study-prepare-run", **_TASK)
def prepare_run(params: dict[str, Any], run_id: str, started: float | None) -> dict[str, Any]:
    """Print the progress line, get the run's folder ready (resume, or start over); the run's
    resolved params and tags."""
    p = ExperimentParams.model_validate(params)
    run = find_run(p.study, run_id)
    get_run_logger().info(
        prog.progress_line(p.name, run, prog.progress(p, tracking.ROOT, run_id, started)))
    folder = tracking.ROOT / run_dir(p.study, run)
    done = prog.prepare_run_dir(folder, run_id, prog.digests(p, tracking.ROOT)[run_id])
    if done.cleared_mlflow_run:
        forget_run(tracking.resolve_tracking_uri(p.tracking.tracking_uri), done.cleared_mlflow_run)
    rp = run_params(p, run)
    tags = {"study": p.name, "arm": run.arm, "seed": str(run.seed),
            "N": str(rp.update.rollouts_per_prompt), "B": str(rp.update.prompts_per_step)}
    return {"params": rp.model_dump(mode="json"), "tags": tags, "action": done.action,
            "folder": str(folder), "started": time.monotonic(),
            "start": str(tracking.ROOT / start_path(p.study))}


@task(name="study-parent-run", **_TASK)
def parent_run(params: dict[str, Any]) -> str:
    """The study's MLflow parent run, RUNNING: found by its tags, else created."""
    p = ExperimentParams.model_validate(params)
    uri = tracking.resolve_tracking_uri(p.tracking.tracking_uri)
    experiment_id = tracking.ensure_experiment(p.tracking.experiment, uri)
    client = MlflowClient(uri)
    found = client.search_runs([experiment_id], f"tags.stage = 'study' and tags.study = '{p.name}'",
                               max_results=1, order_by=["attributes.start_time ASC"])
    if found:
        client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    tags = {"stage": "study", "study": p.name, "git_commit": tracking.git_commit()}
    run_id = client.create_run(experiment_id, run_name=p.name, tags=tags).info.run_id
    tracking.log_params(uri, run_id, p.model_dump(mode="json", include={"name", "study"}))
    return run_id


@task(name="study-finish-run", **_TASK)
def finish_run(prepared: dict[str, Any], summary: dict[str, Any]) -> None:
    """Tag the run's MLflow child run; mark the run finished with its wall seconds."""
    p = ExperimentParams.model_validate(prepared["params"])
    client = MlflowClient(tracking.resolve_tracking_uri(p.tracking.tracking_uri))
    for key, value in prepared["tags"].items():
        client.set_tag(summary["mlflow_run_id"], key, value)
    prog.mark_finished(Path(prepared["folder"]), time.monotonic() - prepared["started"])


@task(name="study-report", **_TASK)
def report(params: dict[str, Any]) -> dict[str, Any]:
    """report.md, report.json and the PNGs; the headline as `<metrics_dir>/<study_label>.json`."""
    p = ExperimentParams.model_validate(params)
    result = build_report(p, tracking.ROOT)
    path = tracking.ROOT / p.tracking.metrics_dir / f"{p.study_label}.json"
    atomic_write_text(path, json.dumps(headline(result), indent=2, sort_keys=True) + "\n")
    get_run_logger().info("\n".join(result["verdict"]))
    return result


@task(name="study-log-report", **_TASK)
def log_report(params: dict[str, Any], run_id: str, result: dict[str, Any]) -> None:
    """The report's files and headline on the parent run, which is then FINISHED."""
    p = ExperimentParams.model_validate(params)
    uri = tracking.resolve_tracking_uri(p.tracking.tracking_uri)
    metrics = {f"study/{name}_delta": [c["delta"]]
               for name, c in headline(result)["contrasts"].items()}
    tracking.log_metric_series(uri, run_id, [0], metrics)
    out = tracking.ROOT / p.study.out_dir
    files = [f for f in sorted(out.glob("*")) if f.is_file()]
    tracking.log_artifacts(uri, run_id, files, subdir="report")
    MlflowClient(uri).set_terminated(run_id, status="FINISHED")
