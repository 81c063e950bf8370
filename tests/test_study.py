"""The study (docs/study.md): the B rule, the run expansion, equal budgets, the run folders between
sessions, the report's statistics on hand-made run folders, and at CI size the whole study under
DVC, killed after its first finished run and resumed, against an uninterrupted study."""

from __future__ import annotations

import copy
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

from brorl.params import ParamsError, load_params
from brorl.params.study import StudyArm, StudyParams
from brorl.study import plan_runs, run_params, write_plan
from brorl.study.progress import mark_finished, prepare_run_dir, progress, progress_line
from brorl.study.report import build_report, headline, verdict

ROOT = Path(__file__).resolve().parents[1]
STUDY, STUDY_CI = ROOT / "params" / "study.yaml", ROOT / "params" / "study_ci.yaml"


# --- the B rule, the runs, the budget --------------------------------------------------------

def test_prompts_per_step_rule_reproduces_both_arms_and_gives_the_sweep():
    study = StudyParams()
    # alpha = log(8 / 2) / log(512 / 16) = log 4 / log 32 = 2 / 5
    assert study.exponent == pytest.approx(0.4)
    # B(N) = round(8 (16 / N)^0.4): 8 x 4^-0.4 = 4.59 -> 5, 8 x 16^-0.4 = 2.64 -> 3,
    # 8 x 32^-0.4 = 2 (the BroRL arm), 8 x 64^-0.4 = 1.52 -> 2
    assert [study.prompts_per_step(n) for n in (16, 64, 256, 512, 1024)] == [8, 5, 3, 2, 2]
    other = StudyParams(arms={"prorl": StudyArm(rollouts_per_prompt=16, prompts_per_step=4),
                              "brorl": StudyArm(rollouts_per_prompt=64, prompts_per_step=1)},
                        sweep_rollouts_per_prompt=[16, 32, 64], budget_rollouts=512, min_steps=1)
    # log 4 / log 4 = 1: B = 4 x 16 / N, so N = 32 -> 2 and N = 1024 -> max(1, 0.06) = 1
    assert [other.prompts_per_step(n) for n in (16, 32, 64, 1024)] == [4, 2, 1, 1]


def test_the_study_expands_to_19_unique_runs_then_its_variants_runs():
    runs = plan_runs(load_params(STUDY).study)
    by_id = {r.id: r for r in runs}
    assert len(runs) == len(by_id) == 5 + 5 + 3 * 3 + 2 * 3
    assert {r.id for r in runs if r.arm == "prorl"} == {f"n16_s{s}" for s in range(5)}
    assert {r.id for r in runs if r.arm == "brorl"} == {f"n512_s{s}" for s in range(5)}
    assert {r.id for r in runs if r.in_sweep} == {
        f"n{n}_s{s}" for n in (16, 64, 256, 512, 1024) for s in range(3)}
    assert (by_id["n16_s2"].arm, by_id["n16_s2"].in_sweep) == ("prorl", True)
    assert (by_id["n16_s3"].arm, by_id["n16_s3"].in_sweep) == ("prorl", False)
    assert (by_id["n64_s1"].arm, by_id["n64_s1"].prompts_per_step) == (None, 5)
    plain, variants = runs[:19], runs[19:]
    assert [r.seed for r in plain] == sorted(r.seed for r in plain)  # seed by seed
    assert [r.id for r in variants] == [f"{v}_s{s}" for s in range(3) for v in ("adaptive", "pods")]
    # a variant's runs take its arm's shape and are neither an arm's seeds nor the sweep's
    assert {(r.variant, r.rollouts_per_prompt, r.prompts_per_step, r.arm, r.in_sweep)
            for r in variants} == {("adaptive", 16, 8, None, False), ("pods", 512, 2, None, False)}


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_every_run_has_the_equal_budget_and_differs_from_the_study_only_in_its_shape():
    params = load_params(STUDY)
    study_leaves = _leaves(params.model_dump(mode="json", exclude={"study"}))
    allowed = {"name", "update.prompts_per_step", "update.rollouts_per_prompt", "train.seed",
               "train.algorithm", "train.max_rollouts", "train.eval_every",
               "train.checkpoint_every", "train.run_dir", "train.checkpoint_dir",
               "tracking.metrics_dir", "tracking.plots_dir"}
    variant_keys = {"adaptive": {"update.allocation"}, "pods": {"update.train_subset"}}
    # a quarter of 8192 is 2048 rollouts: 2048 / (B N) = 2048/128, 2048/320, 2048/768,
    # 2048/1024, 2048/2048 = 16, 6.4, 2.67, 2, 1 steps -> 16, 6, 3, 2, 1
    every = {16: 16, 64: 6, 256: 3, 512: 2, 1024: 1}
    for run in plan_runs(params.study):
        p = run_params(params, run)
        # a run's plan file holds no study section (`run_tree`)
        changed = {k for k, v in _leaves(p.model_dump(mode="json", exclude={"study"})).items()
                   if study_leaves[k] != v}
        extra = variant_keys.get(run.variant, set())
        assert changed <= allowed | extra and extra <= changed, (run.id, changed - allowed)
        n, b = run.rollouts_per_prompt, run.prompts_per_step
        assert p.train.max_rollouts == 8192 and 8192 % n == 0
        assert (p.update.rollouts_per_prompt, p.update.prompts_per_step) == (n, b)
        trained = b * (p.update.train_subset or n)  # pods trains 64 of each group's 512
        assert p.update.lr == pytest.approx(1e-4 * math.sqrt(trained / 128))  # the sqrt rule
        assert p.train.eval_every == every[n] and p.train.seed == run.seed
        assert p.train.init_checkpoint == "outputs/prorl_warmup/policy"
        assert (p.train.eval_per_family, p.train.eval_samples, p.train.eval_seed) == (100, 8, 0)
        assert p.train.run_dir == f"outputs/study/runs/{run.id}"
        assert p.train.algorithm == ("prorl" if n == 16 else "brorl")
    assert 8192 // (2 * 512) == 8  # the BroRL arm takes 8 steps


