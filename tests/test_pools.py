"""Work pools and workers (`commands/pools.py`, `prefect.yaml`): the deployments' checks, and two
process workers of one real project server running two CI trainings, one device between them.

The end-to-end test runs in the CI pipeline's clone (its data and warm-up): `python -m
commands.pools deploy` registers prefect.yaml's deployments with a server on a free port, two
`python -m commands.pools worker` processes poll the pool, and the CI ProRL and BroRL arms are
submitted together. Each worker runs one; the machine's one device limit (its CPU) makes the
second training wait for the first, so their MLflow runs (opened inside the slot) do not overlap;
both MLflow runs hold system metrics. Every process it starts is gone at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from brorl.system.servers import free_port, stop
from commands import pools, server

ROOT = Path(__file__).resolve().parents[1]
PREFECT_FILE = ROOT / "prefect.yaml"
ARMS = ("prorl_ci", "brorl_ci")
SHORT = {"prorl_ci": ["train.max_rollouts=64"], "brorl_ci": []}
"""One step each: ProRL-CI's 4 x 16 rollouts (its params allow four), BroRL-CI's 1 x 256."""


def test_every_deployment_validates_and_writes_only_under_outputs_scheduled():
    names = pools.check_deployments(PREFECT_FILE, {pools.POOL})
    assert {"train/prorl_ci", "train/brorl_ci", "train/prorl", "evaluate/prorl",
            "study-run/study", "compare/compare"} <= set(names)
    for entry in pools.deployments(PREFECT_FILE):
        assert entry["work_pool"]["name"] == pools.POOL
        for override in entry["parameters"]["overrides"]:
            key, _, value = override.partition("=")
            if key.endswith(("path", "dir")):
                assert value.startswith("outputs/scheduled/"), (entry["name"], override)
        for schedule in entry.get("schedules") or []:
            assert schedule["active"] is False  # a fresh worker trains nothing by itself


def _copy(tmp_path: Path, edit) -> Path:
    """prefect.yaml beside copies of params/, params.yaml and flows/ (its paths resolve there),
    edited."""
    for folder in ("params", "flows"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    shutil.copy(ROOT / "params.yaml", tmp_path)  # params/brorl.yaml extends it
    spec = yaml.safe_load(PREFECT_FILE.read_text())
    edit(spec["deployments"])
    path = tmp_path / "prefect.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _bad_key(deployments: list) -> None:
    deployments[0]["parameters"] = {**deployments[0]["parameters"],
                                    "overrides": ["train.stepz=3"]}


def _bad_pool(deployments: list) -> None:
    deployments[1]["work_pool"] = {"name": "gpu-pool"}


def _bad_entry(deployments: list) -> None:
    deployments[2]["entrypoint"] = "flows/train.py:trian"


@pytest.mark.parametrize("edit, words", [
    (_bad_key, ["deployment 'pipeline'", "stepz"]),
    (_bad_pool, ["work pool 'gpu-pool' does not exist", "prefect work-pool create gpu-pool"]),
    (_bad_entry, ["no function 'trian'", "flows/NAME.py:FUNCTION"]),
])
def test_a_bad_deployment_is_one_line_naming_it_and_the_fix(tmp_path, edit, words):
    path = _copy(tmp_path, edit)
    with pytest.raises(pools.DeployCheckError) as err:
        pools.check_deployments(path, {pools.POOL})
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_deploy_command_exits_2_on_a_bad_deployment_before_asking_a_server(tmp_path):
    path = _copy(tmp_path, _bad_key)
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}  # nothing answers there
    done = subprocess.run([sys.executable, "-m", "commands.pools", "deploy", "--prefect-file",
                           str(path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "stepz" in done.stderr


def _start_worker(name: str, clone: Path, env: dict, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "commands.pools", "worker", "--name", name],
                                cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _family(processes: list[subprocess.Popen]) -> set[int]:
    """The pids of `processes` and all their descendants now."""
    pids = set()
    for process in processes:
        try:
            parent = psutil.Process(process.pid)
            pids |= {parent.pid, *(p.pid for p in parent.children(recursive=True))}
        except psutil.NoSuchProcess:
            pass
    return pids


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.timeout(900)
def test_two_workers_run_two_trainings_one_device_at_a_time(tmp_path, ci_pipeline):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    clone = ci_pipeline
    for arm in ARMS:  # a rerun of the suite in the same clone starts the arms afresh
        shutil.rmtree(clone / "outputs" / "scheduled" / "train" / arm, ignore_errors=True)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    port = free_port()
    workers: list[subprocess.Popen] = []
    seen: set[int] = set()
    with server.running(port, home=tmp_path / "server", log=tmp_path / "server.log") as url:
        env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path / "client"),
               "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1",
               "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "0",
               "PYTHONPATH": str(clone)}
        try:
            deployed = subprocess.run([sys.executable, "-m", "commands.pools", "deploy"],
                                      cwd=clone, env=env, capture_output=True, text=True,
                                      timeout=300)
            assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
            for name in ("worker-a", "worker-b"):
                workers.append(_start_worker(name, clone, env, tmp_path / f"{name}.log"))
            with temporary_settings({PREFECT_API_URL: url}), \
                    get_client(sync_client=True) as client:
                deadline = time.monotonic() + 180  # both polling before any run is submitted
                while len(client.read_workers_for_work_pool(pools.POOL)) < 2:
                    assert time.monotonic() < deadline and all(w.poll() is None for w in workers)
                    time.sleep(1)
                runs = []
                for arm in ARMS:  # submitted together
                    deployment = client.read_deployment_by_name(f"train/{arm}")
                    overrides = [*deployment.parameters["overrides"], *SHORT[arm]]
                    runs.append(client.create_flow_run_from_deployment(
                        deployment.id, parameters={"overrides": overrides}))
                deadline = time.monotonic() + 720
                while True:
                    seen |= _family(workers)
                    states = [client.read_flow_run(r.id) for r in runs]
                    if all(s.state and s.state.is_final() for s in states):
                        break
                    assert time.monotonic() < deadline, [s.state for s in states]
                    time.sleep(2)
                status = pools.status(pools.POOL, stale_minutes=5)
        finally:
            for worker in workers:
                stop(worker)
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("worker-a", "worker-b")}
    for run in states:
        assert run.state.is_completed(), (run.state, logs)
    # each worker ran one of the two (a worker runs one flow run at a time, `--limit 1`)
    assert sorted(sum(str(run.id) in text for run in states) for text in logs.values()) == [1, 1]
    assert any(line.startswith("work pool brorl: 2 worker(s)") for line in status)
    # one device: the second training waited for the first
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("brorl")
    trained = [r for r in client.search_runs([experiment.experiment_id])
               if r.info.run_name in ("prorl-ci", "brorl-ci")]
    assert sorted(r.info.run_name for r in trained) == ["brorl-ci", "prorl-ci"]
    first, second = sorted(trained, key=lambda r: r.info.start_time)
    assert first.info.end_time <= second.info.start_time, "two trainings shared the device"
    for run in trained:
        assert run.info.status == "FINISHED"
        assert "system/cpu_utilization_percentage" in run.data.metrics
        assert "system/system_memory_usage_megabytes" in run.data.metrics
    for arm in ARMS:
        assert (clone / "outputs" / "scheduled" / "train" / arm / "run").is_dir()
    # nothing it started is left: workers, their flow-run processes, the server
    assert not _alive(seen), _alive(seen)


def test_status_warns_in_the_run_log_when_no_worker_polls(tmp_path):
    """No worker ever started: a due flow run waits; `status` says so and writes it into the
    run's log."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = free_port()
    with server.running(port, home=tmp_path / "server", log=tmp_path / "server.log") as url, \
            temporary_settings({PREFECT_API_URL: url}):
        os.environ["PREFECT_API_URL"] = url
        try:
            pools.setup()
            with get_client(sync_client=True) as client:
                flow_id = client.create_flow_from_name("train")
                deployment_id = client.create_deployment(
                    flow_id=flow_id, name="waiting", work_pool_name=pools.POOL,
                    entrypoint="flows/train.py:train",
                    parameters={"params_path": "params/prorl_ci.yaml"})
                run = client.create_flow_run_from_deployment(deployment_id)
                lines = pools.status(pools.POOL, stale_minutes=0)
                with pytest.raises(pools.DeployCheckError) as err:
                    pools.status("gpu-pool", stale_minutes=0)
                unknown = str(err.value)
                logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        finally:
            del os.environ["PREFECT_API_URL"]
    [warning] = [line for line in lines if line.startswith("warning:")]
    assert "work pool 'gpu-pool' does not exist" in unknown and "\n" not in unknown
    assert "no worker has ever polled it" in warning and "make worker" in warning
    assert any("make worker" in log.message for log in logs)


@pytest.mark.parametrize("enabled", ["true", "false"])
def test_every_run_logs_system_metrics_unless_switched_off(mlflow_uri, monkeypatch, enabled):
    """A run shorter than the sampling interval still holds one sample; MLflow's own switch
    turns it off. (`mlflow_uri`: mlflow.set_tracking_uri sets MLFLOW_TRACKING_URI in this
    process's environment, which the fixture restores, so later tests' children never inherit
    this test's store.)"""
    from mlflow.tracking import MlflowClient

    import tracking

    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", enabled)
    uri = mlflow_uri
    with tracking.mlflow_run("brorl", uri, "short", {}) as run_id:
        pass
    metrics = MlflowClient(uri).get_run(run_id).data.metrics
    system = {k for k in metrics if k.startswith("system/")}
    if enabled == "true":
        assert {"system/cpu_utilization_percentage",
                "system/system_memory_usage_megabytes"} <= system
    else:
        assert not system
