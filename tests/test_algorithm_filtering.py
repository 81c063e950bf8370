"""Dynamic sampling: the binary and any-difference keep rules, both pass rates, the budgeted
refill loop and its rollout cap."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from brorl.algorithm.filtering import (
    collect_informative,
    informative_groups,
    mixed_outcome_groups,
)


@dataclass(frozen=True)
class FakeBatch:
    """A rollout batch stand-in: rewards [b, N] and one prompt id per group."""

    rewards: torch.Tensor
    ids: tuple[int, ...]

    def select(self, index):
        return FakeBatch(self.rewards[index], tuple(self.ids[i] for i in index.tolist()))


class Source:
    """Serves scripted rounds of groups; records what was asked."""

    def __init__(self, rounds, n=4):
        self.rounds, self.n, self.asked, self.next_id = list(rounds), n, [], 0

    def __call__(self, k):
        self.asked.append(k)
        rows = self.rounds.pop(0) if self.rounds else []
        ids = tuple(range(self.next_id, self.next_id + len(rows)))
        self.next_id += len(rows)
        return FakeBatch(torch.tensor(rows, dtype=torch.float32).reshape(len(rows), self.n), ids)


def test_binary_rule_keeps_a_group_iff_some_but_not_all_rollouts_are_correct():
    rewards = torch.tensor([
        [1.0, 1, 1, 1],        # 4 of 4 correct: dropped
        [0, 0, 0, 0],          # 0 of 4: dropped
        [1, 0, 1, 1],          # 3 of 4: kept
        [0.5, 0.5, 0.2, 0],    # partial credit, 0 correct: dropped (any_difference keeps it)
        [1, 0.5, 0.5, 0.5],    # 1 correct: kept
        [1, 1, 1, 0.99],       # 0.99 < 1 is not correct: 3 of 4, kept
    ])
    assert mixed_outcome_groups(rewards).tolist() == [False, False, True, False, True, True]
    assert informative_groups(rewards).tolist() == [False, False, True, True, True, True]
    # with correct = reward >= 0.5, row 3 has 2 of 4 correct, rows 4 and 5 have 4 of 4
    assert mixed_outcome_groups(rewards, correct_reward=0.5).tolist() == \
        [False, False, True, True, False, False]


def test_any_difference_rule_tests_exact_equality():
    rewards = torch.tensor([[0.3, 0.3, 0.3], [0.5, 0.5, 0.5000001], [0.2, 0.9, 0.4]])
    # row 0: mean 0.3 is neither 0 nor 1, yet zero variance: dropped (OpenRLHF#1270)
    # row 1: differs in the 7th decimal: max != min, kept
    assert informative_groups(rewards).tolist() == [False, True, True]
    # [1,0,0,0] stays whole: a leave-one-out std would zero row 0's last three (NeMo-RL#3469)
    assert informative_groups(torch.tensor([[1.0, 0, 0, 0]])).tolist() == [True]


def test_non_finite_rewards_are_rejected_by_both_rules():
    for rule in (informative_groups, mixed_outcome_groups):
        with pytest.raises(ValueError, match="finite reward"):
            rule(torch.tensor([[1.0, float("nan")]]))


MIXED_DRAW = [[1, 0, 0, 0],          # both rules pass
              [0.5, 0.2, 0, 0],      # only any_difference passes (partial credit, none correct)
              [1, 1, 1, 1],          # neither
              [0, 0, 0, 0]]          # neither


@pytest.mark.parametrize("rule, kept_ids, pass_rate", [
    ("binary", [0], 4 / 16),             # the one mixed-outcome group of 4 rollouts / 16
    ("any_difference", [0, 1], 8 / 16),  # two groups of 4 / 16
])
def test_both_pass_rates_are_counted_whichever_rule_is_active(rule, kept_ids, pass_rate):
    source = Source([MIXED_DRAW])
    out = collect_informative(source, target_groups=2, max_draws=1, keep_rule=rule)
    s = out.stats
    assert [i for p in out.pieces for i in p.ids] == kept_ids
    assert (s.pass_rate_binary, s.pass_rate_any_difference) == (4 / 16, 8 / 16)
    assert s.pass_rate == pass_rate and s.kept_rate == len(kept_ids) * 4 / 16
    # uniform groups by value; groups without one correct rollout: rows 1 and 3
    assert (s.groups_all_correct, s.groups_all_wrong, s.groups_uniform_other) == (1, 1, 0)
    assert s.groups_none_correct == 2
    m = s.as_metrics()
    assert m["filter/pass_rate"] == pass_rate and m["filter/pass_rate_binary"] == 0.25
    assert m["filter/pass_rate_any_difference"] == 0.5 and m["filter/rollouts_generated"] == 16


def test_refill_with_enough_budget_keeps_target_and_counts_discards():
    source = Source([
        [[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]],  # asked 3: keep id 0
        [[0.2, 0.7, 0.7, 1.0], [0.5, 0.5, 0.5, 0.5]],  # asked 2: keep id 3
        [[0, 1, 1, 1]],  # asked 1: keep id 5
    ])
    out = collect_informative(source, target_groups=3, max_draws=10)
    s = out.stats
    assert source.asked == [3, 2, 1]
    assert [i for p in out.pieces for i in p.ids] == [0, 3, 5]
    assert out.rewards().shape == (3, 4)
    assert (s.rounds, s.groups_generated, s.rollouts_generated) == (3, 6, 24)
    assert (s.groups_kept, s.rollouts_kept, s.groups_surplus) == (3, 12, 0)
    assert (s.groups_all_correct, s.groups_all_wrong, s.groups_uniform_other) == (1, 1, 1)
    assert s.pass_rate == 0.5 == s.kept_rate  # 12 passing and kept / 24 generated rollouts
    assert not s.budget_exhausted and not s.source_exhausted and not s.rollout_cap_reached


def test_exhausted_budget_returns_what_was_kept_and_flags_it():
    calls = []

    def all_wrong(k):
        calls.append(k)
        return FakeBatch(torch.zeros(k, 8), tuple(range(k)))

    out = collect_informative(all_wrong, target_groups=4, max_draws=3)
    assert calls == [4, 4, 4]  # exactly the budget, then it returns
    s = out.stats
    assert s.budget_exhausted and s.groups_kept == 0 and out.pieces == []
    assert out.rewards().shape == (0, 0)
    assert s.groups_all_wrong == 12 and s.rollouts_generated == 96 and s.pass_rate == 0.0
    assert out.stats.as_metrics()["filter/budget_exhausted"] == 1.0


def test_partial_keep_when_budget_runs_out():
    source = Source([[[1, 0, 0, 0], [1, 1, 1, 1]], [[0, 0, 0, 0]]])
    out = collect_informative(source, target_groups=2, max_draws=2)
    assert out.num_groups == 1 and out.stats.budget_exhausted
    assert out.stats.pass_rate == 4 / 12  # one group of 4 kept out of 3 groups of 4


def test_oversampled_surplus_is_trimmed_and_counted():
    source = Source([[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]])
    out = collect_informative(source, target_groups=2, max_draws=5, oversample=2.0)
    assert source.asked == [4]  # ceil(2 * 2.0)
    assert [i for p in out.pieces for i in p.ids] == [0, 1]
    assert out.stats.groups_surplus == 2 and out.stats.groups_informative == 4
    # all 16 rollouts pass the rule; 8 are kept, the surplus is dropped
    assert (out.stats.pass_rate, out.stats.kept_rate) == (16 / 16, 8 / 16)


def test_keep_uniform_trains_on_every_group_and_still_counts():
    source = Source([[[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]])
    out = collect_informative(source, target_groups=3, max_draws=5, keep_uniform=True)
    assert source.asked == [3] and [i for p in out.pieces for i in p.ids] == [0, 1, 2]
    s = out.stats
    assert (s.groups_all_correct, s.groups_all_wrong, s.groups_informative) == (1, 1, 1)
    assert s.kept_rate == 1.0 and s.pass_rate == pytest.approx(4 / 12)


def test_rollout_cap_limits_every_draw_and_ends_the_loop():
    # cap 5 groups (e.g. 20 rollouts left at N = 4): asked min(4, 5) = 4, then min(3, 5 - 4) = 1
    source = Source([[[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]],
                     [[1, 1, 1, 1]]])
    out = collect_informative(source, target_groups=4, max_draws=10, max_groups=5)
    s = out.stats
    assert source.asked == [4, 1]
    assert (s.groups_generated, s.rollouts_generated, s.groups_kept) == (5, 20, 1)
    assert s.rollout_cap_reached and not s.budget_exhausted  # the run's budget, not the draws'
    # a cap below the target asks for the cap only, in one draw
    source = Source([[[1, 0, 0, 0], [0, 1, 0, 0]]])
    out = collect_informative(source, target_groups=8, max_draws=10, max_groups=2)
    assert source.asked == [2] and out.stats.groups_kept == 2 and out.stats.rollout_cap_reached


def test_empty_source_stops_the_loop_without_spending_the_budget():
    source = Source([[[1, 0, 0, 0]]])
    out = collect_informative(source, target_groups=3, max_draws=100)
    assert source.asked == [3, 2]  # the second draw returns no groups: stop
    assert out.stats.source_exhausted and not out.stats.budget_exhausted
    assert out.num_groups == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"target_groups": 0}, "target_groups"),
        ({"max_draws": 0}, "max_draws"),
        ({"oversample": 0.5}, "oversample"),
        ({"max_groups": 0}, "max_groups"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, match):
    args = {"target_groups": 2, "max_draws": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        collect_informative(Source([]), **args)


def _bernoulli_source(n, seed):
    """Groups of N binary rewards; each prompt's success rate p drawn from a fixed list."""
    gen = torch.Generator().manual_seed(seed)
    rates = torch.tensor([0.0, 0.05, 0.5, 0.95, 1.0])

    def draw(k):
        p = rates[torch.randint(0, 5, (k,), generator=gen)]
        rewards = (torch.rand(k, n, generator=gen) < p[:, None]).float()
        return FakeBatch(rewards, tuple(range(k)))

    return draw


