"""Adaptive rollouts per prompt (`brorl.algorithm.allocation`): the greedy top-gains allocation
is the knapsack optimum (brute force), respects the budget and the cap, favours groups
that may still be uniform."""

from __future__ import annotations

import itertools

import pytest
import torch

from brorl.algorithm.allocation import allocate, group_value, pass_rate_estimate


def _total_value(correct, seen, extra) -> float:
    p = pass_rate_estimate(correct, seen)
    return float(group_value(seen + extra, p).sum())


def _brute_force(correct, seen, budget, cap) -> float:
    rooms = [range(cap - int(s) + 1) for s in seen]
    best = -1.0
    for extra in itertools.product(*rooms):
        if sum(extra) == min(budget, sum(cap - int(s) for s in seen)):
            best = max(best, _total_value(correct, seen, torch.tensor(extra)))
    return best


def test_value_and_estimate_by_hand():
    assert pass_rate_estimate(torch.tensor([0, 4]), torch.tensor([4, 4])).tolist() == \
        pytest.approx([1 / 6, 5 / 6])
    # n = 2, p = 1/2: 1/4 * (1 - 1/4 - 1/4) = 1/8
    assert float(group_value(torch.tensor(2), torch.tensor(0.5))) == pytest.approx(0.125)
    assert float(group_value(torch.tensor(1), torch.tensor(0.3))) == pytest.approx(0.0)


@pytest.mark.parametrize("seed", range(12))
def test_the_allocation_is_the_knapsack_optimum(seed):
    gen = torch.Generator().manual_seed(seed)
    b, cap = 3, 6
    seen = torch.randint(1, 4, (b,), generator=gen)
    correct = torch.tensor([int(torch.randint(0, int(s) + 1, (1,), generator=gen)) for s in seen])
    budget = int(torch.randint(0, 12, (1,), generator=gen))
    extra = allocate(correct, seen, budget, cap)
    assert int(extra.sum()) == min(budget, int((cap - seen).sum()))
    assert bool(((seen + extra) <= cap).all()) and bool((extra >= 0).all())
    assert _total_value(correct, seen, extra) == pytest.approx(
        _brute_force(correct, seen, budget, cap), rel=1e-12)
    assert torch.equal(extra, allocate(correct, seen, budget, cap))  # deterministic


def test_uncertain_groups_get_the_budget_and_mixed_ones_the_least():
    seen = torch.full((4,), 4)
    correct = torch.tensor([0, 2, 4, 1])  # hopeless-looking, mixed, solved-looking, hard
    extra = allocate(correct, seen, budget=12, cap=16)
    # 0/4 and 4/4 may still be all-wrong / all-right at larger n: extra rollouts raise their
    # chance of a gradient most; 2/4 is kept already
    assert _total_value(correct, seen, extra) == pytest.approx(
        _brute_force(correct, seen, 12, 16), rel=1e-12)
    assert int(extra.sum()) == 12 and extra[0] == extra.max() and extra[1] == extra.min()
    assert torch.equal(allocate(correct, seen, 0, 16), torch.zeros(4, dtype=torch.long))
    full = allocate(correct, seen, budget=10**6, cap=16)
    assert full.tolist() == [12, 12, 12, 12]  # more budget than room: every prompt to its cap


def test_bad_counts_are_refused_with_the_values():
    with pytest.raises(ValueError, match="correct <= seen <= cap"):
        allocate(torch.tensor([3]), torch.tensor([2]), 4, 8)
    with pytest.raises(ValueError, match="must both be"):
        allocate(torch.tensor([1, 2]), torch.tensor([2]), 4, 8)
    with pytest.raises(ValueError, match="budget"):
        allocate(torch.tensor([1]), torch.tensor([2]), -1, 8)
