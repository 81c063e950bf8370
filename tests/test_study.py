"""The study (docs/study.md): the arms and runs, each run's params, the plan files, the run folders
between sessions, the warm-up's plateau test, the pool's choice, the report on hand-made run
folders where the answer is known, and at CI size the whole study under DVC: killed inside a
run at a checkpoint and resumed, then pushed to a local remote and pulled into a fresh clone."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from brorl.evaluation.stats import evaluation_slope_test, holm
from brorl.params import ParamsError, load_params
from brorl.runs.folder import mlflow_marker
from brorl.runs.timings import read_timings
from brorl.study import plan_runs, run_params, write_plan
from brorl.study.analysis import point_rows
from brorl.study.plan import StudyRun
from brorl.study.pool import band, choose, histogram, hold_out, keep_rate, rescued, summary
from brorl.study.progress import (
    mark_finished,
    prepare_run_dir,
    progress,
    progress_line,
    resumes,
)
from brorl.study.report import build_report, headline, verdict
from brorl.study.results import RunResult
from brorl.study.warmup import plateau_test, train_to_plateau

ROOT = Path(__file__).resolve().parents[1]
STUDY, STUDY_CI = ROOT / "params" / "study.yaml", ROOT / "params" / "study_ci.yaml"
STUDY_DVC = "study/dvc.yaml"
REPORT = f"{STUDY_DVC}:study_report"


# --- the arms, the runs, each run's params ---------------------------------------------------

@pytest.mark.parametrize("name", ["pipeline.yaml", "pipeline_ci.yaml"])
def test_the_dvc_foreach_list_is_the_plan_of_the_named_study(name):
    pipeline = yaml.safe_load((ROOT / "params" / name).read_text())
    study = pipeline["study"]
    params = load_params(ROOT / study["params"])
    assert study["runs"] == [r.id for r in plan_runs(params.study)]
    assert (study["out"], study["name"]) == (params.study.out_dir, params.study_label)
    assert params.tracking.metrics_dir == pipeline["dirs"]["metrics"]
    assert params.train.init_checkpoint == f"{pipeline['base']['out']}/checkpoint"  # the warm-up's
    assert params.data.path == load_params(ROOT / pipeline["data"]["params"]).data.path


def test_runs_go_seed_by_seed_through_the_arms():
    runs = plan_runs(load_params(STUDY).study)
    arms = ["prorl", "brorllr", "b64", "brorl"]
    assert [r.id for r in runs] == [f"{a}_s{s}" for s in range(6) for a in arms
                                    if a != "brorl" or s < 3]
    ci = load_params(STUDY_CI, ["study.arms.brorllr.seeds=3"]).study
    # prorl has 2 seeds, brorllr 3, b64 and brorl 1: a seed's runs, then the next seed's
    assert [r.id for r in plan_runs(ci)] == ["prorl_s0", "brorllr_s0", "b64_s0", "brorl_s0",
                                             "prorl_s1", "brorllr_s1", "brorllr_s2"]


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_every_run_differs_from_the_study_only_in_its_arm_seed_start_pool_and_stop():
    params = load_params(STUDY)
    study_leaves = _leaves(params.model_dump(mode="json", exclude={"study"}))
    allowed = {"name", "update.prompts_per_step", "update.rollouts_per_prompt",
               "update.base_samples_per_step", "data.path", "train.seed", "train.algorithm",
               "train.init_checkpoint", "train.continue_stream", "train.max_rollouts",
               "train.min_steps", "train.steps", "train.eval_every", "train.eval_steps",
               "train.checkpoint_every", "train.eval_splits", "train.eval_split_samples.holdout",
               "train.eval_split_samples.test", "train.eval_split_samples",
               "train.run_dir", "train.checkpoint_dir", "tracking.metrics_dir",
               "tracking.plots_dir"}
    # the sqrt rule, lr = 1e-4 sqrt(B N / anchor): prorl 128/128, brorl 1024/128 (x 2.83),
    # brorllr 1024/1024 and b64 1024/1024 (ProRL's 1e-4)
    lr = {"prorl": 1e-4, "brorl": 1e-4 * math.sqrt(8), "brorllr": 1e-4, "b64": 1e-4}
    for run in plan_runs(params.study):
        p = run_params(params, run)
        changed = {k for k, v in _leaves(p.model_dump(mode="json", exclude={"study"})).items()
                   if study_leaves.get(k) != v}
        assert changed <= allowed, (run.id, changed - allowed)
        assert p.update.lr == pytest.approx(lr[run.arm]) and p.update.mini_batches_per_step == 4
        # evaluated at step 0, step 48 and the budget only: eval_every is the run's length
        assert (p.train.eval_every, p.train.eval_steps) == (p.train.steps, [48])
        assert p.train.seed == run.seed and p.train.checkpoint_every == 48
        assert (p.train.init_checkpoint, p.data.path) == ("outputs/study/warmup/policy",
                                                          "outputs/study/pool/problems")
        assert p.train.continue_stream is False  # the pool is not the warm-up's train list
        assert p.train.eval_splits == ["holdout", "test"]
        assert p.train.eval_split_samples == {"holdout": 64, "test": 8}
        assert (p.train.eval_per_family, p.train.eval_seed) == (100, 0)
        # the budget, and step 48 however many groups the filter drops
        assert (p.train.steps, p.train.max_rollouts, p.train.min_steps) == (1000, 51200, 48)
        assert p.train.run_dir == f"outputs/study/runs/{run.id}"


def test_the_study_file_holds_the_issues_design():
    study = load_params(STUDY).study
    shape = {n: (a.update["prompts_per_step"], a.update["rollouts_per_prompt"])
             for n, a in study.arms.items()}
    assert shape == {"prorl": (8, 16), "brorllr": (2, 512), "b64": (64, 16), "brorl": (2, 512)}
    assert study.budget_rollouts >= 48 * 2 * 512  # >= 48 steps of 1,024 rollouts
    assert study.warmup.window >= 5 and study.warmup.min_instances >= 300
    c = study.contrasts
    confirmatory = {(c[n].a, c[n].b) for n in study.confirmatory}
    assert confirmatory == {("prorl@budget", "brorllr@budget"), ("prorl@steps", "brorllr@steps"),
                            ("b64@budget", "brorllr@budget")}  # the compute-matched contrast
    assert (c[study.premise].a, c[study.premise].b) == ("start", "prorl@budget")
    assert [n for n, x in c.items() if x.equivalence] == [study.premise]
    assert study.start_replicates >= 3 and study.eval_split_samples["holdout"] >= 64
    assert study.revival == {"brorllr": ["brorllr_vs_prorl"]}
    assert study.frozen == "study/frozen.json"


@pytest.mark.parametrize("override, message", [
    ("study.budget_rollouts=53000", "not divisible by arm prorl's N = 16"),
    ("study.budget_rollouts=40960", "fewer than study.equal_steps = 48 steps"),
    ("study.contrasts.lr_alone.a=brorl@nowhere", "side 'brorl@nowhere' is not"),
    ("study.arms.b64.stop=steps", "an arm with stop: steps has no @budget"),
    ("study.contrasts.lr_alone.b=start", "`start` may only be side a"),
    ("study.revival.brorl=[nothing]", "not confirmatory: \\['nothing'\\]"),
    ("study.revival.brorl=[lr_alone]", "not confirmatory: \\['lr_alone'\\]"),
    ("study.confirmatory=[nothing]", "name \\['nothing'\\], which are not contrasts"),
    ("study.contrasts.prorl_vs_start.equivalence=false", "is read by its TOST"),
    ("study.arms.brorl.update.prompts_per_step=3", "gives arm brorl .* fewer than study.equal"),
    ("study.arms.b64.update.mini_batches_per_step=3", "study.arms.b64.update .*do not split"),
    ("study.pool.holdout_fraction=1.5", "holdout_fraction"),
    ("study.evaluations=5", "not a multiple of study.evaluations"),
    ("study.pool.target=[0.7,0.3]", "0 < low < high < 1"),
])
def test_a_study_that_breaks_a_rule_fails_naming_the_field_and_the_fix(override, message):
    with pytest.raises(ParamsError, match=message):
        load_params(STUDY, [override])


def test_the_plan_files_change_only_where_their_settings_changed(tmp_path):
    params = load_params(STUDY_CI, [f"study.out_dir={tmp_path}"])
    ids = write_plan(params, tmp_path)
    files = [*(f"{i}.json" for i in ids), "warmup.json", "pool.json"]
    before = {f: (tmp_path / "plan" / f).read_bytes() for f in files}
    # the report's settings change no run, nor the warm-up, nor the pool
    write_plan(load_params(STUDY_CI, [f"study.out_dir={tmp_path}", "study.margin=0.05"]),
               tmp_path)
    assert {f: (tmp_path / "plan" / f).read_bytes() for f in files} == before
    # the warm-up's cap changes its plan file only
    write_plan(load_params(STUDY_CI, [f"study.out_dir={tmp_path}", "study.warmup.max_steps=9"]),
               tmp_path)
    changed = {f for f in files if (tmp_path / "plan" / f).read_bytes() != before[f]}
    assert changed == {"warmup.json"}
    more = load_params(STUDY_CI, [f"study.out_dir={tmp_path}", "study.arms.b64.seeds=2"])
    assert "b64_s1" in write_plan(more, tmp_path)
    write_plan(params, tmp_path)
    assert not (tmp_path / "plan" / "b64_s1.json").exists()  # a dropped run's file goes


# --- run folders between sessions, progress ---------------------------------------------------

def test_a_run_folder_resumes_when_interrupted_and_starts_over_when_changed_or_finished(tmp_path):
    folder = tmp_path / "prorl_s0"
    assert prepare_run_dir(folder, "prorl_s0", "d1").action == "start"
    mlflow_marker(folder).write_text(json.dumps({"run_id": "abc"}))  # beside the folder
    killed = prepare_run_dir(folder, "prorl_s0", "d1")  # interrupted before its first checkpoint
    assert (killed.action, killed.cleared_mlflow_run) == ("start", "abc")
    _checkpoint(folder)
    # what the preflight asks first: only a resumed folder's checkpoint is the run's input
    assert resumes(folder, "d1") and not resumes(folder, "d2")
    assert prepare_run_dir(folder, "prorl_s0", "d1").action == "resume"  # interrupted session
    assert (folder / "checkpoints").is_dir()
    mlflow_marker(folder).write_text(json.dumps({"run_id": "def"}))
    mark_finished(folder, 12.5)
    assert "wall_seconds" not in json.loads((folder / "study_run.json").read_text())
    assert read_timings(folder)["wall_seconds"] == 12.5  # beside the folder, not in it
    assert not resumes(folder, "d1")  # finished: a new session starts over
    again = prepare_run_dir(folder, "prorl_s0", "d1")  # DVC reruns a finished run: code changed
    assert (again.action, again.cleared_mlflow_run) == ("start", "def")
    assert not (folder / "checkpoints").exists()
    assert not mlflow_marker(folder).exists() and read_timings(folder) == {}
    _checkpoint(folder)
    assert prepare_run_dir(folder, "prorl_s0", "d2").action == "start"  # other params
    assert not (folder / "checkpoints").exists()


def _checkpoint(folder: Path) -> None:
    """A complete checkpoint as `brorl.train.checkpoint` lays it out (state file, pointer)."""
    from brorl.train import checkpoint as ckpt

    step = folder / "checkpoints" / ckpt.step_name(2)
    step.mkdir(parents=True)
    ckpt.write_state(step, {"step": 2})
    (folder / "checkpoints" / ckpt.LATEST_FILE).write_text(step.name)


def test_a_cleared_folders_mlflow_run_is_deleted_and_a_missing_one_is_no_error(mlflow_uri):
    from mlflow.tracking import MlflowClient

    from tracking.study_record import forget_run

    client = MlflowClient(mlflow_uri)
    run = client.create_run(client.create_experiment("x")).info.run_id
    forget_run(mlflow_uri, run)
    assert client.get_run(run).info.lifecycle_stage == "deleted"
    forget_run(mlflow_uri, "0" * 32)  # another store's run: already gone


def test_progress_counts_current_finished_runs_and_estimates_from_their_wall_time(tmp_path):
    params = load_params(STUDY_CI, [f"study.out_dir={tmp_path}/study"])
    from brorl.study.progress import digests

    current = digests(params, tmp_path)
    for run_id, wall in (("prorl_s0", 10.0), ("b64_s0", 5.0)):
        folder = tmp_path / "study" / "runs" / run_id
        prepare_run_dir(folder, run_id, current[run_id])
        mark_finished(folder, wall)
    stale = tmp_path / "study" / "runs" / "brorllr_s1"
    prepare_run_dir(stale, "brorllr_s1", "old-digest")
    mark_finished(stale, 99.0)  # finished with other params: not done
    p = progress(params, tmp_path, "brorl_s0")
    # left: prorl_s1 (prorl's mean, 10 s), then brorllr_s0, brorl_s0, brorllr_s1 with no run of
    # their arm yet: the finished runs' 15 s per 256 + 256 nominal rollouts (4 x 16 x 4 steps,
    # 8 x 16 x 2 steps) times their nominal 2 x 64 x 2 = 256 rollouts: 7.5 s each
    assert (p.done, p.total, p.elapsed) == (2, 6, 15.0)
    assert p.eta == pytest.approx(10 + 3 * 15 / 512 * 256)
    assert progress_line("study-ci", StudyRun("brorl", 0), p) == (
        "study study-ci: run brorl_s0 (seed 0) | 2/6 runs done | elapsed 0m15s | ETA 0m32s")
    assert progress(params, tmp_path, "prorl_s1", started=time.time() - 125).elapsed >= 125


# --- the warm-up's plateau test and its loop ---------------------------------------------------

def _validation_rows(curve: list[float], noise: float, instances: int = 40,
                     every: int = 1000) -> list[dict]:
    """Validation rows whose per-instance scores are the curve's value plus fixed noise."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.8, size=instances)
    ids = [f"math/t/{i}" for i in range(instances)]
    return [{"step": 4 * k, "split": "validation", "rollouts": every * k, "problem_ids": ids,
             "score": (base + value + rng.normal(0, noise, instances)).tolist()}
            for k, value in enumerate(curve)]