@pytest.mark.parametrize("override, message", [
    ("study.budget_rollouts=8000", "study.budget_rollouts = 8000 is not divisible by N = 256"),
    ("study.budget_rollouts=4096", "fewer than study.min_steps = 8 steps"),
    ("study.baseline=grpo", "exactly two arms, the baseline among them"),
    ("study.variants.pods.arm=grpo", "study.variants.pods.arm = 'grpo' is not an arm"),
    ("study.variants.adaptive.update.rollouts_per_prompt=64", "not prompts_per_step or rollouts"),
    ("study.variants.pods.update.train_subset=600", "study.variants.pods.update .*update.train_subset = 600"),
])
def test_a_study_that_breaks_a_rule_fails_naming_the_field_and_the_fix(override, message):
    with pytest.raises(ParamsError, match=message):
        load_params(STUDY, [override])


@pytest.mark.parametrize("name", ["pipeline.yaml", "pipeline_ci.yaml"])
def test_the_dvc_foreach_list_is_the_plan_of_the_named_study(name):
    pipeline = yaml.safe_load((ROOT / "params" / name).read_text())
    study = pipeline["study"]
    params = load_params(ROOT / study["params"])
    assert study["runs"] == [r.id for r in plan_runs(params.study)]
    assert (study["out"], study["name"]) == (params.study.out_dir, params.study_label)
    assert params.tracking.metrics_dir == pipeline["dirs"]["metrics"]
    assert params.train.init_checkpoint == f"{pipeline['prorl_warmup']['out']}/policy"
    assert params.data.path == load_params(ROOT / pipeline["data"]["params"]).data.path


def test_the_plan_files_change_only_for_runs_whose_params_changed(tmp_path):
    params = load_params(STUDY_CI, [f"study.out_dir={tmp_path}"])
    ids = write_plan(params, tmp_path)
    assert ids == ["n16_s0", "n64_s0", "n16_s1", "n64_s1", "adaptive_s0", "pods_s0"]
    before = {i: (tmp_path / "plan" / f"{i}.json").read_bytes() for i in ids}
    write_plan(load_params(STUDY_CI, [f"study.out_dir={tmp_path}", "study.resamples=50"]), tmp_path)
    assert {i: (tmp_path / "plan" / f"{i}.json").read_bytes() for i in ids} == before
    more = load_params(STUDY_CI, [f"study.out_dir={tmp_path}", "study.sweep_seeds=3"])
    assert write_plan(more, tmp_path)[5] == "n64_s2"
    assert {i: (tmp_path / "plan" / f"{i}.json").read_bytes() for i in ids} == before
    write_plan(params, tmp_path)
    assert not (tmp_path / "plan" / "n64_s2.json").exists()  # a dropped run's file goes


