"""The run loop (`brorl.train.Run`): stop rules, the rollout budget, training time apart from
evaluation, the eval record and validation-only selection, resume state, the continuation record,
and one loop for every entry point (`python -m brorl.train`, the Prefect flow, torchrun with two
ranks)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from brorl.evaluation.protocol import EvalProtocol
from brorl.evaluation.scoring import score_rewards
from brorl.params import load_params
from brorl.policy import load_policy
from brorl.system.servers import free_port
from brorl.train import (
    Direct,
    Run,
    RunConfig,
    RunState,
    Timed,
    Trainer,
    TrainerConfig,
    parameter_digest,
)
from brorl.train.diagnostics import DiagnosticsConfig
from brorl.train.rollouts import ScoredGroups
from brorl.train.run import TRAIN_STAGES
from brorl.train.sampler import PromptSampler
from brorl.types import Problem, RolloutBatch
from brorl.verifiers import Verdict, VerifyConfig
from tests.stand_ins import TrainerCollection

ROOT = Path(__file__).resolve().parents[1]


def _protocol(**changes) -> EvalProtocol:
    return EvalProtocol(**{**dict(per_family=1, samples=1, temperature=0.6, top_p=0.95,
                                  max_response_tokens=8, seed=0, verify=VerifyConfig(workers=1),
                                  split_samples=()),
                           **changes})


def _config(**changes) -> RunConfig:
    values = dict(name="t", run_dir="/nonexistent", root="/", data_path="data/problems",
                  steps=100, max_rollouts=None, min_steps=None, max_seconds=None,
                  plateau_patience=None, eval_every=4, eval_steps=(),
                  checkpoint_every=5, save_rollouts=False, eval_splits=("test",),
                  eval_protocol=_protocol(), diagnostics=DiagnosticsConfig(
                      enabled=False, probes_per_family=1, step_probes=0, decompose=False, seed=0))
    return RunConfig(**{**values, **changes})


def _stub_run(step: int, eval_problems=None, **changes) -> Run:
    """A Run over a stand-in trainer: only the counters the stop rules read (N = 16)."""
    trainer = SimpleNamespace(step_count=step, rank=0, resumed_state={}, model=None,
                              rollout_engine=None, tokenizer=None,
                              config=SimpleNamespace(rollouts_per_prompt=16),
                              broadcast=lambda value: value)
    return Run(trainer, _config(**changes), eval_problems or {})


def _problem(i: int, family: str = "math", prefix: str = "p") -> Problem:
    return Problem(id=f"{prefix}{i}", family=family, task="t", prompt=f"{prefix}{i}?", answer="1")


class FakeClock:
    """`time.perf_counter` stand-in: time moves only when `sleep` says so, so every stage's
    seconds are exactly the sleeps inside it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeTrainer(TrainerCollection):
    """Stands in for `Trainer` in the run loop: no model; rewards come from `rewards` (one row
    of N per group, in draw order); optional sleeps (on `clock`) in generation and checkpoints.
    The real collection methods (`TrainerCollection`) and `Trainer.end_step` are used."""

    end_step = Trainer.end_step

    def __init__(self, config: TrainerConfig, rewards, sleep: dict | None = None,
                 step_offset: int = 0, clock: FakeClock | None = None) -> None:
        self.config, self.rewards, self.sleep = config, rewards, sleep or {}
        self.clock = clock or FakeClock()
        self.rank, self.world, self.step_count, self.step_offset = 0, 1, 0, step_offset
        self.resumed_state: dict = {}
        self.model = self.tokenizer = self.rollout_engine = None
        self.sampler = PromptSampler([_problem(i) for i in range(40)], seed=config.seed)

    def broadcast(self, value):
        return value

    def sample_prompts(self, count):
        return self.sampler.take(count)

    def reward_fn(self, problems, responses):
        return [Verdict(0.0, "r") for _ in responses]  # the scripted rewards replace these

    def generate_rollouts(self, problems, draw, n=None, *, first_prompt=0, on_chunk=None):
        self.clock.sleep(self.sleep.get("generate", 0.0))
        b, n = len(problems), n or self.config.rollouts_per_prompt
        batch = RolloutBatch(
            prompt_index=torch.arange(b).repeat_interleave(n), prompt_ids=((1,),) * b,
            response_ids=torch.ones(b * n, 1, dtype=torch.long),
            response_lengths=torch.ones(b * n, dtype=torch.long), logprobs=torch.zeros(b * n, 1),
            texts=("x",) * (b * n), finish_reasons=("stop",) * (b * n), rollouts_per_prompt=n)
        if on_chunk is not None:
            on_chunk(0, b * n, batch.texts)
        return batch

    def verify(self, problems, batch, verdicts=None):
        rows = [next(self.rewards) for _ in problems]
        return ScoredGroups(tuple(problems), batch, torch.tensor(rows, dtype=torch.float64),
                            ("r",) * batch.num_rollouts)

    def update(self, groups):
        return {"update/optimizer_steps": 1.0}

    def after_update(self):
        return {}

    def save_checkpoint(self, run_state=None):
        self.clock.sleep(self.sleep.get("checkpoint", 0.0))
        return Path(f"/nonexistent/step_{self.step_count}")


