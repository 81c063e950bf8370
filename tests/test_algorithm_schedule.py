"""Schedules: the sqrt LR rule, the fixed mini-batch count, reference resets."""

from __future__ import annotations

import math

import pytest

from brorl.algorithm.schedule import (
    mini_batch_bounds,
    mini_batch_rollouts,
    reset_plan,
    scaled_lr,
    should_reset_reference,
)


def test_lr_rule_gives_sqrt8_for_brorl_over_prorl():
    prorl, brorl = 512 * 16, 128 * 512  # 8,192 and 65,536 samples per step: ratio 8
    assert scaled_lr(2e-6, brorl, prorl) == pytest.approx(2e-6 * math.sqrt(8))  # 5.657e-6
    assert scaled_lr(2e-6, brorl, prorl) == pytest.approx(5.656854e-6, rel=1e-6)
    assert scaled_lr(2e-6, prorl, prorl) == 2e-6


def test_lr_rule_on_the_issue_example_512x128_vs_16x512():
    # 512 rollouts x 128 prompts over 16 rollouts x 512 prompts = 65,536 / 8,192 = 8
    assert scaled_lr(1.0, 512 * 128, 16 * 512) == pytest.approx(2.8284271)


def test_mini_batch_count_is_fixed_so_brorl_mini_batches_are_8x_larger():
    prorl = mini_batch_rollouts(512 * 16, 4)  # 8,192 / 4 = 2,048
    brorl = mini_batch_rollouts(128 * 512, 4)  # 65,536 / 4 = 16,384
    assert (prorl, brorl) == (2048, 16384) and brorl == 8 * prorl
    with pytest.raises(ValueError, match="mini_batches_per_step dividing"):
        mini_batch_rollouts(10, 4)


def test_mini_batch_bounds_keep_the_count_when_fewer_rollouts_were_kept():
    # dynamic sampling returned 10 rollouts, 4 mini-batches: sizes 3, 3, 2, 2
    assert mini_batch_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert mini_batch_bounds(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert mini_batch_bounds(2, 4) == [(0, 1), (1, 2)]
    assert mini_batch_bounds(0, 4) == []


def test_reference_reset_every_k_steps():
    assert [s for s in range(0, 11) if should_reset_reference(s, 4)] == [4, 8]
    assert not any(should_reset_reference(s, None) for s in range(100))
    with pytest.raises(ValueError, match="positive or None"):
        should_reset_reference(3, 0)


def test_reset_plan_keeps_optimizer_unless_asked():
    v2 = reset_plan(200, 200, reset_optimizer=False)
    assert v2.reset_reference and not v2.reset_optimizer  # ProRLv2
    v1 = reset_plan(200, 200, reset_optimizer=True)
    assert v1.reset_reference and v1.reset_optimizer  # ProRL v1
    off = reset_plan(199, 200, reset_optimizer=True)
    assert not off.reset_reference and not off.reset_optimizer