def test_a_run_folder_resumes_when_interrupted_and_starts_over_when_changed_or_finished(tmp_path):
    folder = tmp_path / "n16_s0"
    assert prepare_run_dir(folder, "n16_s0", "d1").action == "start"
    (folder / "mlflow_run.json").write_text(json.dumps({"run_id": "abc"}))
    killed = prepare_run_dir(folder, "n16_s0", "d1")  # interrupted before its first checkpoint
    assert (killed.action, killed.cleared_mlflow_run) == ("start", "abc")
    _checkpoint(folder)
    assert prepare_run_dir(folder, "n16_s0", "d1").action == "resume"  # interrupted session
    assert (folder / "checkpoints").is_dir()
    (folder / "mlflow_run.json").write_text(json.dumps({"run_id": "def"}))
    mark_finished(folder, 12.5)
    again = prepare_run_dir(folder, "n16_s0", "d1")  # DVC reruns a finished run: code changed
    assert (again.action, again.cleared_mlflow_run) == ("start", "def")
    assert not (folder / "checkpoints").exists()
    _checkpoint(folder)
    assert prepare_run_dir(folder, "n16_s0", "d2").action == "start"  # other params
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

    from tasks.study import forget_run

    client = MlflowClient(mlflow_uri)
    run = client.create_run(client.create_experiment("x")).info.run_id
    forget_run(mlflow_uri, run)
    assert client.get_run(run).info.lifecycle_stage == "deleted"
    forget_run(mlflow_uri, "0" * 32)  # another store's run: already gone


def test_progress_counts_current_finished_runs_and_estimates_from_their_wall_time(tmp_path):
    params = load_params(STUDY_CI, [f"study.out_dir={tmp_path}/study"])
    from brorl.study.progress import digests

    current = digests(params, tmp_path)
    for run_id, wall in (("n16_s0", 10.0), ("n64_s0", 30.0)):
        folder = tmp_path / "study" / "runs" / run_id
        prepare_run_dir(folder, run_id, current[run_id])
        mark_finished(folder, wall)
    stale = tmp_path / "study" / "runs" / "n64_s1"
    prepare_run_dir(stale, "n64_s1", "old-digest")
    mark_finished(stale, 99.0)  # finished with other params: not done
    p = progress(params, tmp_path, "n16_s1")
    # left: n16_s1 and adaptive_s0 (the N=16 mean, 10 s), n64_s1 and pods_s0 (the N=64 mean,
    # 30 s): a variant's runs are estimated by its arm's N
    assert (p.done, p.total, p.elapsed, p.eta) == (2, 6, 40.0, 80.0)
    run = plan_runs(params.study)[2]
    assert progress_line("study-ci", run, p) == (
        "study study-ci: run n16_s1 (N=16, B=4, seed 1) | 2/6 runs done | elapsed 0m40s "
        "| ETA 1m20s")
    assert progress(params, tmp_path, "n16_s1", started=time.time() - 125).elapsed >= 125


# --- the report on hand-made run folders -----------------------------------------------------

IDS = [f"{f}/t/{k}" for f in ("math", "code", "reasoning") for k in ("a", "b")]
START = np.array([0.2, 0.4, 0.3, 0.5, 0.2, 0.3])
FINAL = {"n16_s0": [0.3, 0.4, 0.3, 0.6, 0.1, 0.4], "n16_s1": [0.2, 0.5, 0.4, 0.5, 0.2, 0.3],
         "n64_s0": [0.5, 0.6, 0.4, 0.7, 0.3, 0.5], "n64_s1": [0.4, 0.6, 0.5, 0.8, 0.2, 0.6],
         "adaptive_s0": [0.4, 0.5, 0.3, 0.7, 0.2, 0.4], "pods_s0": [0.5, 0.6, 0.5, 0.7, 0.3, 0.6]}