def test_the_plateau_test_is_a_tost_on_the_slope_per_study_budget():
    study = load_params(STUDY_CI, ["study.budget_rollouts=4096", "study.warmup.margin=0.03",
                                   "study.warmup.min_instances=40"]).study
    # rollouts 0..5000 in a 4096-rollout budget: a flat curve with a little noise lies within
    # +-0.03 per budget; a curve rising 0.01 per 1000 rollouts (0.041 per budget) does not
    flat = plateau_test(_validation_rows([0.0] * 6, 0.002), study)
    rising = plateau_test(_validation_rows([0.01 * k for k in range(6)], 0.002), study)
    assert flat["flat"] and not rising["flat"]
    assert rising["test"]["slope"] == pytest.approx(0.01 * 4096 / 1000, abs=0.002)
    assert flat["steps"] == [4, 8, 12, 16, 20] and len(flat["scores"]) == 5  # the last 5 rows
    assert plateau_test(_validation_rows([0.0] * 4, 0.002), study) is None  # fewer than 5 yet
    with pytest.raises(ValueError, match="needs >= 300"):
        plateau_test(_validation_rows([0.0] * 6, 0.002), load_params(STUDY).study)


def test_each_look_of_the_warm_up_tests_at_alpha_over_the_looks():
    # CI warm-up: evaluations at steps 0..5, a window of 5: looks at steps 4 and 5, alpha / 2
    params = load_params(STUDY_CI, ["study.warmup.min_instances=40", "study.budget_rollouts=1024"])
    study = params.study
    assert study.warmup.looks == 2 and load_params(STUDY).study.warmup.looks == 4  # 384 .. 672
    # evaluation means 0 slope + residuals r (orthogonal to 1 and x), scaled so that the TOST p
    # is 0.03: se = sqrt(RSS / 3 / Sxx), p = P(T3 > 0.03 / se) = 0.03 -> se = 0.03 / t(0.97, 3)
    x = 0.25 * np.arange(5)  # rollouts / budget
    r = np.array([1.0, -2.0, 0.0, 2.0, -1.0])
    sxx = float(((x - x.mean()) ** 2).sum())
    scale = 0.03 / stats.t.ppf(0.97, 3) / math.sqrt(r @ r / 3 / sxx)
    rows = _validation_rows([0.0] * 5, 0.0, every=256)
    for k, row in enumerate(rows):  # every instance moves by the evaluation's residual
        row["score"] = (np.array(row["score"]) + scale * r[k]).tolist()
    verdict_ = plateau_test(rows, study)
    assert verdict_["unit"] == "evaluations" and verdict_["test"]["df"] == 3
    assert verdict_["test"]["p_equivalence"] == pytest.approx(0.03, abs=1e-6)
    assert verdict_["level"] == 0.025 and verdict_["flat"] is False  # flat at 0.05, not 0.025


