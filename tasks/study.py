"""Prefect tasks of a study: its plan, pool and start, a run's folder and progress line, its MLflow
parent run, the report. Each wraps one `brorl.study` call, with its MLflow record kept by
`tracking.study_record` (the parent run, the runs' tags, the report on the parent).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

import tracking
from brorl.params import ExperimentParams
from brorl.study import progress as prog
from brorl.study import warmup_params, write_plan
from brorl.study.pool import write_pool
from brorl.study.report import build_report, headline, write_headline, write_seeds
from brorl.study.start import write_start
from brorl.study.warmup import frozen_warmup as read_frozen_warmup
from brorl.system.checkout import find_root
from tracking import study_record

_TASK = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="study-plan", **_TASK)
def plan(params: ExperimentParams) -> list[str]:
    """Write the plan files (`<out_dir>/plan/`); the run ids."""
    return write_plan(params, find_root())


@task(name="study-warmup-frozen", **_TASK)
def frozen_warmup(params: ExperimentParams) -> dict[str, Any] | None:
    """The frozen warm-up's plateau record, None when not frozen (`brorl.study.frozen`)."""
    return read_frozen_warmup(params, find_root())


@task(name="study-warmup-params", **_TASK)
def warmup(params: ExperimentParams) -> ExperimentParams:
    """The warm-up run's params (`brorl.study.plan.warmup_params`)."""
    return warmup_params(params)


@task(name="study-pool", **_TASK)
def pool(params: ExperimentParams) -> dict[str, Any]:
    """Estimate the start's pass rates, choose and save the pool; its summary (no estimates)."""
    record = write_pool(params, find_root())
    return {k: v for k, v in record.items() if k not in ("estimates", "pool_ids")}


@task(name="study-start", **_TASK)
def score_start(params: ExperimentParams) -> str:
    """Score the start evaluation every run shares; its file (`brorl.study.start`)."""
    return str(write_start(params, find_root()))


@task(name="study-prepare-run", **_TASK)
def prepare_run(params: ExperimentParams, run_id: str, started: float | None) -> dict[str, Any]:
    """Print the progress line, get the run's folder ready (resume, or start over; the MLflow
    run of a cleared folder is deleted); the run's resolved params and tags."""
    prepared = prog.prepare_session(params, find_root(), run_id, started)
    get_run_logger().info(prepared["line"])
    if prepared["cleared_mlflow_run"]:
        study_record.forget_run(tracking.resolve_tracking_uri(params.tracking.tracking_uri),
                                prepared["cleared_mlflow_run"])
    return prepared


@task(name="study-parent-run", **_TASK)
def parent_run(params: ExperimentParams) -> str:
    """The study's MLflow parent run, RUNNING: found by its tags, else created."""
    return study_record.parent_run(params)


@task(name="study-finish-run", **_TASK)
def finish_run(prepared: dict[str, Any], summary: dict[str, Any]) -> None:
    """Tag the run's MLflow child run; mark the run finished with its wall seconds."""
    study_record.tag_run(prepared["params"], summary["mlflow_run_id"], prepared["tags"])
    prog.mark_finished(Path(prepared["folder"]), time.monotonic() - prepared["started"])


@task(name="study-report", **_TASK)
def report(params: ExperimentParams) -> dict[str, Any]:
    """report.md, report.json, seeds.md and the PNGs; the headline as
    `<metrics_dir>/<study_label>.json` and the per-seed table beside it (committed in git)."""
    result = build_report(params, find_root())
    metrics = Path(tracking.stage_metrics(params, params.study_label))
    write_headline(result, metrics)
    write_seeds(result, metrics.with_name(f"{metrics.stem}_seeds.md"))
    get_run_logger().info("\n".join(result["verdict"]))
    return result


@task(name="study-log-report", **_TASK)
def log_report(params: ExperimentParams, run_id: str, result: dict[str, Any]) -> None:
    """The report's files and headline on the parent run, which is then FINISHED."""
    study_record.log_report(params, run_id, headline(result), find_root() / params.study.out_dir)
