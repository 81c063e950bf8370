"""Exact resume after SIGKILL at every point of a step (issue 13, item 4).

A CI-sized run (4 steps of N=16 over 4 prompts, a checkpoint and an evaluation every 2 steps,
rollouts saved) runs once without interruption as the reference. For each kill point
(tests/kill_resume_run.py) a fresh run is killed there, then resumed by a second process to the
end. Each must end exactly as the reference: the same final weights; the same per-step metrics
(timing and throughput excepted) and evaluation records, with no repeated row; the same prompts
drawn at every step and draw (the rollouts' problem ids, file by file: no prompt skipped or
trained twice); one MLflow run, FINISHED, holding each step once with the reference's values;
and no half-written checkpoint left as `latest`. A run folder naming an MLflow run the store
does not have resumes into a new run.

`make test` runs the reference and two kill points, mid-update (after an optimizer step of a
step that the resume must redo exactly) and mid-commit (a checkpoint renamed into place before
its `latest` pointer): 5 processes of a few seconds of training each, most of it start-up. The
other five points, the negative control and the missing MLflow run are `slow` (`make test-all`):
about 14 more processes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from brorl.policy import load_policy
from brorl.train import checkpoint as ckpt
from brorl.train.trainer import parameter_digest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "kill_resume_run.py"
POINTS = {  # kill point -> the step it kills
    "before_first_checkpoint": 1, "generate": 3, "verify": 3, "update": 3,
    "checkpoint_state": 2, "checkpoint_pointer": 2, "evaluate": 2,
}
IN_MAKE_TEST = ("update", "checkpoint_pointer")
"""The kill points `make test` runs (the others are `slow`)."""
VOLATILE = ("time/", "seconds", "_per_s", "orchestration")
"""Metric keys that measure time: they differ between any two runs."""


def write_params(folder: Path, easy_base: Path, easy_data: Path) -> Path:
    tree = {
        "extends": str(ROOT / "params" / "prorl_ci.yaml"), "name": "kill-resume",
        "data": {"path": str(easy_data)},
        "update": {"prompts_per_step": 4, "rollouts_per_prompt": 16, "mini_batches_per_step": 4,
                   "reference_reset_every": None},
        "generate": {"max_concurrent_rollouts": 16, "max_response_tokens": 24, "temperature": 1.0},
        "train": {"init_checkpoint": str(easy_base), "run_dir": str(folder / "run"),
                  "checkpoint_dir": str(folder / "run" / "checkpoints"), "steps": 4,
                  "max_rollouts": None, "max_seconds": None, "checkpoint_every": 2,
                  "eval_every": 2, "keep_checkpoints": 3, "eval_splits": ["test"],
                  "eval_per_family": 4, "eval_samples": 2, "save_rollouts": True},
        "tracking": {"tracking_uri": f"sqlite:///{folder / 'mlflow.db'}",
                     "experiment": "kill-resume", "metrics_dir": str(folder / "metrics"),
                     "plots_dir": str(folder / "plots"), "output_dir": str(folder)},
        "verify": {"workers": 1},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def run_script(params: Path, point: str = "none", step: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(params), point, str(step)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def outcome(folder: Path) -> dict:
    """What a finished run left: weights, metrics, evaluations, prompts, MLflow runs."""
    from mlflow.tracking import MlflowClient

    run = folder / "run"
    summary = json.loads((run / "summary.json").read_text())
    history = [{k: v for k, v in m.items() if not any(x in k for x in VOLATILE)}
               for m in summary["history"]]
    evals = [{k: v for k, v in json.loads(line).items() if k != "seconds"}
             for line in (run / "evals.jsonl").read_text().splitlines()]
    import pyarrow.parquet as pq

    prompts = {f.name: pq.read_table(f).column("problem_id").to_pylist()
               for f in sorted((run / "rollouts").glob("*.parquet"))}
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("kill-resume")
    runs = client.search_runs([experiment.experiment_id])
    logged, resumed_at = {}, {}
    for r in runs:
        resumed_at[r.info.run_id] = r.data.tags.get("resumed_at_step")
        points = client.get_metric_history(r.info.run_id, "verify/reward_mean")
        logged[r.info.run_id] = sorted((m.step, m.value) for m in points)
    pointer = (run / "checkpoints" / ckpt.LATEST_FILE).read_text().strip()
    return {
        "digest": parameter_digest(load_policy(run / "policy")[0]), "history": history,
        "reference": parameter_digest(load_policy(run / "checkpoints" / pointer / "reference")[0]),
        "resumed_at": list(resumed_at.values()),
        "evals": evals, "prompts": prompts, "statuses": [r.info.status for r in runs],
        "logged": list(logged.values()), "latest_complete":
            ckpt.is_complete(run / "checkpoints" / pointer),
    }


@pytest.fixture(scope="module")
def reference(easy_base, easy_data, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("reference")
    done = run_script(write_params(folder, easy_base, easy_data))
    assert done.returncode == 0, done.stderr[-3000:]
    result = outcome(folder)
    updated = [m for m in result["history"] if m["update/skipped"] == 0.0]
    assert len(updated) >= 3, result["history"]  # the weights really move: kills can lose work
    return result


@pytest.mark.parametrize("point", [p if p in IN_MAKE_TEST else pytest.param(p, marks=pytest.mark.slow)
                                   for p in sorted(POINTS)])
def test_a_run_killed_at_any_point_resumes_to_the_reference(point, reference, easy_base, easy_data,
                                                            tmp_path):
    params = write_params(tmp_path, easy_base, easy_data)
    killed = run_script(params, point, POINTS[point])
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-3000:])  # SIGKILL
    left = ckpt.latest_checkpoint(tmp_path / "run" / "checkpoints")
    resumes_at = ckpt.read_state(left)["step"] if left else 0
    resumed = run_script(params)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = outcome(tmp_path)
    assert got["resumed_at"] == [str(resumes_at)]  # the resumed process began at the checkpoint
    if point in IN_MAKE_TEST:
        assert resumes_at == 2  # a real resume: a rerun from step 0 would say "0"
    assert got["digest"] == reference["digest"]
    assert got["reference"] == reference["reference"]  # the KL reference restored, not rebuilt
    assert got["history"] == reference["history"]
    assert got["evals"] == reference["evals"]  # no repeated row
    assert len({(e["step"], e["split"]) for e in got["evals"]}) == len(got["evals"])
    assert got["prompts"] == reference["prompts"]  # every draw's prompts: none skipped or twice
    assert got["statuses"] == ["FINISHED"]  # one MLflow run, never left RUNNING
    assert got["logged"] == reference["logged"]  # each step once, the reference's values
    assert got["latest_complete"]


@pytest.mark.slow
def test_a_run_folder_naming_a_missing_mlflow_run_resumes_into_a_new_run(easy_base, easy_data,
                                                                          tmp_path):
    params = write_params(tmp_path, easy_base, easy_data)
    killed = run_script(params, "update", 3)
    assert killed.returncode == -9
    marker = tmp_path / "run.mlflow_run.json"  # beside the run's folder (`mlflow_marker`)
    old = json.loads(marker.read_text())["run_id"]
    marker.write_text(json.dumps({"run_id": "0" * 32}) + "\n")  # a run the store does not have
    resumed = run_script(params)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"names MLflow run {'0' * 32}, which the store" in resumed.stderr
    new = json.loads(marker.read_text())["run_id"]
    assert new not in (old, "0" * 32)
    assert (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.slow
def test_the_check_fails_when_the_cursor_is_saved_one_step_late(reference, easy_base, easy_data,
                                                                 tmp_path, monkeypatch):
    """The no-skip/no-duplicate check can fail: a resume that redraws an earlier step's prompts
    (as a sampler state saved one step late would) gives different prompts per draw."""
    params = write_params(tmp_path, easy_base, easy_data)
    assert run_script(params, "update", 3).returncode == -9
    latest = ckpt.latest_checkpoint(tmp_path / "run" / "checkpoints")
    state = ckpt.read_state(latest)
    state["sampler"]["position"] = max(state["sampler"]["position"] - 4, 0)  # one step of B=4 back
    ckpt.write_state(latest, state)
    assert run_script(params).returncode == 0
    got = outcome(tmp_path)
    assert got["prompts"] != reference["prompts"]
    shutil.rmtree(tmp_path / "run")
