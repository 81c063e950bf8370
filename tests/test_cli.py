"""The `brorl` command (`commands/cli.py`): commands, params errors, one real flow, run, serve."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from commands import cli

ROOT = Path(__file__).resolve().parents[1]
CI_PARAMS = "params/simulate_ci.yaml"
runner = CliRunner()


def test_help_lists_every_command():
    result = runner.invoke(cli.app, ["--help"])
    assert result.exit_code == 0
    for command in ("run", "simulate", "data", "model", "base", "train", "compare", "evaluate",
                    "study", "serve"):
        assert f" {command} " in result.output, command


def test_installed_script_exits_2_naming_a_misspelt_key_without_a_traceback():
    script = Path(sys.executable).parent / "brorl"
    out = subprocess.run([str(script), "simulate", "--params", CI_PARAMS, "-S", "simulate.bogus=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "simulate.bogus: unknown key" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_a_value_out_of_range_exits_2_naming_key_and_value():
    result = runner.invoke(cli.app, ["train", "--params", CI_PARAMS, "--set", "simulate.steps=-3"])
    assert result.exit_code == 2
    assert "simulate.steps: Input should be greater than 0 (got -3)" in result.output


def test_a_flow_missing_from_the_checkout_fails_with_a_clear_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "flows.compare", None)  # as if flows/compare.py were absent
    result = runner.invoke(cli.app, ["compare", "--params", "params/compare_ci.yaml"])
    assert result.exit_code == 1
    assert "the compare flow is not available: no flows/compare.py" in result.output


def test_simulate_command_runs_the_flow_into_the_given_folders(prefect_harness, mlflow_uri, tmp_path):
    """`brorl simulate` writes exactly what the simulator gives for the params' N and seeds (the
    simulator is deterministic for a seed): the table, every metric, the headline, the curves, and
    one MLflow child run per N under a finished parent."""
    import json

    from mlflow.tracking import MlflowClient

    from brorl.params import load_params
    from brorl.theory import report
    from brorl.theory.simulator import SimConfig, simulate

    sets = [a for key in ("output_dir", "metrics_dir", "plots_dir")
            for a in ("-S", f"tracking.{key}={tmp_path / key}")]
    result = runner.invoke(cli.app, ["simulate", "--params", CI_PARAMS, *sets])
    assert result.exit_code == 0, result.output
    sim = load_params(ROOT / CI_PARAMS).simulate
    seeds = [sim.seed + k for k in range(sim.num_seeds)]
    expected = [simulate(SimConfig.from_params(sim), n, seeds)
                for n in sorted(set(sim.rollouts_per_prompt))]  # N = 4 and 4096
    out = tmp_path / "output_dir" / "simulate"
    assert (out / "results.md").read_text() == report.results_table(expected, sim.report_steps)
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(
        report.summary_metrics(expected, sim.report_steps), allow_nan=True))
    assert json.loads((tmp_path / "metrics_dir" / "simulate.json").read_text()) == \
        report.headline(expected)
    curves = list((tmp_path / "plots_dir" / "simulate").iterdir())
    assert curves and all(p.stat().st_size > 0 for p in curves)
    summary = json.loads(result.output[result.output.index("{"):])  # the flow's summary
    client = MlflowClient(mlflow_uri)
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["stage"] == "simulate"
    children = client.search_runs(
        [parent.info.experiment_id],
        f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(int(c.data.tags["rollouts_per_prompt"]) for c in children) == [4, 4096]
    for child, result_n in zip(sorted(children, key=lambda c: int(c.data.tags[
            "rollouts_per_prompt"])), expected):
        q_pos = client.get_metric_history(child.info.run_id, "simulate/q_pos")
        assert [m.step for m in q_pos] == result_n.steps.tolist()
        assert [m.value for m in q_pos] == pytest.approx(
            result_n.curves["q_pos"].mean(dim=0).tolist(), rel=1e-9)


def test_run_calls_dvc_repro_and_with_overrides_dvc_exp_run(monkeypatch):
    calls = []
    monkeypatch.setattr("commands.server.main", lambda argv: calls.append(argv) or 0)
    assert runner.invoke(cli.app, ["run"]).exit_code == 0
    result = runner.invoke(cli.app, ["run", "simulate", "--params", CI_PARAMS,
                                     "-S", "simulate.num_seeds=4"])
    assert result.exit_code == 0, result.output
    dvc = ["--pipeline", "--", sys.executable, "-m", "dvc"]  # one pipeline server around dvc
    assert calls == [[*dvc, "repro", "simulate", "compare"],  # not the two-hour study
                     [*dvc, "exp", "run", "-S", f"{CI_PARAMS}:simulate.num_seeds=4", "simulate"]]
    assert runner.invoke(cli.app, ["run", "-S", "simulate.num_seeds=4"]).exit_code == 2


def test_serve_starts_server_then_deploy_with_the_schedule_options_passed_on(monkeypatch):
    seen = []
    monkeypatch.setattr("commands.server.main", lambda argv: seen.append(argv) or 0)
    result = runner.invoke(cli.app, ["serve", "--params", CI_PARAMS, "-S", "simulate.num_seeds=1",
                                     "--port", "4321", "--train-cron", "0 2 * * *",
                                     "--evaluate-interval", "3600"])
    assert result.exit_code == 0, result.output
    assert seen == [["--port", "4321", "--", sys.executable, "-m", "commands.deploy",
                     "--params", CI_PARAMS, "-S", "simulate.num_seeds=1",
                     "--train-cron", "0 2 * * *", "--evaluate-interval", "3600"]]
    bad = runner.invoke(cli.app, ["serve", "--params", CI_PARAMS, "-S", "simulate.bogus=1"])
    assert bad.exit_code == 2 and len(seen) == 1


@pytest.mark.parametrize("dvc_yaml", ["dvc.yaml", "study/dvc.yaml", "pipelines/smollm2/dvc.yaml"])
def test_every_dvc_stage_runs_a_brorl_command(dvc_yaml):
    """Each stage is `scripts/brorl <its flow> --params ...`, a command the `brorl` app has."""
    import yaml

    stages = yaml.safe_load((ROOT / dvc_yaml).read_text())["stages"]
    commands = [s.get("cmd") or s["do"]["cmd"] for s in stages.values()]
    assert commands and all(c.startswith("scripts/brorl ") for c in commands), commands
    names = typer.main.get_command(cli.app).commands
    assert all(c.split()[1] in names and " --params " in c for c in commands), commands


def test_dvc_stages_run_the_checkouts_venv_without_an_activated_environment(tmp_path):
    """`dvc repro` / `dvc exp run` typed without activating .venv: every stage command starts with
    scripts/brorl, which runs the checkout's `brorl` command with scripts/python, which finds the
    checkout's .venv when PATH has none of its tools."""
    import shutil

    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for script in ("python", "brorl"):
        shutil.copy2(ROOT / "scripts" / script, checkout / "scripts" / script)
    for package in ("brorl", "commands"):  # the checkout's code, found before any installed one
        (checkout / package).symlink_to(ROOT / package, target_is_directory=True)
    (checkout / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no venv on PATH, no BRORL_PYTHON
    out = subprocess.run([str(checkout / "scripts" / "python"), "-c",
                          "import sys, prefect; print(sys.prefix)"],
                         env=bare, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.strip()).resolve() == Path(sys.prefix).resolve()
    out = subprocess.run([str(checkout / "scripts" / "brorl"), "study", "--help"], cwd=ROOT,
                         env=bare, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("Usage: brorl study ") and "--run RUN" in out.stdout


def test_run_reaches_dvc_for_real_repro_and_exp_run_at_ci_size(ci_pipeline, tmp_path):
    """`brorl run` in a copy of the CI pipeline's clone: `dvc repro data` finds the stage
    unchanged; with `-S`, `dvc exp run` reruns it with the override and records the experiment."""
    import os
    import shutil

    clone = tmp_path / "clone"
    shutil.copytree(ci_pipeline, clone, symlinks=True)
    from prefect.settings import PREFECT_API_URL

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "BRORL_PYTHON": sys.executable, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "MLFLOW_TRACKING_URI": f"sqlite:///{clone / 'mlflow.db'}", "OMP_NUM_THREADS": "1"}

    def brorl(*args):
        out = subprocess.run([str(bin_dir / "brorl"), "run", *args], cwd=clone, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
        return out.stdout + out.stderr

    assert "Stage 'data' didn't change, skipping" in brorl("data")
    log = brorl("data", "--params", "params/tiny_ci.yaml", "-S", "data.seed=1")
    assert "Running stage 'data'" in log
    experiments = subprocess.run([str(bin_dir / "dvc"), "exp", "list", "--name-only"], cwd=clone,
                                 env=env, capture_output=True, text=True, timeout=120)
    assert experiments.stdout.split(), experiments  # the run is recorded as an experiment
    import yaml

    assert yaml.safe_load((clone / "params" / "tiny_ci.yaml").read_text())["data"]["seed"] == 1