SECONDS = {"n16_s0": [0, 8, 20], "n16_s1": [0, 12, 24], "n64_s0": [0, 5, 10], "n64_s1": [0, 6, 12],
           "adaptive_s0": [0, 9, 21], "pods_s0": [0, 3, 6]}


def _mid(run_id: str) -> np.ndarray:
    return (START + np.array(FINAL[run_id])) / 2


def _row(step: int, rollouts: int, seconds: float, scores, split: str = "test") -> dict:
    scores = [float(x) for x in scores]
    families = [i.split("/")[0] for i in IDS]
    family = {f: {"score": float(np.mean(scores[2 * j:2 * j + 2])),
                  "pass_at_1": float(np.mean(scores[2 * j:2 * j + 2]))}
              for j, f in enumerate(("math", "code", "reasoning"))}
    return {"step": step, "split": split, "seconds": seconds, "rollouts": rollouts,
            "scores": {"family": family}, "problem_ids": IDS, "families": families,
            "pass_at_1": scores, "score": scores}


def _hand_made_study(tmp_path: Path):
    params = load_params(STUDY_CI, [f"study.out_dir={tmp_path}/study", "study.resamples=2000",
                                    "study.budget_rollouts=128", "study.evaluations=2",
                                    f"train.init_checkpoint={tmp_path}/warmup/policy"])
    for run_id, final in FINAL.items():
        folder = tmp_path / "study" / "runs" / run_id
        folder.mkdir(parents=True)
        s = SECONDS[run_id]
        rows = [_row(0, 0, s[0], START), _row(1, 64, s[1], _mid(run_id)), _row(2, 128, s[2], final)]
        (folder / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        # pooled pass rate (16 + 96) / 128 = 0.875, not the mean of ratios 0.75; throughput
        # 128 rollouts / 5 s = 25.6, not (32 + 24) / 2 = 28
        history = [{"train/step": 1.0, "generate/rollouts": 32.0, "filter/rollouts_generated": 32.0,
                    "filter/pass_rate": 0.5, "generate/seconds": 1.0},
                   {"train/step": 2.0, "generate/rollouts": 96.0, "filter/rollouts_generated": 96.0,
                    "filter/pass_rate": 1.0, "generate/seconds": 4.0}]
        # shrinkage diagnostics: the held-out Q_pos starts at 0.30 - 0.02 = 0.28 and ends at
        # 0.27 (N=16) or 0.33 (N=64); unsolved prompts lose 0.002 then 0.004 per update (N=16)
        small = run_id.startswith(("n16", "adaptive"))
        for m, q, since, worst, unsolved in zip(
                history, (0.30, 0.27 if small else 0.33), (60.0, 40.0 if small else 80.0),
                (-0.01, -0.03 if small else -0.02), (-0.002, -0.004 if small else 0.0)):
            m.update({"generate/rollouts_total": 32.0 if m["train/step"] == 1 else 128.0,
                      "diag/heldout/q_pos": q, "diag/heldout/q_pos_delta": 0.02,
                      "diag/heldout/pct_improved_since_start": since,
                      "diag/heldout/worst_drop_since_start": worst,
                      "diag/solved/q_pos_delta": 0.003, "diag/unsolved/q_pos_delta": unsolved})
        (folder / "summary.json").write_text(json.dumps(
            {"steps": 2, "train_seconds": float(s[2]), "eval_seconds": 3.0,
             "checkpoint_seconds": 0.5, "history": history}))
    warmup = tmp_path / "warmup"
    warmup.mkdir()
    rows = [_row(step, 0, 0, START + d, "validation") for step, d in ((0, 0.0), (4, 0.1), (8, 0.1))]
    (warmup / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (warmup / "summary.json").write_text(json.dumps({"steps": 8}))
    return params


def test_the_report_holds_hand_computed_means_tests_and_pooled_rates(tmp_path):
    params = _hand_made_study(tmp_path)
    r = build_report(params, tmp_path)
    a = (np.array(FINAL["n16_s0"]) + np.array(FINAL["n16_s1"])) / 2  # per instance, seed mean
    b = (np.array(FINAL["n64_s0"]) + np.array(FINAL["n64_s1"])) / 2
    prorl, brorl = r["arms"]["prorl"], r["arms"]["brorl"]
    assert prorl["score"]["overall"]["mean"] == pytest.approx((2.1 + 2.1) / 12)  # 0.35
    assert prorl["score"]["math"]["mean"] == pytest.approx((0.3 + 0.4 + 0.2 + 0.5) / 4)
    assert brorl["score"]["overall"]["mean"] == pytest.approx((3.0 + 3.1) / 12)
    low, high = brorl["score"]["overall"]["low"], brorl["score"]["overall"]["high"]
    assert low < brorl["score"]["overall"]["mean"] < high
    test = r["equal_rollouts"]["paired_test"]
    ref = stats.ttest_rel(b, a)
    assert test["delta"] == pytest.approx(0.95 / 6)  # b - a = .2 .15 .1 .2 .1 .2
    assert test["t"] == pytest.approx(ref.statistic)
    assert test["p_two_sided"] == pytest.approx(ref.pvalue)
    assert test["n"] == 6
    # equal time: T* = min(20, 24, 10, 12) = 10 s. n16_s0 lies between 8 s and 20 s (w = 2/12),
    # n16_s1 between 0 s and 12 s (w = 10/12), n64_s0 ends at 10 s, n64_s1 between 6 and 12
    # (w = 4/6)
    assert r["equal_time"]["seconds"] == 10
    at_a = ((5 / 6 * _mid("n16_s0") + 1 / 6 * np.array(FINAL["n16_s0"]))
            + (1 / 6 * START + 5 / 6 * _mid("n16_s1"))) / 2
    at_b = (np.array(FINAL["n64_s0"])
            + (1 / 3 * _mid("n64_s1") + 2 / 3 * np.array(FINAL["n64_s1"]))) / 2
    assert r["equal_time"]["paired_test"]["delta"] == pytest.approx(float((at_b - at_a).mean()))
    assert prorl["at_equal_time"]["overall"]["mean"] == pytest.approx(float(at_a.mean()))
    assert prorl["pass_rate"]["mean"] == pytest.approx(0.875)
    assert prorl["rollouts_per_s"]["mean"] == pytest.approx(25.6)
    assert r["sweep"]["peak"]["N"] == 64 and [p["N"] for p in r["sweep"]["points"]] == [16, 64]
    start = r["plateau"]["baseline_vs_start"]["paired_test"]
    assert start["delta"] == pytest.approx(float((a - START).mean()))
    assert r["plateau"]["warmup_validation"]["start_step"] == 8
    assert len(r["plateau"]["warmup_validation"]["points"]) == 3
    assert ref.pvalue < 0.05 and "higher" in r["verdict"][0] and "Significant" in r["verdict"][0]
    # a - START = .05 .05 .05 .05 -.05 .05: mean .033, t = 2.0, p = 0.10
    assert start["p_two_sided"] == pytest.approx(stats.ttest_rel(a, START).pvalue)
    assert start["p_two_sided"] > 0.05
    assert "prorl does not change significantly from the start (+3.33 points" in r["verdict"][-2]
    out = tmp_path / "study"
    text = (out / "report.md").read_text()
    assert "| Method | N | Prompts/step |" in text and "## N-sweep" in text
    for png in ("score_vs_rollouts.png", "score_vs_seconds.png", "sweep.png", "warmup.png",
                "shrinkage.png"):
        assert (out / png).stat().st_size > 5_000, png
    shrink = {name: a["shrinkage"] for name, a in r["arms"].items()}
    assert shrink["prorl"]["q_pos_change"]["mean"] == pytest.approx(-0.01)
    assert shrink["brorl"]["q_pos_change"]["mean"] == pytest.approx(0.05)
    assert shrink["prorl"]["unsolved_delta"]["mean"] == pytest.approx(-0.003)
    assert shrink["brorl"]["worst_drop_since_start"]["mean"] == pytest.approx(-0.02)
    assert shrink["brorl"]["pct_improved_since_start"]["mean"] == pytest.approx(80.0)
    assert shrink["prorl"]["solved_delta"]["mean"] == pytest.approx(0.003)
    assert "## Knowledge shrinkage on the live policy" in text and "shrinkage.png" in text
    assert "| prorl (16) | -0.0100 [" in text
    # the variants: one seed each, against every seed of each arm at equal rollouts
    adaptive, pods = r["variants"]["adaptive"], r["variants"]["pods"]
    assert (adaptive["arm"], adaptive["N"], adaptive["B"], adaptive["runs"]) == \
        ("prorl", 16, 4, ["adaptive_s0"])
    assert (pods["N"], pods["update"]) == (64, {"train_subset": 16})
    versus = adaptive["versus"]["prorl"]["paired_test"]
    assert versus["delta"] == pytest.approx(float((np.array(FINAL["adaptive_s0"]) - a).mean()))
    assert versus["p_two_sided"] == pytest.approx(
        stats.ttest_rel(np.array(FINAL["adaptive_s0"]), a).pvalue)
    assert pods["versus"]["brorl"]["paired_test"]["delta"] == pytest.approx(
        float((np.array(FINAL["pods_s0"]) - b).mean()))
    assert math.isnan(pods["score"]["overall"]["low"]) is False  # instances still resampled
    assert "at_equal_time" not in pods  # T* is the arms'
    assert "## Variants: other update settings at an arm's shape" in text
    assert "| adaptive | prorl (16, 4) | allocation: adaptive | 1 |" in text
    assert sum("At equal rollouts, pods (brorl's shape with train_subset: 16)" in line
               for line in r["verdict"]) == 2
    assert "| pods (64) |" in text  # in the shrinkage table too
    assert headline(r)["adaptive_vs_prorl"] == round(versus["delta"], 4)
    assert headline(r)["delta_rollouts"] == round(0.95 / 6, 4) and headline(r)["peak_n"] == 64
    p = r["equal_rollouts"]["paired_test"]["p_two_sided"]
    assert headline(r)["p_rollouts"] == float(f"{p:.3g}") > 0  # significant digits, never 0


def test_the_peak_n_is_split_between_tied_n_and_certain_when_one_n_always_wins():
    from brorl.study.analysis import peak

    study = StudyParams(resamples=400)
    low = np.array([[0.1, 0.2, 0.3]])  # one seed: both N see the same resampled instances
    tied = peak({16: low, 64: low.copy()}, study)  # every resample ties: half each
    assert (tied["tied"], tied["shares"], tied["interval"]) == ([16, 64], {"16": 0.5, "64": 0.5},
                                                               [16, 64])
    two = np.array([[0.1, 0.2, 0.3], [0.2, 0.1, 0.3]])
    clear = peak({16: two, 64: two + 0.5, 256: two + 0.2}, study)  # 64 highest in every resample
    assert (clear["N"], clear["share"], clear["interval"]) == (64, 1.0, [64, 64])


def test_the_verdict_says_not_significant_when_the_test_is_not(tmp_path):
    r = build_report(_hand_made_study(tmp_path), tmp_path)
    null = copy.deepcopy(r)
    null["equal_rollouts"]["paired_test"].update(delta=0.004, p_two_sided=0.4, mde=0.03)
    line = verdict(null)[0]
    assert "Not significant at alpha = 0.05" in line and "3.00 points or more" in line


def test_the_report_refuses_a_run_that_ended_off_the_budget(tmp_path):
    params = _hand_made_study(tmp_path)
    path = tmp_path / "study" / "runs" / "n64_s1" / "evals.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[-1]["rollouts"] = 120
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    with pytest.raises(ValueError, match="n64_s1 ended at 120 rollouts, not the study's budget 128"):
        build_report(params, tmp_path)


# --- the whole study at CI size under DVC: interrupted and resumed ---------------------------

TIMING = ("seconds", "per_s", "time/", "equal_time", "verdict")
"""Keys of report and step metrics that hold wall-clock figures (or text quoting them): they
differ between two runs of the same work."""


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
            both_nan = math.isnan(x) and math.isnan(y)
            if not (math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) or both_nan):
                bad.append(k)
        elif x != y:
            bad.append(k)
    return sorted(bad)


def _recorded_ci_runs(clone: Path) -> list[str]:
    """The CI study's runs that dvc.lock records as done (the committed lock may also hold the
    full-size study's runs, under the same ids but other output folders)."""
    path = clone / "dvc.lock"
    try:
        stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {}) if path.exists() else {}
    except yaml.YAMLError:  # caught while DVC rewrites it
        return []
    return [r for r in ("n16_s0", "n64_s0", "n16_s1", "n64_s1", "adaptive_s0", "pods_s0")
            if any(out.get("path") == f"outputs/ci/study/runs/{r}"
                   for out in stages.get(f"study_run@{r}", {}).get("outs", []))]


