"""Scheduled deployments (`commands/deploy.py`) served against a real local server
(`commands/server.py`).

The end-to-end test starts `prefect server start` on a free port (its scheduler looping every
2 s), serves `train` and `evaluate` (the default served flows) from a `python -m
commands.deploy` child process in the CI pipeline's clone (its data and trained arms), the evaluate deployment on
an interval of 20 s: nothing triggers it by hand, the server's scheduler creates its run and the
serving process runs it. It checks that run's state, its files, its MLflow run and the
schedules; every process is stopped even on failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from brorl.system.servers import free_port, stop
from commands import deploy, server

ROOT = Path(__file__).resolve().parents[1]
CI_PARAMS = "params/simulate_ci.yaml"
NEVER = "0 0 1 1 *"  # 1 January, midnight: registered, but no run fires during the test
EVERY_S = 20
"""The evaluate deployment's interval in the end-to-end test: its first run fires by itself."""


def test_schedule_options_override_the_table_and_parameters_carry_params_and_overrides():
    args = deploy.parser().parse_args(["--params", CI_PARAMS, "--flow", "simulate",
                                       "--simulate-interval", "3600", "-S", "simulate.num_seeds=1"])
    [served] = deploy.build_deployments(args)
    assert (served.flow_name, served.name) == ("simulate", "simulate_ci")
    assert served.schedules[0].schedule.interval == timedelta(hours=1)
    assert served.parameters == {"params_path": str(ROOT / CI_PARAMS), "overrides": [
        *deploy.scheduled_overrides("simulate", CI_PARAMS), "simulate.num_seeds=1"]}
    assert served.entrypoint == "flows.simulate.simulate"

    [default] = deploy.build_deployments(deploy.parser().parse_args(
        ["--params", CI_PARAMS, "--flow", "simulate"]))
    assert default.schedules[0].schedule.cron == deploy.SERVED["simulate"][1][1]


def _dvc_outputs() -> list[Path]:
    """Every `outs`, `metrics` and `plots` path of dvc.yaml, study/dvc.yaml and
    pipelines/smollm2/dvc.yaml, as DVC resolves them (`${...}` included)."""
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        outs = [Path(o.fs_path).relative_to(ROOT) for o in repo.index.outs]
    pipelines = {Path(o.stage.path).relative_to(ROOT).as_posix() for o in repo.index.outs}
    assert {"dvc.yaml", "study/dvc.yaml", "pipelines/smollm2/dvc.yaml"} <= pipelines
    return outs


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


@pytest.mark.parametrize("params", ["params/prorl.yaml", "params/brorl.yaml", CI_PARAMS,
                                    "params/simulate.yaml", "params/smollm2_prorl.yaml"])
def test_every_scheduled_deployment_writes_outside_every_dvc_stage_output(params):
    from brorl.params import load_params

    outs = _dvc_outputs()
    for name in deploy.SERVED:
        args = deploy.parser().parse_args(["--params", params, "--flow", name])
        p = load_params(ROOT / params, deploy.deployment_overrides(name, args))
        t = p.tracking
        written = [Path(t.output_dir), Path(t.metrics_dir), Path(t.plots_dir)]
        if name == "train":
            written += [Path(p.train.run_dir), Path(p.train.checkpoint_dir)]
        for folder in written:
            assert folder.is_relative_to(f"{deploy.SCHEDULED_DIR}/{name}"), (name, folder)
            hit = [out for out in outs if _overlap(folder, out)]
            assert not hit, f"{name}/{Path(params).stem} writes {folder}, a DVC output: {hit}"


def test_a_misspelt_params_key_exits_2_naming_it_before_anything_is_served(capsys):
    with pytest.raises(SystemExit) as exit_info:
        deploy.main(["--params", CI_PARAMS, "--flow", "simulate", "-S", "simulate.bogus=1"])
    assert exit_info.value.code == 2
    assert "simulate.bogus: unknown key" in capsys.readouterr().err


def test_an_invalid_cron_and_a_flow_missing_from_the_checkout_are_named(monkeypatch):
    args = deploy.parser().parse_args(["--params", CI_PARAMS, "--flow", "simulate",
                                       "--simulate-cron", "61 * * * *"])
    with pytest.raises(deploy.DeployError, match="Invalid cron string"):
        deploy.build_deployments(args)
    monkeypatch.setitem(deploy.SERVED, "simulate", ("flows.not_written_yet:flow", ("cron", NEVER)))
    with pytest.raises(deploy.DeployError, match="no module flows.not_written_yet"):
        deploy.load_flow("simulate")


def test_foreground_command_sees_the_server_api_url():
    code = "import os, sys; sys.exit(0 if os.environ['PREFECT_API_URL'] == 'http://x/api' else 3)"
    assert server._run_foreground([sys.executable, "-c", code], "http://x/api") == 0


