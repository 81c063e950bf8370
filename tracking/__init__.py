"""MLflow plumbing shared by the tasks and flows: where the store is, runs, params, batched metrics.

The `tracking` package records runs and writes nothing else; it imports brorl and the tracking
libraries only, no prefect: a logger comes in from the tasks (tests/test_layering.py). A training
run's record is `tracking.train_record`, a study's parent run `tracking.study_record`.

Local default: a SQLite store `mlflow.db` and an artifact folder `mlartifacts/` at the root of
the checkout the command runs in (`brorl.system.checkout`; platform notes: the `./mlruns` file store
is deprecated). `MLFLOW_TRACKING_URI`, then the params' `tracking.tracking_uri`, override it.
Metric names are sanitised to what MLflow accepts (verl#119: `@` and parentheses crash it), and
a step's metrics go in one `log_batch` call.

Every run opened here logs system metrics while it is open (`system_metrics`: MLflow's own
monitor, `system/cpu_utilization_percentage`, `system/system_memory_usage_megabytes`, and the
GPUs' utilisation and memory where NVML answers), every `MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`
seconds (brorl's default 10, `brorl.system.environment`), at least one sample per run however short;
`MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=false` turns it off. Both are MLflow's own switches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from brorl.system.checkout import CheckoutError, find_root, in_checkout

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-./ ]")
_MAX_PARAM_VALUE = 6000
_BATCH = 900  # MLflow's log_batch takes at most 1000 metrics per call
RUN_COLOURS = {"prorl": "#1f77b4", "brorl": "#ff7f0e"}
"""Each arm's line colour in the MLflow UI (its `mlflow.runColor` tag; matplotlib's first two,
as in the reports): ProRL and BroRL keep their colours in every chart and run, instead of a
colour hashed from the run id, which can give both arms the same one."""


def resolve_tracking_uri(configured: str | None = None) -> str:
    """$MLFLOW_TRACKING_URI, else the params value, else the checkout's SQLite store."""
    return (os.environ.get("MLFLOW_TRACKING_URI") or configured
            or f"sqlite:///{find_root() / 'mlflow.db'}")


def stage_metrics(params: ExperimentParams, label: str) -> str:
    """Where a stage writes its headline for DVC: `<tracking.metrics_dir>/<label>.json`."""
    return str(in_checkout(params.tracking.metrics_dir) / f"{label}.json")


def record_stage(log: Callable[[dict, dict, str, str], str], params: ExperimentParams,
                 sections: set[str], result: dict[str, Any]) -> dict[str, Any]:
    """A stage's one MLflow run: `log(logged, result, experiment, uri)` with the experiment's
    name and its `sections` as the logged params; `result` with the run's id added."""
    logged = {"name": params.name, **params.model_dump(mode="json", include=sections)}
    uri = resolve_tracking_uri(params.tracking.tracking_uri)
    return {**result, "mlflow_run_id": log(logged, result, params.tracking.experiment, uri)}


def ensure_experiment(name: str, tracking_uri: str) -> str:
    """The experiment id for `name`, created with an artifact folder beside a SQLite store."""
    mlflow.set_tracking_uri(tracking_uri)
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        store = Path(tracking_uri.removeprefix("sqlite:///")).parent
        location = (store / "mlartifacts" / name).resolve().as_uri()
    return mlflow.create_experiment(name, artifact_location=location)


def sanitize_key(key: str) -> str:
    """A metric or param name MLflow accepts: other characters become `_`."""
    return _BAD_KEY_CHARS.sub("_", key)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested params -> {'section.key': 'value'} with lists and None rendered as JSON."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, (list, tuple, type(None))) else str(value)
    return flat


