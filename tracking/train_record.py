"""A training run's MLflow record: its MLflow run opened or reopened, backfilled, fed, closed.

One training run is one MLflow run, its id kept in `<run_dir>.mlflow_run.json` beside the run's
folder (`brorl.runs.folder.mlflow_marker`: a new id in every fresh run, so not inside what DVC
hashes): reopened when the run resumes from a checkpoint, and also when it was killed before its
first one (a run that is not FINISHED). A step's metrics go in one asynchronous `log_batch`,
flushed when the run ends; the final policy becomes a version of the registered model named
after the arm. The Prefect tasks of a run (`tasks/train.py`) and the flow's driver
(`tasks.train.log_step`) call these; this module defines no task and imports no prefect: a
warning goes to the logger the caller passes.

Deliberately ignored: remote artifact stores (artifacts are logged from the run's own folder).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

import tracking
from brorl.evaluation.protocol import eval_metrics
from brorl.params import ExperimentParams
from brorl.runs.folder import mlflow_marker
from brorl.runs.machine import machine_path
from brorl.runs.timings import timings_path
from brorl.system.checkout import in_checkout
from brorl.train import Run

_LOG = logging.getLogger(__name__)
STEP_KEYS = ("train/step", "train/seconds_total")
"""Metrics logged at step 0 and at every later step: their last step is what a run holds."""


@dataclass(frozen=True)
class Tracker:
    """Where a run's metrics go: its MLflow run and store, and the last step it already holds
    (a resumed run replays the steps after its checkpoint: they are not logged twice)."""

    run_id: str
    tracking_uri: str
    logged_through: int = -1


def open_record(run: Run, p: ExperimentParams, parent_run_id: str | None,
                log: logging.Logger | logging.LoggerAdapter = _LOG) -> Tracker:
    """The run's MLflow run: the one `<run_dir>.mlflow_run.json` names, reopened and backfilled,
    or a new one. A marker naming a run the store does not have is reported (to `log`) and
    replaced."""
    uri = tracking.resolve_tracking_uri(p.tracking.tracking_uri)
    marker, client = mlflow_marker(run.run_dir), MlflowClient(uri)
    if marker.is_file():
        run_id = json.loads(marker.read_text())["run_id"]
        try:
            status = client.get_run(run_id).info.status
        except MlflowException:
            log.warning(
                f"{marker} names MLflow run {run_id}, which the store {uri} does not have; "
                "this run is recorded in a new MLflow run.")
            status = None
        if status is not None and (run.trainer.resumed_from is not None or status != "FINISHED"):
            client.update_run(run_id, status="RUNNING")
            client.set_tag(run_id, "resumed_at_step", str(run.step_count))
            logged = [m.step for key in STEP_KEYS for m in client.get_metric_history(run_id, key)]
            tracking.start_system_metrics(run_id, uri, resume=True)
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
    tracking.start_system_metrics(run_id, uri)
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


def run_tags(p: ExperimentParams) -> dict[str, str]:
    """What identifies an arm: algorithm, B, N, seed and the data's content hash."""
    return {"algorithm": p.train.algorithm, "rollouts_per_prompt": str(p.update.rollouts_per_prompt),
            "prompts_per_step": str(p.update.prompts_per_step), "seed": str(p.train.seed),
            "data_path": p.data.path,
            "data_version": tracking.data_version(in_checkout(p.data.path))}


def log_step_metrics(tracker: Tracker, step: int, metrics: dict[str, float]) -> None:
    """A step's metrics to MLflow in one asynchronous batch, unless the run already holds that
    step (a resumed run's replay)."""
    if step > tracker.logged_through:
        tracking.log_metric_series(tracker.tracking_uri, tracker.run_id, [step],
                                   {k: [v] for k, v in metrics.items()}, synchronous=False)


def close_record(tracker: Tracker, run: Run, p: ExperimentParams, policy: str) -> str:
    """The finished run's summary, evaluations, timings (`brorl.runs.timings`), machine record
    (`brorl.runs.machine`) and `policy` folder as artifacts, the policy as a new version of the
    arm's registered model (returned), the MLflow run FINISHED."""
    client = MlflowClient(tracker.tracking_uri)
    for artifact in (run.run_dir / "summary.json", run.run_dir / "evals.jsonl",
                     timings_path(run.run_dir), machine_path(run.run_dir)):
        if artifact.is_file():
            client.log_artifact(tracker.run_id, str(artifact))
    client.log_artifacts(tracker.run_id, policy, artifact_path="policy")
    version = tracking.register_policy(tracker.tracking_uri, tracker.run_id, p.name, run_tags(p))
    tracking.stop_system_metrics(tracker.run_id)
    tracking.flush()
    client.set_terminated(tracker.run_id, status="FINISHED")
    return version


def fail_record(tracker: Tracker) -> None:
    """The MLflow run FAILED, its queued metrics flushed first."""
    tracking.stop_system_metrics(tracker.run_id)
    tracking.flush()
    MlflowClient(tracker.tracking_uri).set_terminated(tracker.run_id, status="FAILED")
