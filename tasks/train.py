"""Prefect tasks of one RL run: each a thin wrapper around one `brorl.train.Run` call.

The run (model, optimizer, rollout engine, counters) is a `Run` object passed to every task in
this process: tasks are called directly inside the flow (`persist_result=False`, no cache), so
nothing big is pickled or sent to the Prefect API. The stage tasks carry the names of the run's
stage methods (`STAGES`); the flow's driver (`flows/train.py`) runs each stage through them.
`verify` retries (a verifier crash is transient); `ppo_update` and `checkpoint` never do (a
retry would apply an update twice). MLflow: one run per training run, reopened on resume; a
step's metrics go in one asynchronous `log_batch`, flushed when the run ends; the final policy
becomes a version of the registered model named after the arm.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError

from brorl.evals import eval_metrics
from brorl.params import ExperimentParams
from brorl.train import Run
from brorl.train.report import dvc_files, step_line
from brorl.types import Timed
from brorl.train.collection import Collection
from tasks import tracking

_TASK = dict(cache_policy=NO_CACHE, persist_result=False)


@dataclass(frozen=True)
class Tracker:
    """Where a run's metrics go: its MLflow run and store, and the last step it already holds
    (a resumed run replays the steps after its checkpoint: they are not logged twice)."""

    run_id: str
    tracking_uri: str
    logged_through: int = -1


@task(name="open-run", **_TASK)
def open_run(params: dict[str, Any]) -> Run:
    """Build (or resume, from the newest checkpoint) the run of `params`."""
    return Run.open(ExperimentParams.model_validate(params), tracking.ROOT)


STEP_KEYS = ("train/step", "train/seconds_total")
"""Metrics logged at step 0 and at every later step: their last step is what a run holds."""


@task(name="start-mlflow-run", **_TASK)
def start_tracking(run: Run, params: dict[str, Any], parent_run_id: str | None = None) -> Tracker:
    """The run's MLflow run, its id kept in `<run_dir>/mlflow_run.json`: reopened when the run
    resumes from a checkpoint, and also when it was killed before its first one (a run that is
    not FINISHED), so one training run is one MLflow run. A marker naming a run the store does
    not have is reported and replaced by a new run."""
    p = ExperimentParams.model_validate(params)
    uri = tracking.resolve_tracking_uri(p.tracking.tracking_uri)
    marker, client = run.run_dir / "mlflow_run.json", MlflowClient(uri)
    if marker.is_file():
        run_id = json.loads(marker.read_text())["run_id"]
        try:
            status = client.get_run(run_id).info.status
        except MlflowException:
            _logger().warning(
                f"{marker} names MLflow run {run_id}, which the store {uri} does not have; "
                "this run is recorded in a new MLflow run.")
            status = None
        if status is not None and (run.trainer.resumed_from is not None or status != "FINISHED"):
            client.update_run(run_id, status="RUNNING")
            client.set_tag(run_id, "resumed_at_step", str(run.step_count))
            logged = [m.step for key in STEP_KEYS for m in client.get_metric_history(run_id, key)]
            return Tracker(run_id, uri, backfill(uri, run_id, run, max(logged, default=-1)))
    tags = {**run_tags(p), "git_commit": tracking.git_commit(), "stage": "train",
            "params_name": p.name, "mlflow.runColor": tracking.RUN_COLOURS[p.train.algorithm]}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    experiment_id = tracking.ensure_experiment(p.tracking.experiment, uri)
    run_id = client.create_run(experiment_id, run_name=p.name, tags=tags).info.run_id
    tracking.log_params(uri, run_id, {**p.model_dump(mode="json"), "derived": {"lr": p.update.lr}})
    run.run_dir.mkdir(parents=True, exist_ok=True)
    params_file = run.run_dir / "params.json"
    params_file.write_text(json.dumps(p.model_dump(mode="json"), indent=1) + "\n")
    client.log_artifact(run_id, str(params_file))
    marker.write_text(json.dumps({"run_id": run_id}) + "\n")
    return Tracker(run_id, uri)


def backfill(uri: str, run_id: str, run: Run, logged_through: int) -> int:
    """Log the steps up to the resumed checkpoint that the MLflow run lacks (a kill can lose
    the asynchronous batches of the last steps before it), from the run's own records: the
    step-0 evaluation and each step's metrics. Returns the last step the run now holds."""
    points: dict[int, dict[str, float]] = {}
    if logged_through < 0:
        start = [row for row in run.state.evals if row["step"] == 0]
        if start:
            points[0] = {"train/step": 0.0}
            for row in start:
                points[0].update(eval_metrics(row))
    for step, metrics in enumerate(run.state.history, start=1):
        if step > logged_through:
            points[step] = metrics
    for step, metrics in sorted(points.items()):
        tracking.log_metric_series(uri, run_id, [step], {k: [v] for k, v in metrics.items()})
    return max([logged_through, *points])


