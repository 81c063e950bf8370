"""Advantages: hand-computed REINFORCE++-baseline and GRPO, streaming stats, loop equivalence."""

from __future__ import annotations

import math

import pytest
import torch

from brorl.algorithm.advantages import (
    GroupStats,
    compute_advantages,
    group_stats,
    grpo_advantages,
    reinforce_pp_baseline_advantages,
    token_advantages,
)

R2 = math.sqrt(2.0)
R3 = math.sqrt(3.0)


@pytest.mark.parametrize("estimator", ["reinforce_pp_baseline", "grpo"])
def test_advantage_is_zero_when_all_rollouts_correct(estimator):
    rewards = torch.ones(3, 4)
    assert torch.equal(compute_advantages(rewards, estimator), torch.zeros(3, 4))


@pytest.mark.parametrize("estimator", ["reinforce_pp_baseline", "grpo"])
def test_uniform_group_gets_zero_advantage_beside_a_mixed_group(estimator):
    rewards = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = compute_advantages(rewards, estimator)
    assert torch.equal(adv[0], torch.zeros(3))
    assert adv[1, 0] > 0 > adv[1, 1]


def test_reinforce_pp_baseline_by_hand_on_two_by_three():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    # group means 1/3 and 2/3; centred [2/3, -1/3, -1/3], [1/3, 1/3, -2/3]
    # batch mean of centred = 0; population var = (4+1+1+1+1+4)/9/6 = 2/9, std = sqrt(2)/3
    # A = centred / (sqrt(2)/3): 2/3 -> sqrt(2), 1/3 -> 1/sqrt(2)
    expected = torch.tensor([[R2, -1 / R2, -1 / R2], [1 / R2, 1 / R2, -R2]])
    adv = reinforce_pp_baseline_advantages(rewards)
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)


def test_reinforce_pp_baseline_has_no_per_group_std():
    # Same centred values as above but group 1 scaled by 10: GRPO would equalise the groups,
    # REINFORCE++-baseline keeps group 1 ten times larger (one batch std for all).
    rewards = torch.tensor([[1.0, 0.0, 0.0], [10.0, 10.0, 0.0]])
    adv = reinforce_pp_baseline_advantages(rewards)
    torch.testing.assert_close(adv[1, 2] / adv[0, 1], torch.tensor(20.0))  # (-20/3) / (-1/3)


def test_grpo_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.2, 0.8]])
    # group 0: mean 1/3, unbiased var (4/9 + 1/9 + 1/9) / 2 = 1/3, std 1/sqrt(3)
    #   A = (2/3) * sqrt(3) = 2/sqrt(3), (-1/3) * sqrt(3) = -1/sqrt(3)
    # group 1 (continuous): mean 0.5, deviations 0, -0.3, 0.3, var 0.18 / 2 = 0.09, std 0.3
    expected = torch.tensor([[2 / R3, -1 / R3, -1 / R3], [0.0, -1.0, 1.0]])
    torch.testing.assert_close(grpo_advantages(rewards), expected, atol=1e-5, rtol=0)


