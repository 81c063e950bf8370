"""brorl.stats: bootstrap intervals, the paired test and the minimum detectable difference,
against scipy on fixed data and against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from brorl.stats import (
    Interval,
    bootstrap_difference,
    bootstrap_mean,
    minimum_detectable_difference,
    paired_test,
)

X = np.random.default_rng(1).uniform(size=50)
"""Fixed per-instance scores (50 instances, one seed)."""


def test_one_seed_bootstrap_matches_scipy_percentile_bootstrap():
    ours = bootstrap_mean(X, resamples=20_000, seed=0)
    ref = stats.bootstrap((X,), np.mean, method="percentile", n_resamples=20_000,
                          rng=np.random.default_rng(0)).confidence_interval
    # Monte Carlo error of each 2.5% / 97.5% percentile with 20,000 resamples is about 0.001
    # (the mean's sd is 0.29 / sqrt(50) = 0.041); 0.005 is 3-4 standard errors of the gap.
    assert ours.mean == pytest.approx(X.mean(), abs=1e-12)
    assert ours.low == pytest.approx(ref.low, abs=0.005)
    assert ours.high == pytest.approx(ref.high, abs=0.005)
    assert ours.low < X.mean() < ours.high


def test_bootstrap_is_reproducible_for_a_seed_and_changes_with_it():
    assert bootstrap_mean(X, seed=3) == bootstrap_mean(X, seed=3)
    assert bootstrap_mean(X, seed=3) != bootstrap_mean(X, seed=4)
    a, b = X[None, :], (X + 0.1)[None, :]
    assert bootstrap_difference(a, b, seed=2) == bootstrap_difference(a, b, seed=2)


def test_identical_seeds_give_the_instance_bootstrap():
    # Three identical seed rows: resampling seeds never changes a mean, and the instance draws
    # come first from the same generator, so the interval is the one-seed interval (up to the
    # rounding of a sum over three rows).
    three, one = bootstrap_mean(np.tile(X, (3, 1)), seed=5), bootstrap_mean(X, seed=5)
    assert (three.mean, three.low, three.high) == pytest.approx((one.mean, one.low, one.high),
                                                                rel=1e-12)


def test_two_way_bootstrap_covers_seed_noise_the_instance_bootstrap_misses():
    # Seed 0 scores 0 everywhere, seed 1 scores 1: every instance resample keeps the mean at
    # 0.5, but seed resamples give 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so the 95%
    # percentile interval is [0, 1].
    scores = np.array([[0.0] * 20, [1.0] * 20])
    assert bootstrap_mean(scores) == Interval(0.5, 0.0, 1.0)
    assert bootstrap_mean(scores[:1]) == Interval(0.0, 0.0, 0.0)


def test_difference_resamples_instances_jointly():
    # b = a + 0.1 on every instance: paired resampling keeps the difference at 0.1 whatever the
    # instances drawn (an unpaired bootstrap would spread it by the instances' own spread).
    got = bootstrap_difference(X[None, :], (X + 0.1)[None, :])
    assert (got.mean, got.low, got.high) == pytest.approx((0.1, 0.1, 0.1), abs=1e-12)
    # one arm's seeds differ by a constant 0.2 (0.4 and 0.6 around the other arm's 0.5): the
    # interval of mean(b) - mean(a) spans the seed resamples of a: 0.5 - {0.6, 0.5, 0.4}
    a, b = np.array([[0.4] * 10, [0.6] * 10]), np.full((1, 10), 0.5)
    got = bootstrap_difference(a, b)
    assert (got.mean, got.low, got.high) == pytest.approx((0.0, -0.1, 0.1), abs=1e-12)


def test_bootstrap_refuses_nan_and_mismatched_instances():
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_mean(np.array([0.1, math.nan, 0.3]))
    with pytest.raises(ValueError, match="same instances"):
        bootstrap_difference(np.zeros((1, 4)), np.zeros((2, 5)))


def test_paired_test_matches_scipy_on_fixed_data():
    rng = np.random.default_rng(7)
    a = rng.integers(0, 5, size=40) / 4  # avg@4 pass@1 values: many ties, as real scores
    b = np.clip(a + rng.normal(0.05, 0.2, size=40), 0, 1)
    got = paired_test(a, b)
    d = b - a
    n, sd = len(d), d.std(ddof=1)
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)  # the t interval by hand
    assert got.n == 40 and got.delta == pytest.approx(d.mean())
    assert (got.ci_low, got.ci_high) == pytest.approx((d.mean() - half, d.mean() + half))
    ref = stats.ttest_rel(b, a)
    assert (got.t, got.p_two_sided) == pytest.approx((ref.statistic, ref.pvalue))
    assert got.p_one_sided == pytest.approx(stats.ttest_rel(b, a, alternative="greater").pvalue)
    assert got.effect_size_dz == pytest.approx(d.mean() / sd)
    assert got.wilcoxon_p == pytest.approx(stats.wilcoxon(b, a).pvalue)
    assert got.mde == pytest.approx(minimum_detectable_difference(sd, n))


def test_paired_test_on_a_hand_computed_case():
    # d = b - a = [1, 0, 1, 0]: mean 0.5, sd = sqrt((4 x 0.25) / 3) = 1 / sqrt(3),
    # t = 0.5 / (sd / 2) = sqrt(3); the direction is b - a, so swapping flips the sign.
    got = paired_test([0, 0, 0, 0], [1, 0, 1, 0])
    assert got.delta == 0.5 and got.t == pytest.approx(math.sqrt(3))
    assert got.p_two_sided == pytest.approx(2 * stats.t.sf(math.sqrt(3), 3))
    assert got.effect_size_dz == pytest.approx(0.5 * math.sqrt(3))
    swapped = paired_test([1, 0, 1, 0], [0, 0, 0, 0])
    assert swapped.delta == -0.5 and swapped.t == pytest.approx(-math.sqrt(3))
    assert swapped.p_one_sided == pytest.approx(1 - got.p_one_sided)


def test_equal_differences_leave_the_test_undefined():
    got = paired_test([0.0, 0.25, 0.5], [0.5, 0.75, 1.0])  # every difference 0.5, sd 0
    assert (got.delta, got.ci_low, got.ci_high, got.mde) == (0.5, 0.5, 0.5, 0.0)
    assert all(math.isnan(v) for v in (got.t, got.p_two_sided, got.p_one_sided,
                                       got.effect_size_dz, got.wilcoxon_p))
    with pytest.raises(ValueError, match="equal length"):
        paired_test([0.1, 0.2], [0.1, 0.2, 0.3])


def test_power_at_the_minimum_detectable_difference_is_the_asked_power():
    for n, sd, power in ((30, 0.4, 0.8), (8, 0.25, 0.8), (200, 0.3, 0.9)):
        mde = minimum_detectable_difference(sd, n, power=power)
        df, lam = n - 1, mde * math.sqrt(n) / sd
        crit = stats.t.ppf(0.975, df)
        got = stats.nct.sf(crit, df, lam) + stats.nct.cdf(-crit, df, lam)
        assert got == pytest.approx(power, abs=1e-6), (n, sd)
    # n = 2 (df 1, a family with two instances): scipy's nct.cdf is NaN this far in the lower
    # tail, which holds under 1e-15 of the power, so the upper tail alone must be 0.8
    lam = minimum_detectable_difference(0.5, 2) * math.sqrt(2) / 0.5
    assert stats.nct.sf(stats.t.ppf(0.975, 1), 1, lam) == pytest.approx(0.8, abs=1e-6)


def test_minimum_detectable_difference_approaches_the_normal_formula():
    # Large n: (z_0.975 + z_0.8) sd / sqrt(n) = 2.8016 sd / sqrt(n)
    sd, n = 0.35, 1_000_000
    normal = (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sd / math.sqrt(n)
    assert minimum_detectable_difference(sd, n) == pytest.approx(normal, rel=1e-3)
    # small n needs more (t tails are heavier), and the difference scales with sd
    assert minimum_detectable_difference(sd, 10) > 2.8016 * sd / math.sqrt(10)
    assert minimum_detectable_difference(2 * sd, 50) == pytest.approx(
        2 * minimum_detectable_difference(sd, 50))
    with pytest.raises(ValueError, match="n >= 2"):
        minimum_detectable_difference(sd, 1)
    with pytest.raises(ValueError, match="alpha < power"):
        minimum_detectable_difference(sd, 10, alpha=0.5, power=0.4)
