"""The run loop (`brorl.train.Run`): stop rules, schedules, resume state, and one loop for every
entry point (`python -m brorl.train`, the Prefect flow, torchrun with two ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from brorl.policy import load_policy
from brorl.servers import free_port
from brorl.train import Direct, Run, RunConfig, RunState, Timed, parameter_digest

ROOT = Path(__file__).resolve().parents[1]


def _config(**changes) -> RunConfig:
    values = dict(name="t", run_dir="/nonexistent", steps=100, max_rollouts=None,
                  max_seconds=None, plateau_patience=None, eval_every=4, checkpoint_every=5,
                  save_rollouts=False, eval_samples=1, eval_temperature=0.6, eval_top_p=0.95,
                  eval_max_response_tokens=8, eval_seed=0, eval_workers=1)
    return RunConfig(**{**values, **changes})


def _stub_run(step: int, **changes) -> Run:
    """A Run over a stand-in trainer: only the counters the stop rules read."""
    trainer = SimpleNamespace(step_count=step, rank=0, resumed_state={},
                              broadcast=lambda value: value)
    return Run(trainer, _config(**changes), [])


def test_each_budget_names_itself_as_the_stop_reason():
    assert _stub_run(99).stop_reason() is None
    assert _stub_run(100).stop_reason() == "steps"
    run = _stub_run(3, max_rollouts=2048)
    run.state.rollouts = 2047
    assert run.stop_reason() is None
    run.state.rollouts = 2048
    assert run.stop_reason() == "rollouts"
    run = _stub_run(3, max_seconds=60.0)
    run.state.train_seconds, run.state.eval_seconds = 59.0, 1000.0  # evaluation time is not training
    assert run.stop_reason() is None
    run.state.train_seconds = 60.0
    assert run.stop_reason() == "seconds"


def test_plateau_stops_after_patience_evaluations_without_a_new_best():
    run = _stub_run(8, plateau_patience=2)
    run.state.evals_since_best = 1
    assert run.stop_reason() is None
    run.state.evals_since_best = 2
    assert run.stop_reason() == "plateau"


def test_evaluation_is_due_on_schedule_and_at_the_step_that_spends_a_budget():
    run = _stub_run(14, eval_every=8, max_rollouts=2048)
    run.state.rollouts = 14 * 128  # 1792: not due
    assert not run.eval_due()
    run.trainer.step_count, run.state.rollouts = 15, 1792 + 288  # 2080 >= 2048: the last step
    assert run.eval_due()
    run.trainer.step_count, run.state.rollouts = 16, 0
    assert run.eval_due()  # a multiple of eval_every


def test_the_best_score_and_evaluations_since_it_follow_each_evaluation(tmp_path, monkeypatch):
    run = _stub_run(0, run_dir=str(tmp_path))
    scores = iter([0.41, 0.42, 0.42, 0.40])  # a tie is no improvement

    def fake_evaluate(model, tokenizer, problems, **kwargs):
        value = next(scores)
        import numpy as np
        return {"family": {"math": {"pass_at_1": value, "reward_mean": value}}}, np.zeros((0, 1))

    monkeypatch.setattr("brorl.train.run.evaluate_policy", fake_evaluate)
    run.trainer.model = run.trainer.tokenizer = None
    trail = []
    for step in range(4):
        run.trainer.step_count = step
        run.evaluate()
        trail.append(run.state.evals_since_best)
    assert (run.state.best_eval, trail) == (0.42, [0, 0, 1, 2])
    rows = [json.loads(x) for x in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]


def test_run_state_round_trips_through_a_checkpoint_record():
    state = RunState(rollouts=10, train_seconds=1.5, best_eval=0.3, evals_since_best=1,
                     history=[{"train/step": 1.0}], evals=[{"step": 1}])
    from dataclasses import asdict
    assert RunState.from_dict(json.loads(json.dumps(asdict(state)))) == state


def test_direct_driver_runs_the_named_stage_method_in_place():
    class Stub:
        def evaluate(self, x):
            return Timed(x * 2, 0.0)

    assert Direct().stage(Stub(), "evaluate", 21).value == 42


def _overrides(easy_data: Path, easy_base: Path, out: Path) -> list[str]:
    return [f"data.path={easy_data}", f"train.init_checkpoint={easy_base}",
            f"train.checkpoint_dir={out / 'ck'}", f"train.run_dir={out}",
            "generate.max_response_tokens=24", "verify.workers=1", "train.max_rollouts=200",
            "train.eval_every=2", "train.checkpoint_every=2", "train.eval_per_family=8",
            f"tracking.metrics_dir={out / 'metrics'}", f"tracking.plots_dir={out / 'plots'}"]


def _stable(history: list[dict]) -> list[dict]:
    """Per-step metrics without wall-clock figures (they differ between runs; nothing else may)."""
    return [{k: v for k, v in m.items() if not k.startswith("time/") and "seconds" not in k
             and "per_s" not in k} for m in history]


def test_python_m_brorl_train_and_the_prefect_flow_train_identically(
        easy_base, easy_data, tmp_path, prefect_harness, mlflow_uri):
    from flows.train import train

    params = str(ROOT / "params" / "prorl_ci.yaml")
    flow_summary = train(params, _overrides(easy_data, easy_base, tmp_path / "flow"))
    sets = [a for o in _overrides(easy_data, easy_base, tmp_path / "bare") for a in ("-S", o)]
    done = subprocess.run([sys.executable, "-m", "brorl.train", "--params", params, *sets],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    bare_report = json.loads(done.stdout.strip().splitlines()[-1])
    # the rollout budget (200 rollouts: 3-4 steps of 4 x 16 with refills) ended both runs
    assert flow_summary["stopped_by"] == bare_report["stopped_by"] == "rollouts"
    assert flow_summary["steps"] == bare_report["step"] >= 2
    summaries = [json.loads((tmp_path / r / "summary.json").read_text()) for r in ("flow", "bare")]
    assert _stable(summaries[0]["history"]) == _stable(summaries[1]["history"])
    assert sum("eval/pass_at_1_mean" in m for m in summaries[0]["history"]) >= 1
    digests = {r: parameter_digest(load_policy(tmp_path / r / "policy")[0]) for r in ("flow", "bare")}
    assert digests["flow"] == digests["bare"] == bare_report["digest"]
    evals = [(tmp_path / r / "evals.jsonl").read_text() for r in ("flow", "bare")]
    strip = [[{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in e.splitlines()]
             for e in evals]
    assert strip[0] == strip[1] and strip[0][0]["step"] == 0
    # the flow also recorded MLflow: every step's metrics and a registered model version
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    steps = {m.step for m in client.get_metric_history(flow_summary["mlflow_run_id"],
                                                        "verify/reward_mean")}
    assert steps == set(range(1, flow_summary["steps"] + 1))
    [version] = client.search_model_versions("name = 'prorl-ci'")
    assert version.run_id == flow_summary["mlflow_run_id"]
    assert version.tags["algorithm"] == "prorl" and version.tags["rollouts_per_prompt"] == "16"


def test_torchrun_two_ranks_stop_by_the_same_rule_at_the_same_step(easy_base, easy_data, tmp_path):
    params = "params/prorl_ci.yaml"
    sets = [a for o in _overrides(easy_data, easy_base, tmp_path / "two") for a in ("-S", o)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m",
                "brorl.train", "--params", params, "--quiet", *sets,
                "--report-dir", str(tmp_path / "reports")]
    done = subprocess.run(torchrun, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "reports").glob("rank*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["stopped_by"] == ranks[1]["stopped_by"] == "rollouts"
    assert ranks[0]["step"] == ranks[1]["step"] >= 2 and ranks[0]["rollouts"] >= 200
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert _stable([ranks[0]["metrics"]]) == _stable([ranks[1]["metrics"]])