MIXED, WRONG = [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]


def _fake_run(tmp_path, monkeypatch, rewards, *, eval_sleep: float = 0.0, trainer_sleep=None,
              step_offset: int = 0, eval_problems=None, trainer=None, clock=None,
              **run_changes) -> Run:
    """A Run over `FakeTrainer` (B = 4, N = 4, 3 draws) whose evaluation returns one fixed reward
    row per instance after `eval_sleep` seconds of `clock`; the policy folder is written without
    a model."""
    clock = clock or FakeClock()
    small = dict(checkpoint_dir=str(tmp_path / "ck"), prompts_per_step=4, rollouts_per_prompt=4,
                 filter_max_draws=3)
    config = replace(TrainerConfig.from_params(load_params(ROOT / "params/tiny_ci.yaml")),
                     **{**small, **(trainer or {})})

    def fake_evaluate(model, tokenizer, problems, *, n, k_values, seed, **kwargs):
        clock.sleep(eval_sleep)
        scored = np.array([[1.0] + [0.0] * (n - 1)] * len(problems))
        return score_rewards(problems, scored, k_values), scored

    def fake_save_policy(model, tokenizer, path):
        Path(path).mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr("brorl.evaluation.protocol.evaluate_policy", fake_evaluate)
    monkeypatch.setattr("brorl.policy.save_policy", fake_save_policy)
    fake = FakeTrainer(config, iter(rewards), trainer_sleep, step_offset, clock)
    changes = {"run_dir": str(tmp_path / "run"), "eval_every": 1, "checkpoint_every": 1,
               "eval_protocol": _protocol(samples=4), **run_changes}
    return Run(fake, _config(**changes), eval_problems or {"test": [_problem(0)]})


def test_each_budget_names_itself_as_the_stop_reason():
    assert _stub_run(99).stop_reason() is None
    assert _stub_run(100).stop_reason() == "steps"
    run = _stub_run(3, max_rollouts=2048)
    run.state.rollouts = 2032  # 16 left: one more group of N = 16 fits
    assert run.stop_reason() is None
    run.state.rollouts = 2033  # 15 left: not one group of N
    assert run.stop_reason() == "rollouts"
    run = _stub_run(3, max_seconds=60.0)
    run.state.train_seconds = 59.0
    run.state.eval_seconds = run.state.checkpoint_seconds = 1000.0  # not training time
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
    run.state.rollouts = 14 * 128  # 1792: 256 left, not due
    assert not run.eval_due()
    run.trainer.step_count, run.state.rollouts = 15, 2040  # 8 left < N = 16: the last step
    assert run.eval_due()
    run.trainer.step_count, run.state.rollouts = 16, 0
    assert run.eval_due()  # a multiple of eval_every
    run = _stub_run(5, eval_every=100, eval_steps=(5, 9))  # a study's equal-steps point
    assert run.eval_due()
    run.trainer.step_count = 6
    assert not run.eval_due()


def test_a_budget_not_divisible_by_b_times_n_is_never_exceeded_even_with_refills(
        tmp_path, monkeypatch):
    # B = 4, N = 4 (16 rollouts a step without refills); every other group passes the filter
    run = _fake_run(tmp_path, monkeypatch, itertools.cycle([MIXED, WRONG]), max_rollouts=50,
                    eval_every=100)
    summary = run.train()
    # step 1: 50 left (cap 12 groups): draws of 4, 2, 1 groups keep 2 + 1 + 1 = 4; 7 x 4 = 28
    # step 2: 22 left (cap 5 groups): a draw of 4 keeps 2, the refill is capped at 1 group: 20
    # 2 left < N = 4: stop at 48 <= 50 (the old rule, a budget checked before each step only,
    # would have run step 2 to its 4 kept groups and past 50)
    assert [m["generate/rollouts"] for m in summary["history"]] == [28.0, 20.0]
    assert [m["filter/rollout_cap_reached"] for m in summary["history"]] == [0.0, 1.0]
    assert summary["rollouts"] == run.state.rollouts == 48 and summary["stopped_by"] == "rollouts"
    # evaluated at the start and at the step that spent the budget, at its rollouts
    assert [(r["step"], r["rollouts"]) for r in run.state.evals] == [(0, 0), (2, 48)]


