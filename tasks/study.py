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
from brorl.checkout import find_root
from brorl.params import ExperimentParams
from brorl.study import progress as prog
from brorl.study import warmup_params, write_plan
from brorl.study.pool import write_pool
from brorl.study.report import build_report, headline, write_headline, write_seeds
from brorl.study.start import write_start
from brorl.study.warmup import frozen_warmup as read_frozen_warmup
from tracking import study_record

_TASK = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="study-plan", **_TASK)
def plan(params: dict[str, Any]) -> list[str]:
    """Write the plan files (`<out_dir>/plan/`); the run ids."""
    return write_plan(ExperimentParams.model_validate(params), find_root())


@task(name="study-warmup-frozen", **_TASK)
def frozen_warmup(params: dict[str, Any]) -> dict[str, Any] | None:
    """The frozen warm-up's plateau record, None when not frozen (`brorl.study.frozen`)."""
    return read_frozen_warmup(ExperimentParams.model_validate(params), find_root())


@task(name="study-warmup-params", **_TASK)
def warmup(params: dict[str, Any]) -> dict[str, Any]:
    """The warm-up run's params (`brorl.study.plan.warmup_params`)."""
    return warmup_params(ExperimentParams.model_validate(params)).model_dump(mode="json")


@task(name="study-pool", **_TASK)
def pool(params: dict[str, Any]) -> dict[str, Any]:
    """Estimate the start's pass rates, choose and save the pool; its summary (no estimates)."""
    record = write_pool(ExperimentParams.model_validate(params), find_root())
    return {k: v for k, v in record.items() if k not in ("estimates", "pool_ids")}


@task(name="study-start", **_TASK)
def score_start(params: dict[str, Any]) -> str:
    """Score the start evaluation every run shares; its file (`brorl.study.start`)."""
    return str(write_start(ExperimentParams.model_validate(params), find_root()))


@task(name="study-prepare-run", **_TASK)
def prepare_run(params: dict[str, Any], run_id: str, started: float | None) -> dict[str, Any]:
    """Print the progress line, get the run's folder ready (resume, or start over; the MLflow
    run of a cleared folder is deleted); the run's resolved params and tags."""
    p = ExperimentParams.model_validate(params)
    prepared = prog.prepare_session(p, find_root(), run_id, started)
    get_run_logger().info(prepared["line"])
    if prepared["cleared_mlflow_run"]:
        study_record.forget_run(tracking.resolve_tracking_uri(p.tracking.tracking_uri),
                                prepared["cleared_mlflow_run"])
    return prepared


@task(name="study-parent-run", **_TASK)
def parent_run(params: dict[str, Any]) -> str:
    """The study's MLflow parent run, RUNNING: found by its tags, else created."""
    return study_record.parent_run(ExperimentParams.model_validate(params))


@task(name="study-finish-run", **_TASK)
def finish_run(prepared: dict[str, Any], summary: dict[str, Any]) -> None:
    """Tag the run's MLflow child run; mark the run finished with its wall seconds."""
    p = ExperimentParams.model_validate(prepared["params"])
    study_record.tag_run(p, summary["mlflow_run_id"], prepared["tags"])
    prog.mark_finished(Path(prepared["folder"]), time.monotonic() - prepared["started"])


@task(name="study-report", **_TASK)
def report(params: dict[str, Any]) -> dict[str, Any]:
    """report.md, report.json, seeds.md and the PNGs; the headline as
    `<metrics_dir>/<study_label>.json` and the per-seed table beside it (committed in git)."""
    p = ExperimentParams.model_validate(params)
    result = build_report(p, find_root())
    metrics = Path(tracking.stage_metrics(p, p.study_label))
    write_headline(result, metrics)
    write_seeds(result, metrics.with_name(f"{metrics.stem}_seeds.md"))
    get_run_logger().info("\n".join(result["verdict"]))
    return result


@task(name="study-log-report", **_TASK)
def log_report(params: dict[str, Any], run_id: str, result: dict[str, Any]) -> None:
    """The report's files and headline on the parent run, which is then FINISHED."""
    p = ExperimentParams.model_validate(params)
    study_record.log_report(p, run_id, headline(result), find_root() / p.study.out_dir)