def _logger() -> logging.Logger | logging.LoggerAdapter:
    """The flow run's logger; the module's outside a flow (the task functions called directly)."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def run_tags(p: ExperimentParams) -> dict[str, str]:
    """What identifies an arm: algorithm, B, N, seed and the data's content hash."""
    return {"algorithm": p.train.algorithm, "rollouts_per_prompt": str(p.update.rollouts_per_prompt),
            "prompts_per_step": str(p.update.prompts_per_step), "seed": str(p.train.seed),
            "data_path": p.data.path,
            "data_version": tracking.data_version(tracking.ROOT / p.data.path)}


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


STAGES = {"sample_prompts": sample_prompts, "generate_rollouts": generate_rollouts,
          "verify": verify, "filter": filter_groups, "ppo_update": ppo_update,
          "evaluate": evaluate, "checkpoint": checkpoint}
"""Stage method name of `brorl.train.Run` -> its task."""


def log_step(tracker: Tracker, step: int, metrics: dict[str, float], name: str) -> None:
    """A step's metrics to MLflow in one asynchronous batch (unless the run already holds that
    step: a resumed run's replay); a progress line to the flow log. Not a task: it runs once
    per step in the flow's own context and only queues (a task run would cost more than the
    call)."""
    if step > tracker.logged_through:
        tracking.log_metric_series(tracker.tracking_uri, tracker.run_id, [step],
                                   {k: [v] for k, v in metrics.items()}, synchronous=False)
    _logger().info(step_line(name, step, metrics))


@task(name="finish-run", **_TASK)
def finish_run(run: Run, tracker: Tracker, params: dict[str, Any]) -> dict[str, Any]:
    """Final checkpoint and policy folder, summary, DVC metrics and plot files, MLflow
    artifacts, the policy as a new version of the arm's registered model."""
    p = ExperimentParams.model_validate(params)
    summary = run.finish()
    metrics_path = tracking.ROOT / p.tracking.metrics_dir / f"{p.run_label}.json"
    plot_path = tracking.ROOT / p.tracking.plots_dir / p.run_label / "eval.csv"
    dvc_files(run.state, metrics_path, plot_path)
    client = MlflowClient(tracker.tracking_uri)
    for artifact in (run.run_dir / "summary.json", run.run_dir / "evals.jsonl"):
        if artifact.is_file():
            client.log_artifact(tracker.run_id, str(artifact))
    client.log_artifacts(tracker.run_id, summary["policy"], artifact_path="policy")
    version = tracking.register_policy(tracker.tracking_uri, tracker.run_id, p.name, run_tags(p))
    tracking.flush()
    client.set_terminated(tracker.run_id, status="FINISHED")
    return {**{k: v for k, v in summary.items() if k != "history"},
            "mlflow_run_id": tracker.run_id, "model_version": version}


@task(name="fail-run", **_TASK)
def fail_run(tracker: Tracker | None) -> None:
    """Mark the MLflow run failed (the checkpoint on disk stays, a rerun resumes it)."""
    if tracker is not None:
        tracking.flush()
        MlflowClient(tracker.tracking_uri).set_terminated(tracker.run_id, status="FAILED")