def test_an_interrupted_study_resumes_without_redoing_finished_runs(ci_pipeline, prefect_harness,
                                                                    tmp_path):
    from mlflow.tracking import MlflowClient
    from prefect.settings import PREFECT_API_URL

    from brorl.train import Run

    clone = tmp_path / "repo"
    shutil.copytree(ci_pipeline, clone, symlinks=True)
    dvc = str(Path(sys.executable).parent / "dvc")
    uri = f"sqlite:///{clone / 'mlflow-study.db'}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "BRORL_PYTHON": sys.executable, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": uri,
           "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}
    runs = clone / "outputs" / "ci" / "study" / "runs"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen([dvc, "repro", "study_report"], cwd=clone, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        deadline, finished, interrupted, first_done = time.monotonic() + 400, [], None, None
        while time.monotonic() < deadline and first.poll() is None:
            finished = _recorded_ci_runs(clone)
            if finished:  # kill once another run has a checkpoint to resume from (or 60 s later)
                first_done = first_done or time.monotonic()
                started = [p.parent.parent.name for p in runs.glob("*/checkpoints/latest")
                           if p.parent.parent.name not in finished]
                if started or time.monotonic() > first_done + 60:
                    interrupted = started[0] if started else None
                    break
            time.sleep(0.2)
        assert first.poll() is None and finished, (tmp_path / "first.log").read_text()[-3000:]
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    kept = {r: (runs / r / "summary.json").stat().st_mtime_ns for r in finished}
    done = subprocess.run([dvc, "repro", "study_report"], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    for r in finished:  # not redone: DVC skipped the stage, the files are the first session's
        assert f"Running stage 'study_run@{r}'" not in done.stdout
        assert (runs / r / "summary.json").stat().st_mtime_ns == kept[r]
    if interrupted is not None:  # resumed from its checkpoint, not started over
        assert json.loads((runs / interrupted / "study_run.json").read_text())["sessions"] == 2
    status = subprocess.run([dvc, "status", "study_report"], cwd=clone, env=env,
                            capture_output=True, text=True, timeout=120)
    assert "up to date" in status.stdout, status.stdout
    report = json.loads((clone / "outputs" / "ci" / "study" / "report.json").read_text())
    metrics = json.loads((clone / "outputs" / "ci" / "metrics" / "ci_study.json").read_text())
    assert _same(metrics, headline(report)) == []

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("brorl")
    parents = client.search_runs([experiment.experiment_id], "tags.stage = 'study'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    assert sorted((c.data.tags["N"], c.data.tags["seed"], c.data.tags["arm"]) for c in children) \
        == [("16", "0", "adaptive"), ("16", "0", "prorl"), ("16", "1", "prorl"),
            ("64", "0", "brorl"), ("64", "0", "pods"), ("64", "1", "brorl")]
    assert {c.data.tags["B"] for c in children} == {"4", "1"}

    # the same study without interruption: the runs DVC finished in one session are copied, the
    # interrupted one (else the last one) is trained again in this process, uninterrupted; the
    # report from those runs holds the same numbers, and the retrained run the same steps
    reference = load_params(clone / "params" / "study_ci.yaml",
                            ["study.out_dir=outputs/ci/study_reference"])
    retrained = interrupted or finished[-1]
    for run in plan_runs(reference.study):
        if run.id == retrained:
            Run.open(run_params(reference, run), clone).train()
        else:
            shutil.copytree(runs / run.id, clone / "outputs" / "ci" / "study_reference" / "runs"
                            / run.id)
    again = build_report(reference, clone)
    assert _same(_numbers(report), _numbers(json.loads(json.dumps(again)))) == []
    histories = [json.loads((clone / "outputs" / "ci" / folder / "runs" / retrained /
                             "summary.json").read_text())["history"]
                 for folder in ("study", "study_reference")]
    assert _same(*(_numbers({str(i): m for i, m in enumerate(h)}) for h in histories)) == []