def test_sigterm_stops_the_foreground_command_and_what_it_started(tmp_path: Path):
    """`dvc repro` killed alone leaves its stage running: SIGTERM must reach the whole command."""
    pid_file = tmp_path / "grandchild.pid"
    command = ["bash", "-c", f"sleep 300 & echo $! > {pid_file}; wait"]
    code = (f"from commands.server import _run_foreground\n"
            f"raise SystemExit(_run_foreground({command!r}, 'http://x/api'))")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and parent.poll() is None, "the command never started"
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) != 0
    deadline = time.monotonic() + 60  # a hang, not a slow machine: SIGTERM ended its group
    while Path(f"/proc/{grandchild}").exists() and \
            Path(f"/proc/{grandchild}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, f"the command's child {grandchild} outlived SIGTERM"
        time.sleep(0.05)


async def _wait_for_deployments(names: list[str], serving: subprocess.Popen, log: Path,
                                timeout_s: float = 150) -> dict:
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout_s
    async with get_client() as client:
        while True:
            assert serving.poll() is None, f"commands.deploy exited:\n{log.read_text()[-3000:]}"
            try:
                return {n: await client.read_deployment_by_name(n) for n in names}
            except ObjectNotFound:
                assert time.monotonic() < deadline, f"not served in time:\n{log.read_text()[-3000:]}"
                await asyncio.sleep(1)


async def _wait_for_scheduled_run(deployment_id, serving: subprocess.Popen, log: Path,
                                  timeout_s: float = 300):
    """The first run of the deployment that the scheduler created, once it is final."""
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deadline = time.monotonic() + timeout_s
    async with get_client() as client:
        while True:
            assert serving.poll() is None, f"commands.deploy exited:\n{log.read_text()[-3000:]}"
            runs = await client.read_flow_runs(deployment_filter=DeploymentFilter(
                id=DeploymentFilterId(any_=[deployment_id])))
            done = [r for r in runs if r.state is not None and r.state.is_final()]
            if done:
                return min(done, key=lambda r: r.expected_start_time)
            assert time.monotonic() < deadline, f"no scheduled run ended:\n{log.read_text()[-3000:]}"
            await asyncio.sleep(1)


async def _read_deployment(name: str):
    from prefect import get_client

    async with get_client() as client:
        return await client.read_deployment_by_name(name)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM (prefect's runner shuts down and pauses its schedules), then SIGKILL the group.
    The runner first lets a flow run it already started finish (the next scheduled evaluation,
    over a minute on a loaded machine: a 45 s wait once killed it before the pause)."""
    process.terminate()
    try:
        process.wait(180)
    except subprocess.TimeoutExpired:
        stop(process, grace_s=0)


@pytest.mark.slow  # a served deployment on a real server waits for its schedule: about a minute
@pytest.mark.timeout(600)
def test_served_evaluate_deployment_runs_on_its_own_schedule_on_a_real_server(
        tmp_path, mlflow_uri, ci_pipeline):
    from mlflow.tracking import MlflowClient
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port, log, arm = free_port(), tmp_path / "serve.log", "params/prorl_ci.yaml"
    command = [sys.executable, "-m", "commands.deploy", "--params", arm, "--limit", "1",
               "--train-cron", NEVER, "--evaluate-interval", str(EVERY_S),
               "-S", f"tracking.output_dir={tmp_path / 'output_dir'}"]
    scheduler = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2"}
    with log.open("w") as out, \
            server.running(port, home=tmp_path / "server", log=tmp_path / "server.log",
                           settings=scheduler) as url:
        env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path / "client"),
               "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
        serving = subprocess.Popen(command, cwd=ci_pipeline, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with temporary_settings({PREFECT_API_URL: url}):
                names = ["train/prorl_ci", "evaluate/prorl_ci"]
                deployments = asyncio.run(_wait_for_deployments(names, serving, log))
                run = asyncio.run(_wait_for_scheduled_run(
                    deployments["evaluate/prorl_ci"].id, serving, log))
                assert run.state.is_completed(), f"{run.state}\n{log.read_text()[-3000:]}"
                assert run.auto_scheduled  # the scheduler made it; nothing here triggered it
                _stop(serving)
                paused = asyncio.run(_read_deployment("evaluate/prorl_ci")).paused
        finally:
            if serving.poll() is None:
                stop(serving, grace_s=0)

    [train_schedule] = deployments["train/prorl_ci"].schedules
    assert train_schedule.schedule.cron == NEVER and train_schedule.active
    [evaluate_schedule] = deployments["evaluate/prorl_ci"].schedules
    assert evaluate_schedule.schedule.interval == timedelta(seconds=EVERY_S)
    for deployment in deployments.values():
        assert deployment.parameters["params_path"] == str(ci_pipeline / arm)
    assert paused, "stopping the serving process pauses its schedules"
    # the evaluate flow scored the arm's final policy (the run's default checkpoint)
    result = json.loads((tmp_path / "output_dir" / "evaluate" / "prorl-ci.json").read_text())
    assert result["checkpoint"] == str(ci_pipeline / "outputs" / "ci" / "prorl" / "policy")
    assert set(result["scores"]["family"]) == {"math", "code", "reasoning"}
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("brorl").experiment_id])
    finished = [r for r in runs if r.info.status == "FINISHED"]  # a later interval may have begun
    assert finished and all(r.data.tags["stage"] == "evaluate" for r in runs)
    for evaluation in finished:  # the same checkpoint, instances and seed: the same scores
        for family, row in result["scores"]["family"].items():
            assert evaluation.data.metrics[f"eval/pass_at_1_{family}"] == row["pass_at_1"]
