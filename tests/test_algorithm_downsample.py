"""PODS' max-variance down-sampling: hand-computed cases, the tie rule, brute force over subsets."""

from __future__ import annotations

import itertools

import pytest
import torch

from brorl.algorithm.downsample import max_variance_subset


def _variance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def test_a_balanced_pair_is_chosen_from_two_zeros_and_two_ones():
    # k = 0: {0, 0} var 0; k = 1: {0, 1} var 0.25; k = 2: {1, 1} var 0 -> k = 1.
    # Stable sort order [0, 1, 2, 3]: the lowest is rollout 0, the highest rollout 3.
    chosen = max_variance_subset(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), 2)
    assert chosen.tolist() == [[0, 3]]


def test_ties_take_the_first_k_so_the_m_lowest_win_among_equal_variances():
    # rewards [1, 0, 0, 1, 1], m = 3; stable order [1, 2, 0, 3, 4].
    # k = 0: {0, 0, 1} (rollouts 1, 2, 0) var 2/9; k = 1: {0, 0, 1} (1, 2, 4) var 2/9;
    # k = 2: {0, 1, 1} var 2/9; k = 3: {1, 1, 1} var 0. First maximum: k = 0.
    chosen = max_variance_subset(torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]]), 3)
    assert chosen.tolist() == [[0, 1, 2]]


def test_graded_rewards_keep_the_extremes():
    # rewards [0.5, 0.2, 0.9, 0.4], m = 2: {0.2, 0.9} (k = 1) has var 0.1225, any other pair less.
    chosen = max_variance_subset(torch.tensor([[0.5, 0.2, 0.9, 0.4]]), 2)
    assert chosen.tolist() == [[1, 2]]


def test_a_uniform_group_keeps_its_first_m_rollouts_and_m_equal_n_keeps_all():
    assert max_variance_subset(torch.full((2, 5), 0.3), 3).tolist() == [[0, 1, 2]] * 2
    rewards = torch.tensor([[0.3, 0.9, 0.1, 0.5]])
    assert max_variance_subset(rewards, 4).tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize("kind", ["binary", "graded"])
def test_the_chosen_variance_equals_the_brute_force_maximum_over_all_m_subsets(kind):
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for trial in range(60):
        n = 2 + trial % 7  # N in 2..8
        rewards = torch.rand(3, n, generator=gen, dtype=torch.float64)
        if kind == "binary":
            rewards = (rewards < 0.4).to(torch.float64)
        else:  # graded, with repeats: quarters, as partial credit of four tests
            rewards = (rewards * 4).floor() / 4
        for m in range(1, n + 1):
            chosen = max_variance_subset(rewards, m)
            assert chosen.shape == (3, m) and chosen.dtype == torch.long
            for g in range(3):
                row = chosen[g].tolist()
                assert row == sorted(set(row)) and 0 <= row[0] and row[-1] < n
                values = rewards[g].tolist()
                best = max(_variance([values[i] for i in s])
                           for s in itertools.combinations(range(n), m))
                assert _variance([values[i] for i in row]) == pytest.approx(best, abs=1e-12)
                checked += 1
    assert checked == 3 * sum(2 + t % 7 for t in range(60))


def test_the_choice_does_not_depend_on_the_offset_of_the_rewards():
    rewards = torch.tensor([[0.1, 0.7, 0.3, 0.7, 0.0, 0.5]], dtype=torch.float64)
    assert torch.equal(max_variance_subset(rewards, 3), max_variance_subset(rewards + 1e6, 3))


@pytest.mark.parametrize("rewards, m, match", [
    (torch.zeros(2, 4), 0, "must be in 1..N = 4"),
    (torch.zeros(2, 4), 5, "must be in 1..N = 4"),
    (torch.zeros(4), 2, r"must be \[B, N\]"),
    (torch.tensor([[0.0, float("nan"), 1.0]]), 2, "non-finite"),
])
def test_bad_input_is_refused_with_one_clear_line(rewards, m, match):
    with pytest.raises(ValueError, match=match):
        max_variance_subset(rewards, m)
