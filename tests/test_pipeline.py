"""The whole pipeline at CI size: `dvc repro` in a temporary clone (the `ci_pipeline` fixture of
conftest.py), its flows reporting to Prefect's test harness; then what it left in MLflow and on
disk; then an interrupted `train` flow resumed. tests/test_mlflow_ui.py views the same runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import tracking
from brorl.policy import load_policy
from brorl.train import parameter_digest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("data", "base", "prorl_warmup", "prorl", "brorl", "compare")
FAMILIES = ("math", "code", "reasoning", "instruction")


def _runs(clone: Path) -> list:
    client = MlflowClient(f"sqlite:///{clone / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("brorl")
    return client.search_runs([experiment.experiment_id]), client


def test_the_pipeline_changes_no_tracked_file_but_its_lock_and_leaves_nothing_untracked(
        ci_pipeline):
    """As the README says of `make run`: the pipeline writes its outputs (ignored by git) and
    its lock; with CI params, whose metrics and plots go below outputs/ci, nothing else."""
    before, after = ((ci_pipeline.parent / f"git_status_{when}.txt").read_text().splitlines()
                     for when in ("before", "after"))
    assert sorted(set(after) - set(before)) == [" M dvc.lock"]


def test_dvc_repro_runs_every_stage_and_records_them(ci_pipeline):
    clone = ci_pipeline
    lock = (clone / "dvc.lock").read_text()
    assert all(f"  {stage}:" in lock for stage in STAGES)
    assert "params/prorl_ci.yaml" in lock and "params/brorl_ci.yaml" in lock
    status = subprocess.run([str(Path(sys.executable).parent / "dvc"), "status", "compare"],
                            cwd=clone, capture_output=True, text=True, timeout=120)
    assert "up to date" in status.stdout  # a second repro would rerun nothing
    warmup = json.loads((clone / "outputs" / "ci" / "prorl_warmup" / "summary.json").read_text())
    assert warmup["rollouts"] == 2 * 4 * 16  # 2 steps of one draw (params/prorl_warmup_ci.yaml)
    for arm in ("prorl", "brorl"):
        m = json.loads((clone / "outputs" / "ci" / "metrics" / f"ci_{arm}.json").read_text())
        summary = json.loads((clone / "outputs" / "ci" / arm / "summary.json").read_text())
        # the budget, 256 rollouts, is divisible by both N (16, 256): each arm ends exactly on it
        assert m["rollouts"] == summary["rollouts"] == 256 and summary["stopped_by"] == "rollouts"
        assert sum(step["generate/rollouts"] for step in summary["history"]) == 256
        last = [json.loads(x) for x in
                (clone / "outputs" / "ci" / arm / "evals.jsonl").read_text().splitlines()][-1]
        assert last["step"] == summary["steps"]  # the arm ended on an evaluation at its budget
        assert {f: m[f] for f in FAMILIES} == {
            f: round(last["scores"]["family"][f]["score"], 4) for f in FAMILIES}
    for arm in ("ci_prorl", "ci_brorl", "ci_prorl_warmup"):
        csv = clone / "outputs" / "ci" / "plots" / arm / "eval.csv"
        assert csv.read_text().startswith("step,rollouts")
    compared = json.loads((clone / "outputs" / "ci" / "metrics" / "ci_compare.json").read_text())
    report = json.loads((clone / "outputs" / "ci" / "compare" / "report.json").read_text())
    # the paired test recomputed here from the arms' own last test rows, instance by instance
    last = {}
    for arm in ("prorl", "brorl"):
        rows = [json.loads(x) for x in
                (clone / "outputs" / "ci" / arm / "evals.jsonl").read_text().splitlines()]
        row = [r for r in rows if r.get("split", "test") == "test"][-1]
        last[arm] = dict(zip(row["problem_ids"], row.get("score", row["pass_at_1"]), strict=True))
    ids = [i for i in last["prorl"] if i in last["brorl"]]
    base, arm = [last["prorl"][i] for i in ids], [last["brorl"][i] for i in ids]
    delta = sum(b - a for a, b in zip(base, arm)) / len(ids)
    test = report["paired_test"]
    assert test["instances"] == len(ids) and test["delta"] == pytest.approx(delta)
    assert compared["delta"] == pytest.approx(round(delta, 4))
    if len({b - a for a, b in zip(base, arm)}) > 1:  # else no variance: the test is undefined
        from scipy import stats

        p = stats.ttest_rel(arm, base, alternative="greater").pvalue
        assert test["p_one_tailed"] == pytest.approx(p)
        assert compared["p"] == pytest.approx(round(p, 4))
    else:
        assert compared["p"] != compared["p"]  # NaN
    timings = json.loads((clone / "outputs" / "ci" / "compare.timings.json").read_text())
    assert all(timings["rollouts_per_s"][arm] > 0 for arm in ("prorl", "brorl"))
    assert "rollouts_per_s" not in report  # the report, a DVC output, holds no wall-clock figure


def test_each_arm_saved_its_rollouts_as_parquet(ci_pipeline):
    import pyarrow.parquet as pq

    for arm, n in (("prorl", 16), ("brorl", 256)):
        files = sorted((ci_pipeline / "outputs" / "ci" / arm / "rollouts").glob("*.parquet"))
        assert files, arm
        table = pq.read_table(files[0])
        assert table.num_rows % n == 0 and table.num_rows >= n  # whole groups of N rollouts
        assert {"reward", "response"} <= set(table.column_names), table.column_names


def test_every_ci_arm_updated_its_weights(ci_arms_not_updated):
    """Fails, naming the arm, the prompts it drew and their rewards, if a CI arm never updated
    (the CI seeds and sizes exist to rule that out on any CPU: params/prorl_warmup_ci.yaml)."""
    assert not ci_arms_not_updated, "; ".join(ci_arms_not_updated.values())


def test_the_base_gained_and_the_checkpoints_changed_along_the_pipeline(ci_arms_updated):
    out = ci_arms_updated / "outputs" / "ci"
    # the base stage's real gain: its untrained start (step 0) solves nothing, the kept
    # checkpoint solves held-out test problems (tests/test_base.py checks a CI-sized gain alone)
    base = json.loads((out / "base" / "report.json").read_text())
    assert base["history"][0]["step"] == 0 and not any(base["history"][0]["pass_at_1"].values())
    assert base["test"]["overall"]["score"] > 0, base["test"]
    # the instruction-following family (IFEval constraints) is learnt too: its held-out rewards
    # are above zero at CI size
    assert base["test"]["family"]["instruction"]["reward_mean"] > 0, base["test"]["family"]
    digests = {name: parameter_digest(load_policy(path)[0]) for name, path in {
        "base": out / "base" / "checkpoint", "warmup": out / "prorl_warmup" / "policy",
        "prorl": out / "prorl" / "policy", "brorl": out / "brorl" / "policy"}.items()}
    assert len(set(digests.values())) == 4, digests  # every stage moved the weights
    report = json.loads((out / "compare" / "report.json").read_text())
    assert set(report["final_pass_at_1"]) == {"prorl", "brorl"}
    assert report["paired_test"]["instances"] == 4 * len(FAMILIES)  # eval_per_family x families
    text = (out / "compare" / "report.md").read_text()
    assert "| prorl | 0 |" in text and "| brorl | 1 |" in text and "pass rate" in text
    assert (out / "compare" / "pass_at_1.png").stat().st_size > 10_000


def test_both_arms_mlflow_runs_hold_metrics_artifacts_and_tags(ci_arms_updated):
    ci_pipeline = ci_arms_updated
    runs, client = _runs(ci_pipeline)
    by_name = {r.info.run_name: r for r in runs}
    assert {"data", "base", "prorl-warmup-ci", "prorl-ci", "brorl-ci"} <= set(by_name), sorted(by_name)
    for name, algorithm, n in (("prorl-ci", "prorl", "16"), ("brorl-ci", "brorl", "256")):
        run = by_name[name]
        assert run.info.status == "FINISHED"
        assert run.data.tags["algorithm"] == algorithm
        assert run.data.tags["rollouts_per_prompt"] == n and len(run.data.tags["git_commit"]) == 40
        assert run.data.tags["prompts_per_step"] == {"prorl": "4", "brorl": "1"}[algorithm]
        # the policy artifact's data version: the content hash of the data the arm trained on
        data = ci_pipeline / "outputs" / "ci" / "data" / "problems"
        assert run.data.tags["data_version"] == tracking.data_version(data) != "missing"
        keys = ("verify/reward_mean", "filter/pass_rate", "generate/rollouts_per_s",
                "eval/pass_at_1_math", "eval/pass_at_1_reasoning", "time/iteration",
                "time/orchestration_share", "update/loss", "diag/heldout/q_pos",
                "diag/solved/probes", "diag/heldout/worst_drop_since_start", "time/diagnostics")
        for key in keys:
            assert key in run.data.metrics, (name, key)
        assert run.data.params["update.rollouts_per_prompt"] == n
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"params.json", "summary.json", "evals.jsonl", "policy"} <= artifacts
        history = client.get_metric_history(run.info.run_id, "eval/pass_at_1_math")
        assert [m.step for m in history][0] == 0 and len(history) >= 2
    compare = [r for r in runs if r.data.tags.get("stage") == "compare"]
    assert len(compare) == 1
    reported = {a.path for a in client.list_artifacts(compare[0].info.run_id, "report")}
    assert {"report/report.md", "report/pass_at_1.png", "report/report.json"} <= reported


def _train(clone: Path, run: str, extra: list[str]) -> dict:
    from flows.train import train

    overrides = [f"train.run_dir={clone / run}", f"train.checkpoint_dir={clone / run / 'ck'}",
                 f"train.init_checkpoint={clone / 'outputs/ci/prorl_warmup/policy'}",
                 f"data.path={clone / 'outputs/ci/data/problems'}", "train.max_rollouts=null",
                 "train.steps=4", "train.eval_every=2", f"tracking.metrics_dir={clone / run}",
                 f"tracking.plots_dir={clone / run}", *extra]
    return train(str(ROOT / "params" / "prorl_ci.yaml"), overrides)


def _stable(summary: dict) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("time/") and "seconds" not in k
             and "per_s" not in k} for m in summary["history"]]


def test_an_interrupted_train_flow_resumes_into_the_same_mlflow_run(ci_pipeline, monkeypatch):
    clone = ci_pipeline
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{clone / 'mlflow.db'}")
    whole = _train(clone, "whole", [])

    from brorl.train.trainer import Trainer

    real_generate = Trainer.generate_rollouts

    def crash_at_step_3(self, *args, **kwargs):  # every step generates; not every step updates
        if self.step_count == 2:
            raise RuntimeError("simulated interruption after the step-2 checkpoint")
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "generate_rollouts", crash_at_step_3)
    with pytest.raises(RuntimeError, match="simulated interruption"):
        _train(clone, "split", [])
    run_id = json.loads((clone / "split.mlflow_run.json").read_text())["run_id"]
    client = MlflowClient(f"sqlite:///{clone / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "FAILED"
    monkeypatch.setattr(Trainer, "generate_rollouts", real_generate)
    resumed = _train(clone, "split", [])
    assert resumed["mlflow_run_id"] == run_id and client.get_run(run_id).info.status == "FINISHED"
    assert client.get_run(run_id).data.tags["resumed_at_step"] == "2"
    assert resumed["steps"] == whole["steps"] == 4
    a, b = (json.loads((clone / r / "summary.json").read_text()) for r in ("whole", "split"))
    assert _stable(a) == _stable(b)
    evals = [(clone / r / "evals.jsonl").read_text().splitlines() for r in ("whole", "split")]
    assert [json.loads(x)["step"] for x in evals[1]] == [0, 2, 4]  # no repeated rows
    assert parameter_digest(load_policy(clone / "whole" / "policy")[0]) == \
        parameter_digest(load_policy(clone / "split" / "policy")[0])
    steps = [m.step for m in client.get_metric_history(run_id, "verify/reward_mean")]
    assert sorted(set(steps)) == [1, 2, 3, 4]
