"""Prefect tasks of one RL run: each a thin wrapper around one `brorl.train.Run` call.

The run (model, optimizer, rollout engine, counters) is a `Run` object passed to every task in
this process: tasks are called directly inside the flow (`persist_result=False`, no cache), so
nothing big is pickled or sent to the Prefect API. Each stage task runs one stage method of the
run (`STAGES`: `Run.verify` -> `verify`); the flow's driver (`flows/train.py`) runs each stage
the loop hands it through its task.
`verify` retries (a verifier crash is transient); `ppo_update` and `checkpoint` never do (a
retry would apply an update twice). The run's MLflow record is `tracking/train_record.py`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError

from brorl.params import ExperimentParams
from brorl.system.checkout import find_root
from brorl.train import Run
from brorl.train.collection import Collection
from brorl.train.report import dvc_files, step_line
from brorl.types import Timed
from tracking import train_record
from tracking.train_record import Tracker

_TASK = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="open-run", **_TASK)
def open_run(params: ExperimentParams) -> Run:
    """Build (or resume, from the newest checkpoint) the run of `params`."""
    return Run.open(params, find_root())


@task(name="start-mlflow-run", **_TASK)
def start_tracking(run: Run, params: ExperimentParams,
                   parent_run_id: str | None = None) -> Tracker:
    """The run's MLflow run, new or reopened (`train_record.open_record`)."""
    return train_record.open_record(run, params, parent_run_id, run_logger())


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The flow run's logger; the module's outside a flow (the task functions called directly)."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def log_step(tracker: Tracker, step: int, metrics: dict[str, float], name: str) -> None:
    """A finished step's metrics to MLflow (queued), its progress line to the flow log. Not a
    task: the flow's driver calls it once per step (a task run would cost more than the call)."""
    train_record.log_step_metrics(tracker, step, metrics)
    run_logger().info(step_line(name, step, metrics))


@task(name="sample_prompts", **_TASK)
def sample_prompts(run: Run, collection: Collection) -> Timed:
    return run.sample_prompts(collection)


@task(name="generate_rollouts", **_TASK)
def generate_rollouts(run: Run, problems: list, collection: Collection) -> Timed:
    return run.generate_rollouts(problems, collection)


@task(name="verify", retries=2, retry_delay_seconds=1, **_TASK)
def verify(run: Run, problems: list, batch: Any, collection: Collection) -> Timed:
    return run.verify(problems, batch, collection)


@task(name="filter", **_TASK)
def filter_groups(run: Run, collection: Collection, groups: Any, seconds: dict) -> Timed:
    return run.filter(collection, groups, seconds)


@task(name="ppo_update", **_TASK)
def ppo_update(run: Run, collection: Collection | None) -> Timed:
    return run.ppo_update(collection)


@task(name="evaluate", **_TASK)
def evaluate(run: Run, rows: list | None = None) -> Timed:
    return run.evaluate(rows)


@task(name="checkpoint", **_TASK)
def checkpoint(run: Run) -> Timed:
    return run.checkpoint()


STAGES: dict[Callable[..., Timed[Any]], Task[..., Timed[Any]]] = {
    Run.sample_prompts: sample_prompts, Run.generate_rollouts: generate_rollouts,
    Run.verify: verify, Run.filter: filter_groups, Run.ppo_update: ppo_update,
    Run.evaluate: evaluate, Run.checkpoint: checkpoint}
"""Stage method of `brorl.train.Run` -> its task."""


@task(name="finish-run", **_TASK)
def finish_run(run: Run, tracker: Tracker, p: ExperimentParams) -> dict[str, Any]:
    """Final checkpoint and policy folder, summary, DVC metrics and plot files, the MLflow
    record closed (`train_record.close_record`)."""
    summary = run.finish()
    root = find_root()
    dvc_files(run.state, root / p.tracking.metrics_dir / f"{p.run_label}.json",
              root / p.tracking.plots_dir / p.run_label / "eval.csv")
    version = train_record.close_record(tracker, run, p, summary["policy"])
    return {**{k: v for k, v in summary.items() if k != "history"},
            "mlflow_run_id": tracker.run_id, "model_version": version}


@task(name="fail-run", **_TASK)
def fail_run(tracker: Tracker | None) -> None:
    """Mark the MLflow run failed (the checkpoint on disk stays, a rerun resumes it)."""
    if tracker is not None:
        train_record.fail_record(tracker)