@pytest.mark.parametrize(
    "n, expected",
    [
        # P(0 < #correct < N) = 1 - p^N - (1-p)^N, averaged over the five rates:
        # N=16: p=0.05 and 0.95 give 1 - 0.95^16 - 0.05^16 = 0.5599, p=0.5 gives 0.99997, 0 and 1
        # give 0: (2 * 0.5599 + 0.99997) / 5 = 0.4240 (the paper's ProRL pass rate is 41%)
        (16, (2 * (1 - 0.95**16 - 0.05**16) + 1 - 2 * 0.5**16) / 5),
        # N=512: 0.95^512 ~ 4e-12, so three of five rates are informative: 0.6 (BroRL: 62%)
        (512, 0.6),
    ],
)
def test_pass_rate_matches_closed_form_and_rises_with_n(n, expected):
    out = collect_informative(_bernoulli_source(n, seed=n), target_groups=300, max_draws=200)
    assert out.num_groups == 300 and not out.stats.budget_exhausted
    assert out.stats.groups_surplus == 0  # oversample 1 never asks for more than is missing
    # binary rewards: both rules agree
    assert out.stats.pass_rate == out.stats.pass_rate_any_difference == out.stats.kept_rate
    # about 300 / 0.42 = 710 groups drawn: binomial sd of the rate ~ 0.019; allow 3 sd
    assert out.stats.pass_rate == pytest.approx(expected, abs=0.06)
