"""The comparison report (brorl.evaluation.compare) on hand-built run folders in the
evaluation-record format (one row per (step, split)): which rows count, the baseline's direction,
the budget check, pooled Table 2 fractions, Table 1 columns and the report's wording."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from brorl.evaluation.compare import (
    ArmResult,
    build_report,
    headline,
    paired,
    report_metrics,
    start_and_end,
    table1,
    table2,
)
from brorl.params import ParamsError, compare_arms, load_params

ROOT = Path(__file__).resolve().parents[1]

IDS = ["m0", "m1", "c0", "c1", "r0", "r1"]
FAMS = ["math", "math", "code", "code", "reasoning", "reasoning"]


def _row(step, rollouts, score, *, split="test", seconds=0.0, pass_at_1=None, family=None):
    """One evaluation row; `score` per instance (None: an old row with pass_at_1 only)."""
    row = {"step": step, "split": split, "seconds": seconds, "rollouts": rollouts,
           "scores": {"family": family or {}}, "problem_ids": IDS, "families": FAMS,
           "pass_at_1": pass_at_1 if pass_at_1 is not None else score}
    if split is None:
        del row["split"]
    if score is not None:
        row["score"] = score
    return row


def _arm(tmp_path, name, rows, history=(), **summary):
    folder = tmp_path / name
    folder.mkdir()
    summary = {"steps": rows[-1]["step"], "rollouts_per_prompt": 16, "prompts_per_step": 8,
               "train_seconds": 10.0, "eval_seconds": 4.0, "checkpoint_seconds": 1.0,
               "history": list(history), **summary}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ArmResult.load(name, folder)


BASE = [0.0, 0.5, 0.25, 0.75, 0.3, 0.4]


def test_only_test_rows_count_and_the_last_row_of_a_step_wins(tmp_path):
    arm = _arm(tmp_path, "prorl", [
        _row(0, 0, BASE), _row(0, 0, [1.0] * 6, split="validation"),
        _row(2, 256, [0.0] * 6, split=None),  # an old row without "split" counts as test
        _row(2, 256, BASE, split=None),  # a resumed run rewrote step 2: the later row wins
        _row(4, 512, [1.0] * 6, split="validation")])
    assert [(r["step"], r["score"]) for r in arm.evals] == [(0, BASE), (2, BASE)]


def test_an_arm_without_test_rows_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no test rows"):
        _arm(tmp_path, "prorl", [_row(0, 0, BASE, split="validation")])


def test_the_paired_difference_is_arm_minus_baseline_whatever_the_order(tmp_path):
    arm_scores = [0.25, 0.5, 0.5, 1.0, 0.6, 0.4]  # differences 0.25, 0, 0.25, 0.25, 0.3, 0
    prorl = _arm(tmp_path, "prorl", [_row(4, 512, BASE)])
    brorl = _arm(tmp_path, "brorl", [_row(1, 512, arm_scores)])
    for order in ([prorl, brorl], [brorl, prorl]):
        test = build_report(order, tmp_path / "out", "prorl")["paired_test"]
        assert (test["arm"], test["baseline"], test["instances"]) == ("brorl", "prorl", 6)
        assert test["delta"] == pytest.approx(1.05 / 6)  # (0.25 + 0.25 + 0.25 + 0.3) / 6
    assert paired(brorl, prorl)["delta"] == pytest.approx(-1.05 / 6)
    fams = paired(prorl, brorl)["families"]
    assert {f: t["delta"] for f, t in fams.items()} == pytest.approx(
        {"math": 0.125, "code": 0.25, "reasoning": 0.15})


def test_paired_refuses_unequal_budgets_naming_both_counts(tmp_path):
    prorl = _arm(tmp_path, "prorl", [_row(16, 2048, BASE)])
    brorl = _arm(tmp_path, "brorl", [_row(3, 3072, BASE)])
    with pytest.raises(ValueError, match="brorl generated 3072 rollouts and prorl 2048"):
        paired(prorl, brorl)


def test_paired_uses_the_headline_score_and_falls_back_to_pass_at_1(tmp_path):
    # new rows: "score" (reasoning: mean reward) differs from pass_at_1; the test uses score
    prorl = _arm(tmp_path, "prorl", [_row(4, 512, BASE, pass_at_1=[0.0] * 6)])
    brorl = _arm(tmp_path, "brorl", [_row(1, 512, [s + 0.1 for s in BASE],
                                          pass_at_1=[1.0] * 6)])
    assert paired(prorl, brorl)["delta"] == pytest.approx(0.1)
    # old rows: only pass_at_1 per instance
    old_a = _arm(tmp_path, "old_a", [_row(4, 512, None, pass_at_1=[0.0, 0.5] * 3)])
    old_b = _arm(tmp_path, "old_b", [_row(1, 512, None, pass_at_1=[0.5, 0.5] * 3)])
    assert paired(old_a, old_b)["delta"] == pytest.approx(0.25)


def test_table2_pools_pass_rate_and_throughput_over_steps(tmp_path):
    # step 1: 100 rollouts, pass rate 0.5, 1 s of generation; step 2: 300, 1.0, 10 s.
    # Pooled pass rate (50 + 300) / 400 = 87.5% (the mean of ratios would say 75%); pooled
    # throughput 400 / 11 = 36.4 rollouts/s (the mean of ratios would say 65).
    history = [{"filter/pass_rate": 0.5, "filter/pass_rate_binary": 0.2,
                "filter/rollouts_generated": 100.0, "generate/rollouts": 100.0,
                "generate/seconds": 1.0},
               {"filter/pass_rate": 1.0, "filter/pass_rate_binary": 0.6,
                "filter/rollouts_generated": 300.0, "generate/rollouts": 300.0,
                "generate/seconds": 10.0}]
    arm = _arm(tmp_path, "prorl", [_row(2, 400, BASE)], history, train_seconds=12.3,
               eval_seconds=3.5, checkpoint_seconds=0.7)
    assert arm.pass_rate() == pytest.approx(0.875) and arm.throughput() == pytest.approx(400 / 11)
    # binary: (20 + 180) / 400 = 50%; any_difference not logged: a dash
    assert table2([arm]).splitlines()[-1] == \
        "| prorl | 16 | 8 | 87.5% | 50.0% | – | 36.4 | 12.3 | 3.5 | 0.7 |"


def test_table1_scores_reasoning_by_mean_reward_with_pass_at_1_beside_it(tmp_path):
    family = {"math": {"pass_at_1": 0.3, "reward_mean": 0.3, "score": 0.3},
              "code": {"pass_at_1": 0.5, "reward_mean": 0.7, "score": 0.5},
              "reasoning": {"pass_at_1": 0.25, "reward_mean": 0.35, "score": 0.35}}
    arm = _arm(tmp_path, "prorl", [_row(4, 256, BASE, seconds=12.5, family=family)])
    header, _, line = table1([arm]).splitlines()
    assert "Reasoning mean reward | Reasoning pass@1 | training time (s)" in header
    assert line == "| prorl | 4 | 256 | 30.00 | 50.00 | 35.00 | 25.00 | 12.5 |"


def _significance_report(tmp_path, differences):
    prorl = _arm(tmp_path, "prorl", [_row(4, 512, [0.25] * 6)])
    brorl = _arm(tmp_path, "brorl", [_row(1, 512, [0.25 + d for d in differences])])
    report = build_report([prorl, brorl], tmp_path / "out", "prorl")
    return report, (tmp_path / "out" / "report.md").read_text()


def test_report_says_when_the_difference_is_not_significant(tmp_path):
    report, text = _significance_report(tmp_path, [0.25, -0.25, 0.5, -0.5, 0.25, -0.25])
    assert report["paired_test"]["p_two_sided"] == pytest.approx(1.0)  # mean difference 0
    assert "NOT significant" in text and "ONE training seed" in text
    assert (tmp_path / "out" / "scores.png").stat().st_size > 10_000
    assert (tmp_path / "out" / "pass_at_1.png").stat().st_size > 10_000


def test_report_says_when_the_difference_is_significant(tmp_path):
    report, text = _significance_report(tmp_path, [0.5, 0.45, 0.55, 0.5, 0.4, 0.6])
    assert report["paired_test"]["p_two_sided"] < 0.001
    assert "is significant at the 0.05 level (two-sided): brorl scores higher" in text
    assert "ONE training seed" in text


def test_the_headline_metrics_stay_small(tmp_path):
    report, _ = _significance_report(tmp_path, [0.5, 0.45, 0.55, 0.5, 0.4, 0.6])
    test = report["paired_test"]
    got = headline(report)
    assert set(got) == {"delta", "ci_low", "ci_high", "p", "p_two_sided", "mde"}
    assert got["delta"] == 0.5 and got["p"] == round(test["p_one_tailed"], 4)
    assert got["p_two_sided"] == round(test["p_two_sided"], 4) < 0.001


def test_the_baseline_must_be_an_arm():
    with pytest.raises(ParamsError, match="compare.baseline 'grpo' is not a key of compare.arms"):
        load_params(ROOT / "params" / "compare.yaml", ["compare.baseline=grpo"])
    assert load_params(ROOT / "params" / "compare.yaml").compare.baseline == "prorl"


def test_paired_matches_instances_by_id_across_shuffled_partly_overlapping_rows(tmp_path):
    """The arm's row lists its instances in another order and shares 4 of 5 with the baseline's:
    each difference is taken between the same instance's two scores (hand-matched here), the
    instances only one row has are left out and counted, and the sign is arm - baseline."""
    from scipy import stats

    def row(ids, families, scores):
        return {"step": 2, "split": "test", "seconds": 0.0, "rollouts": 512, "problem_ids": ids,
                "families": families, "score": scores, "pass_at_1": scores,
                "scores": {"family": {}}}

    base_ids, base_fams = ["a", "b", "c", "d", "e"], ["math", "math", "code", "code", "math"]
    arm_ids, arm_fams = ["d", "b", "x", "a", "c"], ["code", "math", "math", "math", "code"]
    prorl = _arm(tmp_path, "prorl", [row(base_ids, base_fams, [0.1, 0.2, 0.3, 0.4, 0.9])])
    brorl = _arm(tmp_path, "brorl", [row(arm_ids, arm_fams, [0.8, 0.6, 0.0, 0.2, 0.4])])
    base = [0.1, 0.2, 0.3, 0.4]  # a, b, c, d
    mine = [0.2, 0.6, 0.4, 0.8]  # the arm's a, b, c, d, read from its shuffled row
    result = paired(prorl, brorl)
    assert result["instances"] == 4 and result["unmatched"] == 2  # e and x
    assert result["delta"] == pytest.approx(sum(mine) / 4 - sum(base) / 4) and result["delta"] > 0
    t = stats.ttest_rel(mine, base)
    assert result["t"] == pytest.approx(t.statistic) and result["t"] > 0
    assert result["p_two_sided"] == pytest.approx(t.pvalue)
    assert result["families"]["math"]["delta"] == pytest.approx(((0.2 - 0.1) + (0.6 - 0.2)) / 2)
    assert result["families"]["code"]["delta"] == pytest.approx(((0.4 - 0.3) + (0.8 - 0.4)) / 2)
    flipped = paired(brorl, prorl)
    assert flipped["delta"] == pytest.approx(-result["delta"]) and flipped["t"] < 0


def test_start_and_end_per_family_is_the_baseline_start_each_arms_last_row_and_the_change(
        tmp_path):
    """Two instances per family, so every number is worked by hand. The bootstrap interval of a
    mean of two scores is [lower, higher]: a resample's mean is the lower one with probability
    1/4 (about 2500 of the 10,000 draws), far more than the 2.5% tail. The change's t interval
    has 1 degree of freedom (a Cauchy: quantile tan(pi (q - 1/2))): mean +- T se, with
    se = |d1 - d2| / 2 and t = mean / se; |t| = 1 gives p = 0.5 (half a Cauchy's mass lies
    beyond +-1). Equal differences make the interval the point and p NaN (`paired_test`)."""
    t_975 = math.tan(0.475 * math.pi)  # 12.706
    prorl = _arm(tmp_path, "prorl", [
        _row(0, 0, BASE),  # the start: math 0.0 0.5, code 0.25 0.75, reasoning 0.3 0.4
        _row(2, 256, [1.0] * 6),  # not the last row: ignored
        _row(4, 512, [0.5, 0.5, 0.25, 0.25, 0.6, 0.7])])
    brorl = _arm(tmp_path, "brorl", [
        _row(0, 0, [1.0] * 6),  # its own step 0: the start is the baseline's, not this
        _row(1, 512, [1.0, 0.5, 0.0, 0.5, 0.2, 0.4])])
    got = start_and_end([brorl, prorl], "prorl")  # the baseline by name, not the first arm
    assert got["start_step"] == 0 and list(got["families"]) == ["math", "code", "reasoning"]
    fams = got["families"]

    def interval(mean, low, high):
        return pytest.approx({"mean": mean, "low": low, "high": high})

    def change(mean, se, p):
        return pytest.approx({"mean": mean, "low": mean - t_975 * se,
                              "high": mean + t_975 * se, "p": p}, nan_ok=True)

    assert [fams[f]["instances"] for f in fams] == [2, 2, 2]
    assert fams["math"]["start"] == interval(0.25, 0.0, 0.5)  # (0.0 + 0.5) / 2
    assert fams["code"]["start"] == interval(0.5, 0.25, 0.75)  # (0.25 + 0.75) / 2
    assert fams["reasoning"]["start"] == interval(0.35, 0.3, 0.4)  # (0.3 + 0.4) / 2
    # prorl ends at math 0.5 0.5, code 0.25 0.25, reasoning 0.6 0.7
    assert fams["math"]["prorl"]["end"] == interval(0.5, 0.5, 0.5)
    assert fams["code"]["prorl"]["end"] == interval(0.25, 0.25, 0.25)
    assert fams["reasoning"]["prorl"]["end"] == interval(0.65, 0.6, 0.7)
    # math: end - start = 0.5, 0.0: mean +0.25, se 0.25, t 1
    assert fams["math"]["prorl"]["change"] == change(0.25, 0.25, 0.5)
    # code: 0.0, -0.5: mean -0.25 (a loss), se 0.25, t -1
    assert fams["code"]["prorl"]["change"] == change(-0.25, 0.25, 0.5)
    # reasoning: 0.3, 0.3: equal, the interval is the point +0.3
    assert fams["reasoning"]["prorl"]["change"] == change(0.3, 0.0, math.nan)
    # brorl ends at math 1.0 0.5, code 0.0 0.5, reasoning 0.2 0.4
    assert fams["math"]["brorl"]["end"] == interval(0.75, 0.5, 1.0)
    assert fams["code"]["brorl"]["end"] == interval(0.25, 0.0, 0.5)
    assert fams["reasoning"]["brorl"]["end"] == interval(0.3, 0.2, 0.4)
    # math: 1.0, 0.0: mean +0.5, se 0.5; code: -0.25, -0.25: the point -0.25;
    # reasoning: -0.1, 0.0: mean -0.05, se 0.05, t -1
    assert fams["math"]["brorl"]["change"] == change(0.5, 0.5, 0.5)
    assert fams["code"]["brorl"]["change"] == change(-0.25, 0.0, math.nan)
    assert fams["reasoning"]["brorl"]["change"] == change(-0.05, 0.05, 0.5)


def test_table1_reads_a_family_without_score_by_its_headline_quantity(tmp_path):
    """Family scores written before "score" existed (`brorl.runs.legacy.family_key`): reasoning's
    headline is its mean reward (0.35), not its pass@1 (0.25)."""
    family = {"math": {"pass_at_1": 0.3, "reward_mean": 0.3},
              "code": {"pass_at_1": 0.5, "reward_mean": 0.7},
              "reasoning": {"pass_at_1": 0.25, "reward_mean": 0.35}}
    arm = _arm(tmp_path, "prorl", [_row(4, 256, BASE, seconds=12.5, family=family)])
    line = table1([arm]).splitlines()[-1]
    assert line == "| prorl | 4 | 256 | 30.00 | 50.00 | 35.00 | 25.00 | 12.5 |"


def test_arms_scored_under_different_protocols_are_refused_by_name(tmp_path):
    """`compare_arms`: the paired test needs the same instances scored the same way."""
    (tmp_path / "other.yaml").write_text(
        f"extends: {ROOT / 'params/brorl_ci.yaml'}\ntrain:\n  eval_samples: 3\n")
    (tmp_path / "same.yaml").write_text(f"extends: {ROOT / 'params/brorl_ci.yaml'}\n")
    compare = load_params(ROOT / "params/compare_ci.yaml", ["compare.budget_rollouts=128"])
    same = compare_arms(compare.model_copy(update={"compare": compare.compare.model_copy(
        update={"arms": {"prorl": "params/prorl_ci.yaml", "brorl": str(tmp_path / "same.yaml")}})}),
        ROOT)
    assert {p.train.max_rollouts for p in same.values()} == {128}  # the shared budget applied
    other = compare.model_copy(update={"compare": compare.compare.model_copy(
        update={"arms": {"prorl": "params/prorl_ci.yaml", "brorl": str(tmp_path / "other.yaml")}})})
    with pytest.raises(ValueError, match=r"arms differ in train.eval_samples .*'brorl': 3"):
        compare_arms(other, ROOT)


def test_report_metrics_name_each_arm_family_and_the_paired_test(tmp_path):
    prorl = _arm(tmp_path, "prorl", [_row(4, 512, BASE)])
    brorl = _arm(tmp_path, "brorl", [_row(1, 512, [0.25, 0.5, 0.5, 1.0, 0.6, 0.4])])
    report = build_report([prorl, brorl], tmp_path / "out", "prorl")
    metrics = report_metrics(report)
    assert metrics["compare/paired_delta"] == pytest.approx(1.05 / 6)  # as in the test above
    assert metrics["compare/paired_p"] == report["paired_test"]["p_one_tailed"]
    assert {"compare/score_math_prorl", "compare/pass_at_1_reasoning_brorl",
            "compare/pass_rate_brorl", "compare/rollouts_per_s_prorl"} <= set(metrics)


def _captioned_tables(text):
    """Each Markdown table of a report with the paragraph right above it."""
    blocks = [b.strip() for b in text.split("\n\n") if b.strip()]
    return [(blocks[i - 1], b.splitlines()[0]) for i, b in enumerate(blocks) if b.startswith("|")]


def test_every_table_of_the_report_says_what_it_averages_and_which_evaluation(tmp_path):
    prorl = _arm(tmp_path, "prorl", [_row(0, 0, BASE), _row(4, 512, [0.5] * 6)])
    brorl = _arm(tmp_path, "brorl", [_row(0, 0, BASE), _row(1, 512, [0.75] * 6)])
    build_report([prorl, brorl], tmp_path / "out", "prorl",
                 {"samples": 4, "temperature": 0.6, "top_p": 0.95})
    tables = _captioned_tables((tmp_path / "out" / "report.md").read_text())
    # Table 1, start and end, Table 2, the paired test's families: four tables, four captions
    assert len(tables) == 4 and all(caption.startswith("Table: ") for caption, _ in tables)
    (t1, _), (ends, _), (t2, _), (test, _) = tables
    assert "MEAN OVER ITS TASKS" in t1  # eval/score_<family>: instances -> tasks -> family
    assert "MEAN OVER THE FAMILY'S TEST INSTANCES" in ends
    assert "MEAN OVER THE FAMILY'S COMMON TEST INSTANCES" in test
    assert "POOLED OVER THE ARM'S TRAINING STEPS" in t2 and "not an evaluation" in t2
    for caption in (t1, ends, test):
        assert "avg@k of its k = 4 evaluation samples, temperature 0.6, top-p 0.95" in caption


def test_report_without_sampling_takes_k_from_the_rows_and_says_the_rest_is_unknown(tmp_path):
    family = {"math": {"pass_at_1": 0.5, "pass_at_8": 0.9}}
    arm = _arm(tmp_path, "prorl", [_row(0, 0, BASE, family=family)])
    build_report([arm], tmp_path / "out", "prorl")
    tables = _captioned_tables((tmp_path / "out" / "report.md").read_text())
    assert "k = 8 evaluation samples, sampling settings not recorded" in tables[0][0]


def test_an_arm_given_as_keys_is_the_comparisons_own_params_with_those_keys_set(tmp_path):
    """One file holds the whole experiment: each arm is the comparison's params with the arm's
    keys over them, named `<name>-<arm>`, its checkpoints below its own run folder."""
    mine = load_params(ROOT / "params/smollm2_ci.yaml", [
        "name=mine", "compare.budget_rollouts=8",
        "compare.arms={prorl: {train: {run_dir: outputs/mine/p}}, brorl: {update: "
        "{prompts_per_step: 1, rollouts_per_prompt: 16}, train: {algorithm: brorl, "
        "run_dir: outputs/mine/b}}}"])
    arms = compare_arms(mine, ROOT)
    assert {n: (p.name, p.train.run_dir, p.train.checkpoint_dir, p.train.algorithm,
                p.update.rollouts_per_prompt, p.train.max_rollouts) for n, p in arms.items()} == {
        "prorl": ("mine-prorl", "outputs/mine/p", "outputs/mine/p/checkpoints", "prorl", 8, 8),
        "brorl": ("mine-brorl", "outputs/mine/b", "outputs/mine/b/checkpoints", "brorl", 16, 8)}
    same = {"data", "model", "generate", "filter", "verify", "diagnostics"}
    for arm in arms.values():
        assert arm.model_dump(include=same) == mine.model_dump(include=same)
    assert mine.compare.report_dir == "outputs/mine/compare"  # its own, by name
    with pytest.raises(ParamsError, match=r"compare.arms.brorl: invalid params: update.bogus"):
        compare_arms(mine.model_copy(update={"compare": mine.compare.model_copy(update={
            "arms": {**mine.compare.arms, "brorl": {"update": {"bogus": 1}}}})}), ROOT)


@pytest.mark.parametrize("arms, refusal", [
    ({"prorl": "params/prorl.yaml", "brorl": "params/brorl.yaml"},
     r"compare.arms.prorl \(params/prorl.yaml\) has data.path outputs/data/problems, not this "
     r"comparison's outputs/ci/smollm2/data/problems: the arm belongs to another experiment"),
    ({"prorl": {}, "brorl": {}},
     r"compare.arms.brorl: train.run_dir outputs/train is also arm prorl's train.run_dir's"),
    ({"prorl": {"train": {"run_dir": "outputs/ci/smollm2/compare"}}, "brorl": {}},
     r"compare.arms.prorl: train.run_dir outputs/ci/smollm2/compare is also compare.report_dir"),
])
def test_arms_of_another_experiment_or_sharing_a_folder_are_refused(arms, refusal):
    compare = load_params(ROOT / "params/smollm2_compare_ci.yaml")
    with pytest.raises(ValueError, match=refusal):
        compare_arms(compare.model_copy(update={"compare": compare.compare.model_copy(
            update={"arms": arms})}), ROOT)