def git_commit() -> str:
    """The checkout's HEAD commit, or 'unknown' outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=find_root(), capture_output=True,
                             text=True, timeout=10, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError, CheckoutError):
        return "unknown"


def data_version(path: Path | str) -> str:
    """Content hash of a data folder: sha256 over its files' relative paths and bytes, in path
    order, first 16 hex digits. Equal data gives equal versions on any machine or clone; a
    checkpoint's run carries the version of the data it trained on ('missing' if absent)."""
    root = Path(path)
    if not root.exists():
        return "missing"
    digest = hashlib.sha256()
    for file in sorted(f for f in root.rglob("*") if f.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


@contextmanager
def mlflow_run(experiment: str, tracking_uri: str, run_name: str, tags: Mapping[str, str],
               parent_run_id: str | None = None, run_id: str | None = None) -> Iterator[str]:
    """Open (or, with `run_id`, reopen) a run and yield its id; nested under `parent_run_id`."""
    experiment_id = ensure_experiment(experiment, tracking_uri)
    all_tags = {"git_commit": git_commit(), **tags}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    client = MlflowClient(tracking_uri)
    reopened = run_id is not None
    if run_id is None:
        run_id = client.create_run(experiment_id, run_name=run_name, tags=all_tags).info.run_id
    else:
        client.update_run(run_id, status="RUNNING")
    try:
        with system_metrics(run_id, tracking_uri, resume=reopened):
            yield run_id
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")


@contextmanager
def system_metrics(run_id: str, tracking_uri: str, resume: bool = False) -> Iterator[None]:
    """System metrics of run `run_id` for the block (`start_system_metrics`)."""
    start_system_metrics(run_id, tracking_uri, resume)
    try:
        yield
    finally:
        stop_system_metrics(run_id)


_MONITORS: dict[str, tuple[Any, int]] = {}
"""Run id -> its system-metrics monitor and the step it started at, while the run is open in
this process."""


def start_system_metrics(run_id: str, tracking_uri: str, resume: bool = False) -> None:
    """Start MLflow's system-metrics monitor on run `run_id` (module docstring), unless
    `MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING` is false or one already runs; `resume`: a reopened
    run, its steps continued. `stop_system_metrics` stops it."""
    from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    if MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get() is False or run_id in _MONITORS:
        return
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop lines
    monitor = SystemMetricsMonitor(run_id, resume_logging=resume, tracking_uri=tracking_uri)
    monitor.collect_metrics()  # the first sample now, before the monitor's thread starts
    monitor.start()
    _MONITORS[run_id] = (monitor, monitor._logging_step)


def stop_system_metrics(run_id: str) -> None:
    """Stop run `run_id`'s monitor, if one runs, before the run is terminated. MLflow's monitor
    logs only after a full interval: a run that ends sooner logs the samples it took (at least
    the first) here."""
    if run_id not in _MONITORS:
        return
    monitor, first = _MONITORS.pop(run_id)
    monitor.finish()
    if monitor._logging_step == first:  # ended within its first interval
        if metrics := monitor.aggregate_metrics():
            monitor.publish_metrics(metrics)
            monitor.mlflow_logger.flush()


def log_params(tracking_uri: str, run_id: str, params: Mapping[str, Any]) -> None:
    """Flattened params (values truncated to MLflow's limit) in batches."""
    client = MlflowClient(tracking_uri)
    items = [Param(sanitize_key(k), v[:_MAX_PARAM_VALUE]) for k, v in flatten(params).items()]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i:i + 100])


def log_metric_series(tracking_uri: str, run_id: str, steps: list[int],
                      series: Mapping[str, list[float]], synchronous: bool = True) -> int:
    """Log `series[name][i]` at `steps[i]`, skipping NaN; returns the number of points logged.
    `synchronous=False` queues the batches on MLflow's logging thread (`flush` waits for them):
    a training step never waits on the store."""
    client = MlflowClient(tracking_uri)
    metrics = [Metric(sanitize_key(name), float(v), 0, int(step))
               for name, values in series.items() for step, v in zip(steps, values) if v == v]
    for i in range(0, len(metrics), _BATCH):
        client.log_batch(run_id, metrics=metrics[i:i + _BATCH], synchronous=synchronous)
    return len(metrics)


def flush() -> None:
    """Wait until every asynchronously logged batch is written."""
    mlflow.flush_async_logging()


def register_policy(tracking_uri: str, run_id: str, name: str, tags: Mapping[str, str],
                    artifact_path: str = "policy") -> str:
    """The run's `artifact_path` folder as a new version of registered model `name` (created
    if new), tagged with `tags`; returns the version number."""
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        client.create_registered_model(name, description=f"Policies of the {name} runs.")
    source = f"{client.get_run(run_id).info.artifact_uri}/{artifact_path}"
    version = client.create_model_version(name, source, run_id=run_id, tags=dict(tags))
    return str(version.version)


def log_artifacts(tracking_uri: str, run_id: str, paths: list[Path], subdir: str | None = None) -> None:
    """Copy files into the run's artifact store."""
    client = MlflowClient(tracking_uri)
    for path in paths:
        client.log_artifact(run_id, str(path), artifact_path=subdir)