def test_the_evaluations_as_unit_slope_test_equals_a_hand_computed_regression():
    means, x = [0.41, 0.43, 0.40, 0.45, 0.44, 0.46], [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    hand = stats.linregress(x, means)  # least squares over 6 evaluations, df 4
    test = evaluation_slope_test(means, x, margin=0.1, alpha=0.05)
    assert (test.slope, test.se, test.df) == pytest.approx((hand.slope, hand.stderr, 4))
    assert test.p_two_sided == pytest.approx(hand.pvalue)
    half = stats.t.ppf(0.975, 4) * hand.stderr
    assert (test.ci_low, test.ci_high) == pytest.approx((hand.slope - half, hand.slope + half))
    # TOST by hand: the larger one-sided p against -margin and +margin
    tost = max(stats.t.sf((hand.slope + 0.1) / hand.stderr, 4),
               stats.t.cdf((hand.slope - 0.1) / hand.stderr, 4))
    assert test.p_equivalence == pytest.approx(tost)
    # 40 instances moving together are one evaluation's worth of evidence, not 40
    rows = _validation_rows(list(np.array(means) - 0.4), 0.0)
    table = np.array([r["score"] for r in rows])
    assert evaluation_slope_test(table.mean(axis=1), x, margin=0.1).se == pytest.approx(
        hand.stderr)


class _StandIn:
    """Just what `train_to_plateau` reads of a `brorl.train.Run`: the step count, the rows, the
    rollouts, and `train(driver, max_steps)` (here: add one validation row per call, from a
    scripted curve). The real run is trained by the CI study below."""

    def __init__(self, curve: list[float]) -> None:
        self.rows, self.curve, self.step_count, self.calls = _validation_rows(curve, 0.002), \
            curve, 0, []
        self.state = type("State", (), {"evals": self.rows[:1], "rollouts": 0})()

    def train(self, driver, max_steps):
        self.calls.append(max_steps)
        self.step_count += max_steps
        self.state.evals = self.rows[:self.step_count // max_steps + 1]
        self.state.rollouts = self.state.evals[-1]["rollouts"]


def test_the_warm_up_stops_once_flat_or_at_its_cap():
    study = load_params(STUDY_CI, ["study.budget_rollouts=4096", "study.warmup.min_instances=40",
                                   "study.warmup.eval_every=4", "study.warmup.max_steps=40"]).study
    flat = _StandIn([0.0] * 20)
    record = train_to_plateau(flat, study)
    # rows at steps 0, 4, ..., 16 make the first window of 5: flat there, after 4 calls
    assert (record["stopped_by"], record["plateaued"], flat.calls) == ("flat", True, [4] * 4)
    rising = _StandIn([0.01 * k for k in range(20)])
    record = train_to_plateau(rising, study)
    assert (record["stopped_by"], record["plateaued"], record["steps"]) == ("cap", False, 40)
    assert record["verdict"]["flat"] is False


# --- the pool -------------------------------------------------------------------------------

def test_keep_rate_and_the_rescued_share_by_hand():
    # p = 0.5, N = 2: mixed unless both equal: 1 - 0.25 - 0.25 = 0.5; p = 0 or 1: never mixed
    assert keep_rate(np.array([0.5, 0.0, 1.0]), 2).tolist() == [0.5, 0.0, 0.0]
    # all-wrong at N = 1 but not at N = 2: (1 - p) - (1 - p)^2 = 0.5 - 0.25 at p = 0.5
    assert rescued(np.array([0.5]), 1, 2).tolist() == [0.25]
    counts = {b["bin"]: b["count"] for b in histogram(np.array([0.0, 0.001, 0.03, 0.5, 1.0]))}
    assert (counts["0"], counts["1"], counts["(0, 0.001953]"], counts["(0.01562, 0.0625]"]) == \
        (1, 1, 1, 1)
    assert sum(counts.values()) == 5


def _estimates(p: list[float], tries: int = 100) -> dict:
    return {"ids": [f"t/{i:02d}" for i in range(len(p))], "families": ["math"] * len(p),
            "tasks": ["math/t"] * len(p), "solves": [round(x * tries) for x in p],
            "tries": [tries] * len(p)}


def test_the_pool_is_the_hardest_solved_prefix_up_to_the_bands_centre():
    params = load_params(STUDY_CI, ["study.pool.min_prompts=2", "study.pool.target=[0.1,0.9]",
                                    "study.pool.holdout_min_per_family=1",
                                    "study.pool.holdout_fraction=0.5"])
    # N = 16 (the baseline): keep rates of p = 0.01, 0.02, 0.05, 0.3 are 0.149, 0.276, 0.560,
    # 0.997; running means 0.149, 0.213, 0.328, 0.495, then 0.5 is passed by p = 0.5 (0.596)
    p = [0.3, 0.0, 0.05, 0.01, 0.5, 0.02, 0.9]
    band_, _ = band(_estimates(p), params)
    assert [f"t/{i:02d}" for i in band_] == ["t/03", "t/05", "t/02", "t/00"]
    got = choose(_estimates(p), params)
    # the hold-out is half the band, drawn before the pool; the pool is the rest, disjoint
    assert len(got["holdout_ids"]) == 2 and not set(got["holdout_ids"]) & set(got["ids"])
    assert sorted(got["holdout_ids"] + got["ids"]) == ["t/00", "t/02", "t/03", "t/05"]
    rates = {f"t/{i:02d}": x for i, x in enumerate(p)}
    expected = keep_rate(np.array([rates[i] for i in got["ids"]]), 16).mean()
    assert got["predicted_pass_rate"] == pytest.approx(expected)
    assert got["band"] == [0.01, 0.3] and got["band_prompts"] == 4
    assert got["excluded_unsolved"] == 1  # p = 0: never solved, never pooled
    again = choose(_estimates(p), params)  # the same seed draws the same hold-out
    assert again["holdout_ids"] == got["holdout_ids"]
    with pytest.raises(ValueError, match="no prompt pool of at least 64"):
        choose(_estimates(p), load_params(STUDY))
    with pytest.raises(ValueError, match="hold-out split holds too few prompts of"):
        choose(_estimates(p), load_params(STUDY_CI, [
            "study.pool.min_prompts=2", "study.pool.target=[0.1,0.9]",
            "study.pool.holdout_min_per_family=3"]))


def test_the_hold_out_is_drawn_per_family_from_the_band_only():
    families = ["math"] * 10 + ["code"] * 5
    held, rest = hold_out(list(range(15)), families, 0.4, seed=3)
    assert sum(families[i] == "math" for i in held) == 4
    assert sum(families[i] == "code" for i in held) == 2
    assert sorted(held + rest) == list(range(15)) and not set(held) & set(rest)
    assert held == sorted(held) and hold_out(list(range(15)), families, 0.4, seed=3)[0] == held


# --- the report on hand-made run folders ----------------------------------------------------

FAMS = ("math", "code", "reasoning")
IDS = [f"{f}/t/{k}" for f in FAMS for k in range(10)]
START = np.random.default_rng(7).uniform(0.2, 0.6, size=len(IDS))
# Per arm and point: the shift from the start, per-seed offsets (3 seeds each), the same on the
# hold-out and the full test split. brorllr is 0.10 above prorl at both points (tiny seed noise):
# higher; b64 vs brorllr: a 0.02 gap under +-0.08 seed noise: inconclusive; prorl stays within
# 0.003 of the start: the premise, equivalent within +-0.03.
SHIFT = {("prorl", "steps"): 0.0, ("prorl", "budget"): 0.001,
         ("brorllr", "steps"): 0.10, ("brorllr", "budget"): 0.101,
         ("b64", "steps"): 0.08, ("b64", "budget"): 0.08,
         ("brorl", "steps"): 0.04, ("brorl", "budget"): 0.02}
SEED = {"prorl": [0.001, -0.002, 0.001], "brorl": [0.002, -0.001, -0.001],
        "brorllr": [0.0, 0.002, -0.002], "b64": [0.08, -0.08, 0.06]}
DRAW = [0.0005, -0.0005, 0.0]  # the start's three evaluation draws


def _values(arm: str, point: str, seed: int) -> np.ndarray:
    return START + SHIFT[(arm, point)] + SEED[arm][seed]


def _row(step: int, rollouts: int, values, split: str = "test", samples: int = 4) -> dict:
    values = [float(x) for x in values]
    family = {f: {"score": float(np.mean(values[10 * j:10 * j + 10]))} for j, f in enumerate(FAMS)}
    return {"step": step, "split": split, "seconds": float(step), "rollouts": rollouts,
            "samples": samples, "scores": {"family": family}, "problem_ids": IDS,
            "families": [i.split("/")[0] for i in IDS], "pass_at_1": values, "score": values}


def _rows(step: int, rollouts: int, values) -> list[dict]:
    return [_row(step, rollouts, values, "holdout"), _row(step, rollouts, values, "test")]


def _hand_made_study(tmp_path: Path, flat: bool = True):
    seeds = [f"study.arms.{a}.seeds=3" for a in ("prorl", "brorl", "brorllr", "b64")]
    params = load_params(STUDY_CI, [f"study.out_dir={tmp_path}/study", "study.start_replicates=3",
                                    "study.warmup.min_instances=30", *seeds])
    study = params.study
    for run in plan_runs(study):
        folder = tmp_path / "study" / "runs" / run.id
        folder.mkdir(parents=True)
        arm = study.arms[run.arm]
        n = arm.update["prompts_per_step"] * arm.update["rollouts_per_prompt"]
        rows = _rows(0, 0, START) + _rows(1, n, _values(run.arm, "steps", run.seed)) + \
            _rows(256 // n, 256, _values(run.arm, "budget", run.seed))
        (folder / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        # pooled pass rate (32 x 0.5 + 96 x 1) / 128 = 0.875, not the mean of ratios 0.75
        history = [{"generate/rollouts": 32.0, "filter/rollouts_generated": 32.0,
                    "filter/pass_rate": 0.5, "generate/seconds": 1.0,
                    "update/optimizer_steps": 4.0},
                   {"generate/rollouts": 96.0, "filter/rollouts_generated": 96.0,
                    "filter/pass_rate": 1.0, "generate/seconds": 4.0}]
        (folder / "summary.json").write_text(json.dumps(
            {"steps": rows[-1]["step"], "train_seconds": 10.0, "eval_seconds": 3.0,
             "history": history}))
    estimates = _estimates([0.0, 0.01, 0.02, 0.05, 0.3, 0.6, 0.95, 1.0])
    chosen, held = estimates["ids"][1:3], estimates["ids"][3:5]
    (tmp_path / "study" / "pool").mkdir()
    (tmp_path / "study" / "pool" / "pool.json").write_text(json.dumps(
        {"predicted_pass_rate": 0.5, "excluded_unsolved": 1, "target": [0.35, 0.65],
         "n_small": 16, "n_large": 64, "train": summary(estimates, estimates["ids"], 16, 64),
         "pool": summary(estimates, chosen, 16, 64),
         "holdout": summary(estimates, held, 16, 64), "pool_ids": chosen,
         "holdout_ids": held, "estimates": estimates}))
    start = tmp_path / "study" / "start"
    start.mkdir()
    draws = [_rows(0, 0, START + d) for d in DRAW]
    (start / "start.json").write_text(json.dumps({"protocol": {}, "rows": draws[0],
                                                  "replicates": draws}))
    warmup = tmp_path / "study" / "warmup"
    warmup.mkdir()
    curve = [0.0] * 6 if flat else [0.03 * k for k in range(6)]
    val = _validation_rows(curve, 0.001, instances=30, every=100)
    (warmup / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    (warmup / "plateau.json").write_text(json.dumps(
        {"stopped_by": "cap", "plateaued": False, "steps": 20, "rollouts": 500,
         "margin": study.warmup.margin, "window": 5, "budget_rollouts": study.budget_rollouts,
         "alpha": 0.05, "verdict": None}))
    return params


def _seed_means(arm: str, point: str) -> np.ndarray:
    return np.array([_values(arm, point, s).mean() for s in range(3)])


def test_the_report_reads_each_contrast_from_its_numbers(tmp_path):
    r = build_report(_hand_made_study(tmp_path), tmp_path)
    c = r["contrasts"]
    # the seed-level tests are scipy's on the per-seed means
    welch = stats.ttest_ind(_seed_means("brorllr", "budget"), _seed_means("prorl", "budget"),
                            equal_var=False)
    t = c["brorllr_vs_prorl"]["primary"]["score"]["test"]
    assert (t["kind"], t["delta"]) == ("welch", pytest.approx(0.10))
    assert (t["t"], t["p_two_sided"]) == pytest.approx((welch.statistic, welch.pvalue))
    # against the start: Welch between the arm's seeds and the start's three draws
    draws = np.array([(START + d).mean() for d in DRAW])
    premise = stats.ttest_ind(_seed_means("prorl", "budget"), draws, equal_var=False)
    t = c["prorl_vs_start"]["primary"]["score"]["test"]
    assert (t["n_a"], t["n_b"], t["p_two_sided"]) == (3, 3, pytest.approx(premise.pvalue))
    # Holm within the confirmatory family only, in the params' order
    conf = ["brorllr_vs_prorl", "brorllr_vs_prorl_steps", "depth_vs_breadth"]
    assert [n for n in c if c[n]["family"] == "confirmatory"] == conf
    assert [c[n]["p_holm"] for n in conf] == pytest.approx(
        holm([c[n]["primary"]["score"]["test"]["p_two_sided"] for n in conf]))
    readings = {n: c[n]["reading"] for n in c}
    assert readings["brorllr_vs_prorl"] == readings["brorllr_vs_prorl_steps"] == "higher"
    assert readings["depth_vs_breadth"] == "inconclusive"
    assert readings["prorl_vs_start"] == "equivalent"  # the premise, by its TOST
    # no other contrast reads a TOST: equivalence only where the plan has power for it
    assert all(not c[n]["equivalence"] for n in c if n != "prorl_vs_start")
    assert c["depth_vs_breadth"]["detectable"] > 0 and c["depth_vs_breadth"][
        "detectable_level"] == pytest.approx(0.05 / 3)
    assert r["revival"]["brorllr"] == {"revives": True, "premise_shown": True,
                                       "contrasts": ["brorllr_vs_prorl"], "not_higher": []}
    lines = verdict(r)
    assert lines[0].startswith("ProRL continued on the pool") and "equivalent by TOST" in lines[0]
    assert any(x.startswith("N = 512 x B = 2 vs N = 16 x B = 64") and "inconclusive" in x and
               "The design detects" in x for x in lines)
    text = (tmp_path / "study" / "report.md").read_text()
    assert "| brorllr_vs_prorl | confirmatory | brorllr@budget - prorl@budget | +10.00 [" in text
    for png in ("score_vs_rollouts.png", "score_vs_steps.png", "warmup.png", "pool.png"):
        assert (tmp_path / "study" / png).stat().st_size > 3_000, png
    h = headline(r)
    row = h["contrasts"]["brorllr_vs_prorl"]
    assert (row["delta"], row["family"], row["reading"]) == (0.1, "confirmatory", "higher")
    assert row["b_values"] == [round(x, 4) for x in _seed_means("brorllr", "budget")]
    assert h["arms"]["b64"]["holdout_budget"] == [round(x, 4) for x in _seed_means("b64",
                                                                                    "budget")]
    assert h["start"]["holdout"] == [round(x, 4) for x in draws]
    assert (h["pool"], h["revives"]) == ({"prompts": 2, "holdout": 2}, {"brorllr": 1})
    assert r["arms"]["prorl"]["pass_rate"]["mean"] == pytest.approx(0.875)
    assert r["arms"]["prorl"]["optimizer_steps"] == [4, 4, 4]
    # 256 rollouts: 4 ProRL-CI steps of 4 x 16, 2 steps of 2 x 64 or 8 x 16
    assert [r["arms"][a]["steps_at_budget"] for a in ("prorl", "brorllr", "b64")] == \
        [[4] * 3, [2] * 3, [2] * 3]
    # pass@k on the hold-out for k = 1, 2, 4 (4 samples)
    assert list(r["start"]["primary"]["pass_at"]) == ["1", "2", "4"]
    # the pool's and the hold-out's histograms beside the train split's
    assert "| (0.01562, 0.0625] | 2 | 1 | 1 |" in text and "| 0 | 1 | 0 | 0 |" in text
    seeds_md = (tmp_path / "study" / "seeds.md").read_text()
    assert "| b64_s2 | 2 |" in seeds_md and "| start | draw 2 |" in seeds_md


def test_the_report_shows_the_real_model_probe_without_its_wall_clock(tmp_path):
    params = _hand_made_study(tmp_path)
    assert build_report(params, tmp_path)["probe"] is None  # not run: no section
    assert "real-model probe" not in (tmp_path / "study" / "report.md").read_text()
    (tmp_path / "metrics").mkdir()
    shutil.copy(ROOT / "metrics" / "study_probe.json", tmp_path / "metrics")
    r = build_report(params, tmp_path)
    text = (tmp_path / "study" / "report.md").read_text()
    assert "## A real-model probe of the mechanism (exploratory)" in text
    assert f"probed with p in (0, 1/16): {r['probe']['below_one_in_screen']}" in text
    assert "seconds" not in r["probe"] and " rollouts in " not in text


def test_every_interval_excludes_zero_exactly_when_its_p_is_below_alpha(tmp_path):
    r = build_report(_hand_made_study(tmp_path), tmp_path)
    alpha = 1 - r["confidence"]
    checked = 0
    for c in r["contrasts"].values():
        for endpoint in ("primary", "secondary"):
            for metric in ("score", "pass_at_k"):
                t = c[endpoint][metric]["test"]
                if not np.isfinite(t["p_two_sided"]):
                    continue
                assert (t["ci_low"] > 0 or t["ci_high"] < 0) == (t["p_two_sided"] < alpha)
                checked += 1
    assert checked >= 18  # 9 contrasts x 2 endpoints on the score, pass@k where defined


def test_revival_needs_the_premise_and_every_listed_contrast_higher(tmp_path):
    r = build_report(_hand_made_study(tmp_path), tmp_path)
    from brorl.study.analysis import revival

    params = load_params(STUDY_CI)
    found = copy.deepcopy(r["contrasts"])
    found["prorl_vs_start"]["reading"] = "inconclusive"  # the premise not shown
    assert revival(params, found)["brorllr"] == {
        "revives": False, "premise_shown": False, "contrasts": ["brorllr_vs_prorl"],
        "not_higher": []}
    found = copy.deepcopy(r["contrasts"])
    found["brorllr_vs_prorl"]["reading"] = "inconclusive"
    assert revival(params, found)["brorllr"]["not_higher"] == ["brorllr_vs_prorl"]
    # the warm-up's own slope test, evaluations as the unit, is reported beside it
    capped = build_report(_hand_made_study(tmp_path / "capped", flat=False), tmp_path / "capped")
    assert capped["plateau"]["retest"]["flat"] is False
    assert any(x.startswith("The warm-up's validation curve is not shown flat")
               for x in capped["verdict"])


def test_a_point_a_run_did_not_reach_leaves_its_contrasts_unestimated_and_in_the_holm_family(
        tmp_path):
    params = _hand_made_study(tmp_path)
    path = tmp_path / "study" / "runs" / "brorllr_s1" / "evals.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(x) + "\n" for x in rows if x["step"] != 1))
    r = build_report(params, tmp_path)
    c = r["contrasts"]
    short = c["brorllr_vs_prorl_steps"]
    assert "brorllr_s1 ended at step 2" in short["primary"]["not_reached"]
    assert short["reading"] == "not_reached"
    conf = ["brorllr_vs_prorl", "brorllr_vs_prorl_steps", "depth_vs_breadth"]
    # the unestimated contrast counts in Holm's m with p = 1: the others are adjusted as planned
    p = [1.0 if n == "brorllr_vs_prorl_steps" else c[n]["primary"]["score"]["test"]["p_two_sided"]
         for n in conf]
    assert [c[n]["p_holm"] for n in conf] == pytest.approx(holm(p))
    assert c["brorllr_vs_prorl"]["reading"] == "higher"
    assert "steps" not in r["arms"]["brorllr"]["at"]["primary"]
    text = (tmp_path / "study" / "report.md").read_text()
    assert "| brorllr_vs_prorl_steps | confirmatory | brorllr@steps - prorl@steps | not reached" \
        in text
    assert headline(r)["contrasts"]["brorllr_vs_prorl_steps"] == {"reached": 0,
                                                                  "family": "confirmatory"}


def test_a_run_that_went_past_its_budget_is_scored_at_the_budget_and_at_the_equal_steps():
    study = load_params(STUDY).study
    run = next(r for r in plan_runs(study) if r.arm == "brorl")
    # the filter dropped groups: the budget was spent at step 45, min_steps took the run to 48
    rows = [_row(0, 0, START), _row(45, study.budget_rollouts, _values("brorl", "budget", 0)),
            _row(48, study.budget_rollouts + 3 * 1024, _values("brorl", "steps", 0))]
    result = RunResult(summary={"history": []}, evals=rows, run=run)
    assert [point_rows(study, [result], p)[0]["step"] for p in ("budget", "steps")] == [45, 48]
    short = RunResult(summary={"history": []}, evals=rows[:1] + rows[2:], run=run)
    with pytest.raises(ValueError, match=f"run {run.id} has no evaluation at its budget of "
                                         f"{study.budget_rollouts} rollouts"):
        point_rows(study, [short], "budget")


def test_a_frozen_start_is_reused_by_a_rerun_and_a_changed_one_stops_the_stage(tmp_path):
    from brorl.study.frozen import check, freeze
    from brorl.study.pool import write_pool
    from brorl.study.start import write_start
    from brorl.study.warmup import frozen_warmup

    params = _hand_made_study(tmp_path)
    params = load_params(STUDY_CI, [f"study.out_dir={tmp_path}/study",
                                    f"study.frozen={tmp_path}/frozen.json"])
    (tmp_path / "study" / "warmup" / "policy").mkdir()
    (tmp_path / "study" / "warmup" / "policy" / "model.safetensors").write_bytes(b"weights")
    assert not check(params, tmp_path, "pool")  # no record yet: every part is made as usual
    assert set(freeze(params, tmp_path, "old", ["warmup"])["parts"]) == {"warmup"}
    assert not check(params, tmp_path, "pool") and check(params, tmp_path, "warmup")
    record = freeze(params, tmp_path, "abc123")  # the parts not frozen yet, by their commit
    assert {p: r["commit"] for p, r in record["parts"].items()} == {
        "warmup": "old", "pool": "abc123", "start": "abc123"}
    with pytest.raises(ValueError, match="pool is frozen already"):
        freeze(params, tmp_path, "again", ["pool"])
    before = {p: (tmp_path / "study" / p).stat().st_mtime_ns
              for p in ("pool/pool.json", "start/start.json")}
    # a rerun of each stage reuses its part: nothing is estimated, trained or scored again
    # (the pool stage would need the data and a policy to draw anew; here it has neither)
    assert write_pool(params, tmp_path)["pool_ids"] == ["t/01", "t/02"]
    assert write_start(params, tmp_path) == tmp_path / "study" / "start" / "start.json"
    assert frozen_warmup(params, tmp_path)["stopped_by"] == "cap"
    assert {p: (tmp_path / "study" / p).stat().st_mtime_ns for p in before} == before
    # a changed or missing part stops the stage with how to restore it, never redraws it
    (tmp_path / "study" / "pool" / "pool.json").write_text("{}")
    with pytest.raises(ValueError, match="the study's pool is frozen .* differs"):
        write_pool(params, tmp_path)
    (tmp_path / "study" / "start" / "start.json").unlink()
    with pytest.raises(ValueError, match="start is frozen .* is missing: restore it"):
        write_start(params, tmp_path)


# --- DVC: plain repro never starts the study -------------------------------------------------

def _env(clone: Path) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "BRORL_PYTHON": sys.executable, "PREFECT_API_URL": PREFECT_API_URL.value(),
            "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{clone / 'mlflow.db'}",
            "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}


DVC = str(Path(sys.executable).parent / "dvc")


def test_plain_dvc_repro_never_starts_the_study(ci_pipeline, tmp_path):
    """In a clone of the CI pipeline, plain `dvc repro` lists no stage of the study (all its
    outputs are missing there, so its stages would be listed if they were the root's); named,
    they run. (`dvc exp run` without targets reproduces the same default, the root dvc.yaml.)"""
    clone = tmp_path / "repo"
    shutil.copytree(ci_pipeline, clone, symlinks=True)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    plain = subprocess.run([DVC, "repro", "--dry"], cwd=clone, env=env, capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "Stage 'compare'" in plain.stdout or "Running stage 'compare'" in plain.stdout
    assert "study" not in plain.stdout, plain.stdout
    named = subprocess.run([DVC, "repro", "--dry", REPORT], cwd=clone, env=env,
                           capture_output=True, text=True, timeout=300)
    assert f"Running stage '{STUDY_DVC}:study_plan'" in named.stdout, named.stdout


HEAVY = ("torch", "transformers", "datasets", "deepspeed", "vllm", "prefect", "mlflow", "dvc")
"""What `brorl study` must not import before it has checked its arguments."""


@pytest.mark.parametrize(("argv", "names"), [
    ([], "brorl study takes one mode of --warmup, --pool, --plan, --start, --report, --run RUN"),
    (["--run", "n3_s9"], "n3_s9"),
    (["--plan", "-S", "study.budget_rollouts=-1"], "study.budget_rollouts"),
])
def test_brorl_study_answers_bad_arguments_before_any_heavy_import(argv, names):
    """As a process: exit code 2, the error named, no traceback, and (by `-X importtime`, which
    lists every module the process imported) none of HEAVY loaded."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "commands.cli", "study",
                           "--params", str(STUDY_CI), *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    said = "\n".join(line for line in done.stderr.splitlines()
                     if not line.startswith("import time:"))
    assert done.returncode == 2, said
    assert names in said and "Traceback" not in said, said
    assert "commands.entry" in imported  # the listing is there: it names the light module
    assert sorted(m for m in imported if m.split(".")[0] in HEAVY) == []


# --- the whole study at CI size under DVC: killed inside a run, resumed, pushed, pulled -----

CI_RUNS = ("prorl_s0", "brorllr_s0", "b64_s0", "brorl_s0", "prorl_s1", "brorllr_s1")
TIMING = ("seconds", "per_s", "time/", "verdict")
"""Keys of report and step metrics that hold wall-clock figures (or text quoting them): they
differ between two runs of the same work."""


def _lock_runs(clone: Path) -> list[str] | None:
    """The CI runs study/dvc.lock records; None while it cannot be parsed (being written)."""
    path = clone / "study" / "dvc.lock"
    try:
        stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {}) \
            if path.exists() else {}
    except yaml.YAMLError:
        return None
    return [r for r in CI_RUNS if f"study_run@{r}" in stages]


def _mid_run(runs: Path, study) -> tuple[str, int] | None:
    """A run caught inside its training: a complete checkpoint (its state file is written, then
    the `latest` pointer) short of the run's end (rollouts below the budget, or steps below
    `equal_steps` for an arm that stops on steps), and no summary yet. (run, step)."""
    from brorl.train import checkpoint as ckpt

    for folder in sorted(p for p in runs.glob("*") if p.is_dir()):
        try:
            saved = ckpt.latest_checkpoint(folder / "checkpoints")
            state = ckpt.read_state(saved) if saved is not None else None
        except (OSError, ValueError):  # replaced while we read: look again
            continue
        if state is None or (folder / "summary.json").exists():
            continue
        arm = study.arms[folder.name.rsplit("_s", 1)[0]]
        short = state["step"] < study.equal_steps if arm.stop == "steps" else \
            state["run"]["rollouts"] < study.budget_rollouts
        if short:
            return folder.name, state["step"]
    return None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def ci_study(ci_pipeline, prefect_harness, tmp_path_factory):
    """The CI study in a clone of the CI pipeline: a first `dvc repro` frozen (SIGSTOP) as soon
    as one run is recorded by DVC and another is caught inside its training, then killed
    (SIGKILL, the whole process group), then a second `dvc repro` to the end."""
    clone = tmp_path_factory.mktemp("study") / "repo"
    shutil.copytree(ci_pipeline, clone, symlinks=True)
    env, runs = _env(clone), clone / "outputs" / "ci" / "study" / "runs"
    (clone / "study" / "dvc.lock").unlink(missing_ok=True)  # the committed full-size study's
    study = load_params(STUDY_CI).study
    log = clone.parent / "first.log"
    with open(log, "w") as out:
        first = subprocess.Popen([DVC, "repro", REPORT], cwd=clone, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        caught = None
        deadline = time.monotonic() + 1200
        while caught is None and first.poll() is None and time.monotonic() < deadline:
            if _lock_runs(clone) and _mid_run(runs, study) is not None:
                os.killpg(first.pid, signal.SIGSTOP)  # nothing moves while we look
                recorded, mid = _lock_runs(clone), _mid_run(runs, study)
                if recorded and mid is not None:
                    caught = (mid, recorded)
                    os.killpg(first.pid, signal.SIGKILL)
                else:
                    os.killpg(first.pid, signal.SIGCONT)
            time.sleep(0.05)
        first.wait()
    assert caught is not None, "no run was caught mid-way:\n" + log.read_text()[-3000:]
    (interrupted, step), recorded = caught
    before = {r: {name: _digest(path) for name, path in (
        ("summary.json", runs / r / "summary.json"), ("mlflow_run", mlflow_marker(runs / r)),
        ("study_run.json", runs / r / "study_run.json"))} for r in recorded}
    mlflow_before = json.loads(mlflow_marker(runs / interrupted).read_text())["run_id"]
    second = subprocess.run([DVC, "repro", REPORT], cwd=clone, env=env, capture_output=True,
                            text=True, timeout=1500)
    assert second.returncode == 0, (second.stdout[-3000:], second.stderr[-3000:])
    return {"clone": clone, "env": env, "runs": runs, "interrupted": interrupted, "step": step,
            "recorded": recorded, "before": before, "mlflow_before": mlflow_before,
            "second": second.stdout}


@pytest.mark.slow  # the CI study under DVC, killed and resumed: 6 min on 2 cores (make test-all)
def test_an_interrupted_study_resumes_the_caught_run_and_skips_finished_ones(ci_study):
    from mlflow.tracking import MlflowClient

    s = ci_study
    runs, clone = s["runs"], s["clone"]
    for r in s["recorded"]:  # DVC skipped them: same files, one session, same MLflow run
        assert f"Running stage '{STUDY_DVC}:study_run@{r}'" not in s["second"]
        assert {n: _digest(mlflow_marker(runs / r) if n == "mlflow_run" else runs / r / n)
                for n in s["before"][r]} == s["before"][r]
    for stage in ("study_plan", "study_warmup", "study_pool", "study_start"):
        assert f"Running stage '{STUDY_DVC}:{stage}'" not in s["second"]
    marker = json.loads((runs / s["interrupted"] / "study_run.json").read_text())
    assert (marker["sessions"], marker["finished"]) == (2, True)  # resumed, not started over
    summary = json.loads((runs / s["interrupted"] / "summary.json").read_text())
    assert summary["steps"] > s["step"] and len(summary["history"]) == summary["steps"]
    assert json.loads(mlflow_marker(runs / s["interrupted"]).read_text())["run_id"] == \
        s["mlflow_before"]  # resumed into the same MLflow run
    status = subprocess.run([DVC, "status", REPORT], cwd=clone, env=s["env"],
                            capture_output=True, text=True, timeout=300)
    assert "up to date" in status.stdout, status.stdout
    report = json.loads((clone / "outputs" / "ci" / "study" / "report.json").read_text())
    metrics = json.loads((clone / "outputs" / "ci" / "metrics" / "ci_study.json").read_text())
    assert metrics == json.loads(json.dumps(headline(report)))
    pool = json.loads((clone / "outputs" / "ci" / "study" / "pool" / "pool.json").read_text())
    low, high = pool["target"]  # the calibrated pool's predicted ProRL pass rate in its band
    assert low <= pool["predicted_pass_rate"] <= high
    assert pool["pool"]["prompts"] == len(pool["pool_ids"]) >= 8
    assert set(pool["pool_ids"]) <= set(pool["estimates"]["ids"])
    # the hold-out: drawn from the band, disjoint from the pool, the runs' primary endpoint
    held = set(pool["holdout_ids"])
    assert held and not held & set(pool["pool_ids"])
    rows = [json.loads(x) for x in (runs / "prorl_s0" / "evals.jsonl").read_text().splitlines()]
    assert {r["split"] for r in rows} == {"holdout", "test"}
    scored = {i for r in rows if r["split"] == "holdout" for i in r["problem_ids"]}
    assert scored and scored <= held  # train.eval_per_family of each family's hold-out
    start = json.loads((clone / "outputs" / "ci" / "study" / "start" / "start.json").read_text())
    assert len(start["replicates"]) == 2 and start["replicates"][0] == start["rows"]
    assert metrics["start"]["holdout"] and metrics["arms"]["prorl"]["seeds"] == [0, 1]
    assert (clone / "outputs" / "ci" / "metrics" / "ci_study_seeds.md").is_file()
    client = MlflowClient(s["env"]["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("brorl")
    parents = client.search_runs([experiment.experiment_id], "tags.stage = 'study'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    assert sorted(c.data.tags.get("arm", "warmup") for c in children) == sorted(
        ["warmup", "prorl", "prorl", "brorllr", "brorllr", "b64", "brorl"])


def _numbers(tree, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() if not any(t in key for t in TIMING)
                for k, v in _numbers(value, f"{prefix}{key}.").items()}
    if isinstance(tree, list):
        return {k: v for i, value in enumerate(tree)
                for k, v in _numbers(value, f"{prefix}{i}.").items()}
    return {prefix: tree}


def _same(a: dict, b: dict) -> list[str]:
    bad = [k for k in set(a) | set(b) if k not in a or k not in b]
    for k in set(a) & set(b):
        x, y = a[k], b[k]
        if isinstance(x, float) and isinstance(y, float):
            if not (math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) or
                    (math.isnan(x) and math.isnan(y))):
                bad.append(k)
        elif x != y:
            bad.append(k)
    return sorted(bad)


@pytest.mark.slow  # the CI study under DVC, killed and resumed: 6 min on 2 cores (make test-all)
def test_the_resumed_run_equals_the_same_run_uninterrupted(ci_study):
    from brorl.evaluation.protocol import read_start
    from brorl.train import Run

    s = ci_study
    clone, interrupted = s["clone"], s["interrupted"]
    reference = load_params(clone / "params" / "study_ci.yaml",
                            ["study.out_dir=outputs/ci/study_reference"])
    for shared in ("warmup", "pool"):  # the same start policy and pool
        shutil.copytree(clone / "outputs" / "ci" / "study" / shared,
                        clone / "outputs" / "ci" / "study_reference" / shared)
    run = next(r for r in plan_runs(reference.study) if r.id == interrupted)
    start = read_start(clone / "outputs" / "ci" / "study" / "start" / "start.json")
    Run.open(run_params(reference, run), clone).train(start=start)
    histories = [json.loads((clone / "outputs" / "ci" / folder / "runs" / interrupted /
                             "summary.json").read_text())["history"]
                 for folder in ("study", "study_reference")]
    assert _same(*(_numbers({str(i): m for i, m in enumerate(h)}) for h in histories)) == []
    rows = [(clone / "outputs" / "ci" / folder / "runs" / interrupted / "evals.jsonl")
            .read_text().splitlines() for folder in ("study", "study_reference")]
    assert _same(*(_numbers([{k: v for k, v in json.loads(x).items() if k != "seconds"}
                             for x in r]) for r in rows)) == []


@pytest.mark.slow  # the CI study under DVC, killed and resumed: 6 min on 2 cores (make test-all)
def test_a_pushed_study_is_pulled_into_a_fresh_clone_without_rerunning_a_stage(ci_study):
    s = ci_study
    clone, env = s["clone"], s["env"]
    remote = clone.parent / "remote"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]

    def run(cmd: list[str], cwd: Path) -> str:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    run([DVC, "remote", "modify", "--local", "study", "url", str(remote)], clone)
    run([DVC, "push", "--with-deps", REPORT], clone)
    # what a finished study commits: every change git tracks (the lock files, the params) and
    # every stage's metrics and plot files, which DVC does not cache (metrics/ and plots/ at full
    # size; under the ignored outputs/ at CI size: -f)
    run(["git", "add", "-A"], clone)
    run(["git", "add", "-f", "outputs/ci/metrics", "outputs/ci/plots"], clone)
    run([*git, "commit", "-qm", "the CI study"], clone)
    fresh = clone.parent / "fresh"
    run(["git", "clone", "-q", str(clone), str(fresh)], clone.parent)
    run([DVC, "remote", "modify", "--local", "study", "url", str(remote)], fresh)
    run([DVC, "pull", "--with-deps", REPORT], fresh)
    status = run([DVC, "status", "--with-deps", REPORT], fresh)  # the upstream stages too
    assert "up to date" in status, status
    again = run([DVC, "repro", REPORT], fresh)
    assert "Running stage" not in again, again
    out = Path("outputs") / "ci" / "study"
    for name in ("report.md", "report.json", "pool/pool.json", "warmup/plateau.json"):
        assert (fresh / out / name).read_bytes() == (clone / out / name).read_bytes(), name
    assert sorted(p.name for p in (fresh / out / "runs").iterdir()) == sorted(CI_RUNS)


def test_every_table_of_the_study_report_says_what_it_averages_and_which_evaluation(tmp_path):
    params = _hand_made_study(tmp_path)
    build_report(params, tmp_path)
    blocks = [b.strip() for b in (tmp_path / "study" / "report.md").read_text().split("\n\n")
              if b.strip()]
    captions = [blocks[i - 1] for i, b in enumerate(blocks) if b.startswith("|")]
    # arms, hold-out scores, pass@k, full test scores, contrasts, the pool, every seed
    assert len(captions) == 7 and all(c.startswith("Table: ") for c in captions)
    arms, holdout, pass_at, test, contrasts, pool, seeds = captions
    t = params.train
    evaluation = (f"k = 4 per holdout instance, 2 per test instance, temperature "
                  f"{t.eval_temperature:g}, top-p {t.eval_top_p:g}")
    assert "MEAN OVER SEEDS" in holdout and evaluation in holdout and holdout == test
    assert "MEAN OVER INSTANCES (tasks pooled)" in holdout
    assert "SEEDS as the unit" in contrasts and "excludes 0 exactly when p < 0.05" in contrasts
    assert "MEAN OVER ITS SEEDS" in arms and "MEAN OVER SEEDS" in pass_at
    assert "COUNTS OF PROMPTS" in pool and "every run at every point" in seeds