def test_a_budget_divisible_by_n_ends_exactly_on_it(tmp_path, monkeypatch):
    run = _fake_run(tmp_path, monkeypatch, itertools.cycle([MIXED, WRONG]), max_rollouts=64,
                    eval_every=100)
    summary = run.train()
    # step 1 as above: 28 (36 left, cap 9 groups); step 2: draws of 4, 2, 1 groups keep 2 + 1 +
    # 0 and the draw budget (3) ends it: 28 (8 left, cap 2); step 3: one draw capped at 2: 8
    assert [m["generate/rollouts"] for m in summary["history"]] == [28.0, 28.0, 8.0]
    assert summary["rollouts"] == 64 and summary["stopped_by"] == "rollouts"


def test_min_steps_runs_past_a_spent_budget_uncapped_and_evaluates_where_it_was_spent(
        tmp_path, monkeypatch):
    run = _fake_run(tmp_path, monkeypatch, itertools.cycle([MIXED, WRONG]), max_rollouts=64,
                    min_steps=5, eval_every=100)
    summary = run.train()
    # steps 1-3 spend the budget exactly as without min_steps (above); steps 4 and 5 draw
    # uncapped (4, 2, 1 groups and the draw budget: 28 rollouts each) and the run stops at 5
    assert [m["generate/rollouts"] for m in summary["history"]] == [28.0, 28.0, 8.0, 28.0, 28.0]
    assert summary["steps"] == 5 and summary["stopped_by"] == "rollouts"
    assert summary["rollouts"] == 120 and summary["budget_step"] == 3
    # evaluated at the start, at the step that spent the budget (at exactly its rollouts) and
    # at the last step
    assert [(r["step"], r["rollouts"]) for r in run.state.evals] == [(0, 0), (3, 64), (5, 120)]


def test_min_steps_below_the_step_that_spends_the_budget_changes_nothing(tmp_path, monkeypatch):
    run = _fake_run(tmp_path, monkeypatch, itertools.cycle([MIXED, WRONG]), max_rollouts=64,
                    min_steps=2, eval_every=100)
    summary = run.train()
    assert [m["generate/rollouts"] for m in summary["history"]] == [28.0, 28.0, 8.0]
    assert summary["budget_step"] == 3 and summary["stopped_by"] == "rollouts"
    assert [(r["step"], r["rollouts"]) for r in run.state.evals] == [(0, 0), (3, 64)]


def test_training_time_excludes_evaluation_and_checkpoints(tmp_path, monkeypatch):
    """On a fake clock an evaluation takes 1 s, a checkpoint 0.5 s and a step's generation
    0.125 s (every group passes: one draw a step); nothing else takes time. The 0.5 s time
    budget counts the training stages only, so it ends the run after exactly 4 steps (one step
    if an evaluation or a checkpoint counted), and every figure is exact (binary fractions)."""
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    run = _fake_run(tmp_path, monkeypatch, itertools.repeat(MIXED), eval_sleep=1.0,
                    trainer_sleep={"generate": 0.125, "checkpoint": 0.5}, max_seconds=0.5,
                    clock=clock)
    summary = run.train()
    history = summary["history"]
    assert summary["stopped_by"] == "seconds" and summary["steps"] == 4
    assert summary["train_seconds"] == 0.5
    assert summary["eval_seconds"] == 1.0 * 5  # step 0 and every step
    assert summary["checkpoint_seconds"] == 0.5 * 4
    for m in history:
        assert m["train/seconds"] == m["time/generate_rollouts"] == 0.125
        assert sum(m[f"time/{stage}"] for stage in TRAIN_STAGES) == 0.125
        assert m["time/evaluate"] == 1.0 and m["time/checkpoint"] == 0.5
        assert m["time/iteration"] == 1.625 and m["generate/seconds"] == 0.125
    # every evaluation row holds the training seconds up to its step, no evaluation time
    assert [r["seconds"] for r in run.state.evals] == [0.0, 0.125, 0.25, 0.375, 0.5]
    # nothing else advanced the clock (the last 0.5: `finish` saves once more, finding no
    # checkpoint folder, which the fake trainer never writes)
    assert clock.now == 5 * 1.0 + 4 * (0.125 + 0.5) + 0.5


