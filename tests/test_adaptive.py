"""Adaptive rollouts per prompt (`update.allocation: adaptive`): padded groups from two rounds
(`merge_rounds`), the keep rule and counts on them, the step's two-round collection, padding that
changes no update, and a real step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from brorl.algorithm.advantages import compute_advantages
from brorl.algorithm.filtering import InformativeCollector, informative_groups, mixed_outcome_groups
from brorl.families.math import generate_math
from brorl.params import load_params
from brorl.train import Direct, Run, RunConfig, Trainer, TrainerConfig
from brorl.train.collection import Collection
from brorl.train.rollouts import ScoredGroups, merge_rounds, response_mask
from brorl.types import RolloutBatch
from brorl.verifiers import Verdict, VerifyConfig

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = generate_math(3, seed=2, tasks=("compare",))


def _groups(rewards: list[list[float]], tag: str, problems=PROBLEMS) -> ScoredGroups:
    """Groups of made-up rollouts: response r of group g is `r + 1` tokens long and reads
    `<tag><g>.<r>`; every token id is 10 + its position."""
    b, n = len(rewards), len(rewards[0])
    lengths = torch.tensor([r + 1 + g for g in range(b) for r in range(n)])
    width = int(lengths.max())
    ids = (10 + torch.arange(width)).repeat(b * n, 1)
    ids[torch.arange(width)[None, :] >= lengths[:, None]] = 0
    batch = RolloutBatch(
        prompt_index=torch.arange(b).repeat_interleave(n),
        prompt_ids=tuple((1, 2, g) for g in range(b)), response_ids=ids,
        response_lengths=lengths, logprobs=-(ids > 0).float(),
        texts=tuple(f"{tag}{g}.{r}" for g in range(b) for r in range(n)),
        finish_reasons=("stop",) * (b * n), rollouts_per_prompt=n)
    return ScoredGroups(tuple(problems[:b]), batch, torch.tensor(rewards, dtype=torch.float64),
                        tuple(f"why-{tag}{i}" for i in range(b * n)))


def test_merge_rounds_places_each_prompts_rollouts_then_pads():
    first = _groups([[1.0, 1.0], [0.0, 1.0]], "a")
    second = _groups([[0.0], [1.0], [0.0]], "b", problems=[PROBLEMS[0]] * 2 + [PROBLEMS[1]])
    merged = merge_rounds(first, second, torch.tensor([2, 1]), width=5)
    assert merged.batch.rollouts_per_prompt == 5 and merged.problems == first.problems
    assert merged.valid.tolist() == [[True] * 4 + [False], [True] * 3 + [False] * 2]
    assert merged.batch.texts == ("a0.0", "a0.1", "b0.0", "b1.0", "",
                                  "a1.0", "a1.1", "b2.0", "", "")
    assert merged.rewards.tolist() == [[1, 1, 0, 1, 0], [0, 1, 0, 0, 0]]
    assert merged.reasons[2] == "why-b0" and merged.reasons[7] == "why-b2"
    assert merged.batch.response_lengths.tolist() == [1, 2, 1, 2, 0, 2, 3, 3, 0, 0]
    assert merged.num_rollouts == 7
    mask = response_mask(merged.batch)
    assert not mask[[4, 8, 9]].any()  # padding has no tokens: no loss, no advantage
    assert torch.equal(merged.batch.response_ids[7][:3], second.batch.response_ids[2][:3])
    # selecting and joining keep the mask
    assert merged.select(torch.tensor([1])).valid.tolist() == [[True] * 3 + [False] * 2]
    with pytest.raises(ValueError, match="sum to the second round"):
        merge_rounds(first, second, torch.tensor([1, 1]), width=5)
    with pytest.raises(ValueError, match="does not fit"):
        merge_rounds(first, second, torch.tensor([2, 1]), width=3)
    # no extra rollouts at all: the first round, padded
    alone = merge_rounds(first, None, torch.tensor([0, 0]), width=3)
    assert alone.valid.sum(1).tolist() == [2, 2]


def test_the_keep_rule_and_the_counts_see_only_real_rollouts():
    rewards = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.5, 0.0]])
    valid = torch.tensor([[True, True, False], [True, True, True], [True, True, False]])
    # group 0 is all correct once its padding slot is ignored; group 2 is not uniform
    assert mixed_outcome_groups(rewards, 1.0, valid).tolist() == [False, False, False]
    assert mixed_outcome_groups(rewards).tolist() == [True, False, False]
    assert informative_groups(rewards, valid).tolist() == [False, False, True]
    merged = merge_rounds(_groups([[1.0, 1.0], [0.0, 1.0]], "a"),
                          _groups([[0.0]], "b", problems=[PROBLEMS[0]]), torch.tensor([1, 0]), 4)
    collector = InformativeCollector(2, 1)
    collector.add(merged)
    stats = collector.result().stats
    assert (stats.rollouts_generated, stats.groups_kept, stats.rollouts_kept) == (5, 2, 5)
    assert stats.pass_rate_binary == 1.0 and stats.as_metrics()["filter/rollouts_wasted"] == 0
    # advantages of a padded group: padding gets 0, the real rollouts their group's
    adv = compute_advantages(merged.rewards, "grpo", merged.valid)
    assert adv[0, 3] == 0 and adv[1, 2:].abs().sum() == 0
    assert adv[0, :3].sum().abs() < 1e-9 and adv[0, 2] < 0 < adv[0, 0]


def test_an_adaptive_draw_allocates_after_its_first_round_and_filters_the_merged_groups():
    collection = Collection(InformativeCollector(3, 1), rollouts_per_prompt=8,
                            allocation=(4, 32))
    assert collection.rollouts_per_prompt == 4 and collection.request() == 3
    # first round: prompt 0 all correct, 1 mixed, 2 all wrong
    collection.add(_groups([[1.0] * 4, [1.0, 0.0] * 2, [0.0] * 4], "a"), {"generate": 1.0})
    assert not collection.done and collection.rollouts_per_prompt == 1
    extra = collection.extra.tolist()
    # the groups that may still be uniform get the most (docs/algorithm.md)
    assert sum(extra) == 3 * (8 - 4) and extra[1] < min(extra[0], extra[2])
    repeated = collection.second_round_problems()
    assert repeated == [p for p, k in zip(PROBLEMS, extra) for _ in range(k)]
    # second round: prompt 0 fails once (rescued), prompt 2 stays all wrong
    second = [[0.0] if i == 0 else [1.0 if p is PROBLEMS[0] else 0.0]
              for i, p in enumerate(repeated)]
    collection.add(_groups(second, "b", problems=repeated), {"generate": 2.0})
    assert collection.done and collection.rounds == 2
    collected = collection.finish()
    m = collected.metrics
    assert m["generate/rollouts"] == 24 and m["generate/seconds"] == 3.0
    assert m["filter/groups_kept"] == 2 and m["filter/rollouts_wasted"] == 4 + extra[2]
    assert m["alloc/groups_rescued"] == 1 and m["alloc/extra_rollouts"] == 12
    assert m["alloc/extra_to_uniform_frac"] == (extra[0] + extra[2]) / 12
    assert m["alloc/group_size_max"] == 4 + max(extra)
    assert collected.groups.valid.sum(1).tolist() == [4 + extra[0], 4 + extra[1]]
    assert [solved for _, solved in collected.drawn] == [True, True, False]


def _trainer(easy_base: Path, problems, tmp_path: Path, reward_fn, **changes) -> Trainer:
    params = load_params(ROOT / "params/tiny_ci.yaml")
    small = dict(init_checkpoint=str(easy_base), checkpoint_dir=str(tmp_path / "ckpt"),
                 prompts_per_step=3, rollouts_per_prompt=4, lr=1e-3, mini_batches_per_step=2,
                 micro_batch_rollouts=3, temperature=1.0, max_response_tokens=12,
                 filter_max_draws=1, verify=VerifyConfig(workers=1))
    config = replace(TrainerConfig.from_params(params), **{**small, **changes})
    return Trainer(config, problems, reward_fn=reward_fn)


def _alternating(problems, responses):
    return [Verdict(float(i % 2), "x") for i in range(len(problems))]


def test_padding_changes_no_update(easy_base, easy_split, tmp_path):
    """The same rollouts as whole groups and padded with empty slots train to equal weights."""
    plain = _trainer(easy_base, easy_split.train, tmp_path / "plain", _alternating)
    problems = plain.sample_prompts(3)
    groups = plain.verify(problems, plain.generate_rollouts(problems, 0))
    padded = merge_rounds(groups, None, torch.zeros(3, dtype=torch.long), width=7)
    assert padded.num_rollouts == 12 and padded.batch.num_rollouts == 21
    other = _trainer(easy_base, easy_split.train, tmp_path / "padded", _alternating)
    a, b = plain.update(groups), other.update(padded)
    assert a["update/trained_rollouts"] == b["update/trained_rollouts"] == 12
    assert a["update/reward_mean"] == b["update/reward_mean"] == 0.5
    assert a["update/advantage_abs_mean"] == pytest.approx(b["update/advantage_abs_mean"])
    for key in ("update/grad_norm", "update/pg_loss", "update/kl", "update/entropy"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    pa = dict(plain.model.named_parameters())
    for name, p in other.model.named_parameters():
        assert torch.allclose(p, pa[name], atol=1e-6), name


def test_a_real_adaptive_step_spends_n_per_prompt_and_logs_the_allocation(
        easy_base, easy_split, tmp_path):
    def by_problem(problems, responses):  # the first listed problem right, the rest alternate
        first = problems[0]
        return [Verdict(1.0 if p is first else float(i % 2), "x") for i, p in enumerate(problems)]

    params = load_params(ROOT / "params/tiny_ci.yaml")
    trainer = _trainer(easy_base, easy_split.train, tmp_path, by_problem, rollouts_per_prompt=6,
                       allocation="adaptive", first_round=2, rollouts_cap=8)
    run_config = replace(RunConfig.from_params(params, ROOT), run_dir=str(tmp_path / "run"),
                         steps=10**6, eval_every=10**6, checkpoint_every=10**6,
                         save_rollouts=True)
    run = Run(trainer, run_config, {}, generate_math(4, seed=11, tasks=("compare",)))
    m = run.step(Direct())
    # first round, 2 rollouts each (rows i = 0..5): prompt 0 right twice, prompts 1 and 2 wrong
    # then right (i even, odd): correct = [2, 1, 1] of 2, pass-rate estimates (c+1)/(n+2) =
    # 3/4, 1/2, 1/2. The 3 x (6 - 2) = 12 extra rollouts go to the largest marginal gains of
    # value(n, p) = p(1-p)(1 - p^n - (1-p)^n):
    #   p = 1/2: value(2..6) = .125, .1875, .21875, .234375, .2421875
    #            gains .0625, .03125, .015625, .0078125, .00390625
    #   p = 3/4: value(2..7) = .0703125, .10546875, .12744141, .14282227, .15408325, .16246033
    #            gains .03515625, .02197266, .01538086, .01123047, .00837708, .00626373
    # the top 12: .0625 x2, .0352, .03125 x2, .0220, .015625 x2, .0154, .0112, .0084, and of the
    # tied .0078125 x2 the earlier prompt (1): extras [5, 4, 3], groups of 7, 6 and 5
    assert m["generate/rollouts"] == 3 * 6  # B x N, as the fixed allocation
    assert m["filter/rounds"] == 1 and m["alloc/extra_rollouts"] == 12
    assert (m["alloc/group_size_min"], m["alloc/group_size_max"]) == (5.0, 7.0)
    assert m["alloc/group_size_mean"] == 6.0
    assert m["alloc/first_round_mixed"] == 2 and m["alloc/first_round_uniform"] == 1
    assert m["alloc/extra_to_uniform_frac"] == pytest.approx(5 / 12)  # prompt 0's 5 of 12
    # second round (rows i = 0..11): prompt 0 (listed first) right 5 times: 7 of 7, dropped;
    # prompt 1 rows 5..8 right, wrong, right, wrong: 3 of 6; prompt 2 rows 9..11: 3 of 5
    assert m["alloc/groups_rescued"] == 0 and m["filter/groups_kept"] == 2
    assert m["filter/rollouts_kept"] == m["update/trained_rollouts"] == 6 + 5
    assert m["update/reward_mean"] == pytest.approx(6 / 11)
    assert m["update/skipped"] == 0
    # both engine calls' rollouts are saved, each under its own call index
    saved = sorted(p.name for p in (tmp_path / "run" / "rollouts").iterdir())
    assert saved == ["step_000001_draw0.parquet", "step_000001_draw1.parquet"]