def test_invalid_rollouts_are_excluded_and_get_zero():
    rewards = torch.tensor([[1.0, 0.0, 5.0]])
    valid = torch.tensor([[True, True, False]])
    # valid group [1, 0]: mean 0.5, centred [0.5, -0.5]; batch var 0.25, std 0.5 -> [1, -1]
    adv = reinforce_pp_baseline_advantages(rewards, valid)
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, 0.0]]), atol=1e-6, rtol=0)
    # GRPO: unbiased std of [1, 0] = sqrt(0.5) -> A = 0.5 / 0.7071 = 0.7071
    adv = grpo_advantages(rewards, valid)
    torch.testing.assert_close(adv, torch.tensor([[1 / R2, -1 / R2, 0.0]]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("estimator", ["reinforce_pp_baseline", "grpo"])
def test_nan_in_invalid_slots_is_ignored_and_in_valid_slots_rejected(estimator):
    rewards = torch.tensor([[1.0, 0.0, float("nan")], [0.0, 1.0, float("inf")]])
    valid = torch.tensor([[True, True, False], [True, True, False]])
    adv = compute_advantages(rewards, estimator, valid, chunk_size=2)
    assert torch.isfinite(adv).all() and adv[:, 2].tolist() == [0.0, 0.0]
    expected = compute_advantages(rewards[:, :2], estimator)
    torch.testing.assert_close(adv[:, :2], expected)
    with pytest.raises(ValueError, match=r"reward nan at \(prompt, rollout\) \(0, 2\)"):
        compute_advantages(rewards, estimator)


def test_streaming_group_stats_over_uneven_chunks_equal_one_pass():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(4, 37, generator=gen, dtype=torch.float64)
    valid = torch.rand(4, 37, generator=gen) > 0.3
    stats = GroupStats.empty(4)
    start = 0
    for size in (5, 1, 13, 18):  # uneven, sums to 37
        stats = stats.update(rewards[:, start : start + size], valid[:, start : start + size])
        start += size
    for b in range(4):
        values = rewards[b][valid[b]]
        assert stats.count[b] == values.numel()
        torch.testing.assert_close(stats.mean[b], values.mean())
        torch.testing.assert_close(stats.std()[b], values.std(unbiased=True))
        torch.testing.assert_close(stats.std(unbiased=False)[b], values.std(unbiased=False))


@pytest.mark.parametrize("estimator", ["reinforce_pp_baseline", "grpo"])
def test_chunked_advantages_equal_one_pass(estimator):
    gen = torch.Generator().manual_seed(1)
    rewards = (torch.rand(3, 50, generator=gen) > 0.6).float()
    one_pass = compute_advantages(rewards, estimator)
    chunked = compute_advantages(rewards, estimator, chunk_size=7)  # 7 chunks, last holds 1
    torch.testing.assert_close(chunked, one_pass, atol=1e-6, rtol=0)


def _loop_advantages(rewards, valid, estimator):
    """Slow reference: plain Python over lists."""
    rows = []
    for r_row, v_row in zip(rewards.tolist(), valid.tolist()):
        vals = [r for r, v in zip(r_row, v_row) if v]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (len(vals) - 1))
        rows.append([(r - mean, std) if v else None for r, v in zip(r_row, v_row)])
    if estimator == "grpo":
        return [[0.0 if c is None else c[0] / (c[1] + 1e-6) for c in row] for row in rows]
    centred = [c[0] for row in rows for c in row if c is not None]
    mu = sum(centred) / len(centred)
    sd = math.sqrt(sum((x - mu) ** 2 for x in centred) / len(centred) + 1e-8)
    return [[0.0 if c is None else (c[0] - mu) / sd for c in row] for row in rows]


@pytest.mark.parametrize("estimator", ["reinforce_pp_baseline", "grpo"])
def test_vectorised_advantages_equal_loop_version(estimator):
    gen = torch.Generator().manual_seed(2)
    rewards = torch.rand(5, 9, generator=gen, dtype=torch.float64)
    valid = torch.rand(5, 9, generator=gen) > 0.2
    valid[:, :2] = True  # every group keeps at least two valid rollouts
    fast = compute_advantages(rewards, estimator, valid, chunk_size=4)
    slow = torch.tensor(_loop_advantages(rewards, valid, estimator), dtype=torch.float64)
    torch.testing.assert_close(fast, slow)


def test_token_advantages_broadcast_with_response_mask():
    adv = torch.tensor([[2.0, -1.0]])  # B=1, N=2
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # [B*N, T]
    expected = torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]])
    assert torch.equal(token_advantages(adv, mask), expected)


def test_shape_mismatches_name_the_fix():
    with pytest.raises(ValueError, match="response_mask must be"):
        token_advantages(torch.zeros(2, 2), torch.ones(3, 5))
    with pytest.raises(ValueError, match="one bool per rollout"):
        grpo_advantages(torch.zeros(2, 2), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="chunk_size"):
        group_stats(torch.zeros(2, 2), chunk_size=0)