def _evaluate_from(monkeypatch, rows: dict[str, list]):
    """evaluate_policy returning, for each problem, the next reward row scripted for its id."""
    scripts = {key: iter(value) for key, value in rows.items()}

    def fake_evaluate(model, tokenizer, problems, *, n, k_values, **kwargs):
        rewards = np.array([next(scripts[p.id]) for p in problems], dtype=float)
        assert rewards.shape == (len(problems), n)
        return score_rewards(problems, rewards, k_values), rewards

    monkeypatch.setattr("brorl.evaluation.protocol.evaluate_policy", fake_evaluate)


def test_an_evaluation_writes_one_row_per_split_with_per_instance_scores(tmp_path, monkeypatch):
    problems = {"test": [_problem(0), _problem(1, "reasoning")],
                "validation": [_problem(0, prefix="v")]}
    row = {"p0": [1, 1, 0, 0], "p1": [1, 0.5, 0.5, 0], "v0": [0, 0, 0, 1]}
    _evaluate_from(monkeypatch, {key: [value] * 2 for key, value in row.items()})
    run = _stub_run(3, problems, run_dir=str(tmp_path), eval_protocol=_protocol(samples=4),
                    eval_splits=("test", "validation"))
    run.state.rollouts, run.state.train_seconds = 640, 12.5
    metrics = run.evaluate().value
    test, val = (json.loads(x) for x in (tmp_path / "evals.jsonl").read_text().splitlines())
    # p0 (math): 2 of 4 correct: pass@1 = score = 0.5; p1 (reasoning): 1 of 4 correct, pass@1
    # 0.25, its score the mean reward (1 + .5 + .5 + 0) / 4 = 0.5; the file holds no seconds
    assert {k: v for k, v in test.items() if k != "scores"} == {
        "step": 3, "split": "test", "rollouts": 640, "samples": 4, "problem_ids": ["p0", "p1"],
        "families": ["math", "reasoning"], "pass_at_1": [0.5, 0.25], "score": [0.5, 0.5]}
    assert run.state.evals[0]["seconds"] == 12.5  # the training seconds, kept in the state
    # unbiased pass@4 from 4 samples: 1 when any is correct
    assert test["scores"]["family"]["math"]["pass_at_4"] == 1.0
    assert (val["split"], val["pass_at_1"], val["score"]) == ("validation", [0.25], [0.25])
    assert metrics["eval/score_mean"] == 0.5 and metrics["eval/pass_at_1_mean"] == 0.375
    assert metrics["eval/score_reasoning"] == 0.5 and metrics["eval/pass_at_1_reasoning"] == 0.25
    assert metrics["eval/pass_at_4_math"] == 1.0 and metrics["val/score_mean"] == 0.25
    assert not any(k.startswith("val/") and "reasoning" in k for k in metrics)
    assert (run.state.best_eval, run.state.best_step) == (0.25, 3)  # validation only
    run.evaluate()  # the same step again replaces its rows
    assert [(r["step"], r["split"]) for r in run.state.evals] == [(3, "test"), (3, "validation")]


@pytest.mark.parametrize("validation, test, trail", [
    # correct samples of 4 per evaluation; the plateau rule follows validation alone
    ([1, 2, 2, 1], [1, 2, 3, 4], [0, 0, 1, 2]),  # test keeps rising, validation stalls: plateau
    ([1, 2, 3, 4], [4, 3, 2, 1], [0, 0, 0, 0]),  # test falls, validation rises: no plateau
])
def test_the_plateau_rule_follows_validation_scores_and_ignores_test_scores(
        tmp_path, monkeypatch, validation, test, trail):
    def rows(counts):
        return [[1.0] * c + [0.0] * (4 - c) for c in counts]

    _evaluate_from(monkeypatch, {"v0": rows(validation), "p0": rows(test)})
    run = _stub_run(0, {"test": [_problem(0)], "validation": [_problem(0, prefix="v")]},
                    run_dir=str(tmp_path), eval_protocol=_protocol(samples=4),
                    eval_splits=("test", "validation"), plateau_patience=2)
    seen = []
    for step in range(4):
        run.trainer.step_count = step
        run.evaluate()
        seen.append(run.state.evals_since_best)
    assert seen == trail
    assert run.state.best_eval == max(validation) / 4
    assert run.state.best_step == validation.index(max(validation))
    assert (run.stop_reason() == "plateau") == (trail[-1] >= 2)


def test_a_shared_start_evaluation_is_recorded_as_scored_and_refused_under_another_protocol(
        tmp_path, monkeypatch):
    """A study scores its runs' common step-0 evaluation once: a run given those rows records
    them (no scoring at step 0) exactly as it would have scored them; rows of another protocol
    (here another sampling seed) are refused."""
    import brorl.evaluation.protocol

    def fake(folder, **changes):
        run = _fake_run(tmp_path / folder, monkeypatch, itertools.repeat(MIXED), steps=2,
                        **changes)
        torch.manual_seed(0)
        run.trainer.model = torch.nn.Linear(2, 2)  # the same weights in every run
        return run

    scored = fake("scored")
    start = {"protocol": scored.eval_protocol(), "rows": None}
    scored.train()
    start["rows"] = [r for r in scored.state.evals if r["step"] == 0]
    assert len(start["rows"]) == 1

    reused, calls = fake("reused"), []
    inner = brorl.evaluation.protocol.evaluate_policy
    monkeypatch.setattr("brorl.evaluation.protocol.evaluate_policy",
                        lambda *a, **k: calls.append(1) or inner(*a, **k))
    reused.train(start=json.loads(json.dumps(start)))
    assert len(calls) == 2  # steps 1 and 2 only
    assert reused.state.evals[0] == start["rows"][0]
    assert [(r["step"], r["pass_at_1"]) for r in reused.state.evals] == \
        [(r["step"], r["pass_at_1"]) for r in scored.state.evals]
    assert json.loads((tmp_path / "reused" / "run" / "evals.jsonl").read_text().splitlines()[0]) \
        == {k: v for k, v in start["rows"][0].items() if k != "seconds"}

    other = fake("other", eval_protocol=_protocol(samples=4, seed=1))
    with pytest.raises(ValueError, match="scored under another policy, instances or sampling"):
        other.train(start=start)


def test_run_state_round_trips_through_a_checkpoint_record_and_its_timings():
    state = RunState(rollouts=10, train_seconds=1.5, eval_seconds=2.0, best_eval=0.3,
                     best_step=4, evals_since_best=1,
                     history=[{"train/step": 1.0, "train/seconds": 1.5, "time/iteration": 3.0}],
                     evals=[{"step": 1, "split": "test", "seconds": 1.5, "rollouts": 64}])
    record, timings = (json.loads(json.dumps(r)) for r in (state.stable_dict(),
                                                           state.timings_dict()))
    # the checkpoint's record holds no wall-clock figure; the timings record holds them all
    assert "train_seconds" not in record and record["history"] == [{"train/step": 1.0}]
    assert record["evals"] == [{"step": 1, "split": "test", "rollouts": 64}]
    assert timings["history"] == [{"train/seconds": 1.5, "time/iteration": 3.0}]
    assert RunState.from_dict(record, timings) == state
    # a resume without the timings counts from 0 again and says NaN for the row's seconds
    bare = RunState.from_dict(record)
    assert bare.train_seconds == 0.0 and bare.evals[0]["seconds"] != bare.evals[0]["seconds"]


def test_a_finished_run_writes_the_record_a_continuing_run_reads(tmp_path, monkeypatch):
    run = _fake_run(tmp_path, monkeypatch, itertools.repeat(MIXED), step_offset=7, steps=2,
                    data_path="outputs/x/problems")
    summary = run.train()
    record = json.loads((tmp_path / "run" / "policy" / "run.json").read_text())
    # 2 steps of one draw of 4 prompts each: the cursor is at position 8 of epoch 0; the global
    # step is the 7 steps this run continued plus its own 2
    assert record == {"seed": 0, "step": 9, "sampler": {"epoch": 0, "position": 8, "carry": []},
                      "data": "outputs/x/problems", "problems": 40}
    assert summary["step_offset"] == 7 and summary["steps"] == 2


def test_direct_driver_runs_the_given_stage_method_in_place():
    class Stub:
        def evaluate(self, x):
            return Timed(x * 2, 0.0)

    assert Direct().stage(Stub(), Stub.evaluate, 21).value == 42


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


@pytest.mark.slow  # two whole runs, one under a Prefect flow
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
    assert 200 - 16 < flow_summary["rollouts"] == bare_report["rollouts"] <= 200
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
    """Each rank generates its share of every draw: both stop at the same step, by the rollout
    budget, with the same weights. CI-sized: 2 evaluated instances per family, not 8."""
    params = "params/prorl_ci.yaml"
    overrides = _overrides(easy_data, easy_base, tmp_path / "two") + ["train.eval_per_family=2"]
    sets = [a for o in overrides for a in ("-S", o)]
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
    # the budget, 200, is never exceeded: the run stops once fewer than N = 16 rollouts are left
    assert ranks[0]["step"] == ranks[1]["step"] >= 2 and 200 - 16 < ranks[0]["rollouts"] <= 200
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert _stable([ranks[0]["metrics"]]) == _stable([ranks[1]["metrics"]])
