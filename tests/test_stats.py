"""brorl.evaluation.stats: bootstrap intervals, the paired test and the minimum detectable difference; the
seed-level tests, TOST, Holm, the slope test and Welch power; against scipy on fixed data and
against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from brorl.evaluation.stats import (
    Interval,
    bootstrap_difference,
    bootstrap_mean,
    holm,
    minimum_detectable_difference,
    paired_test,
    seed_test,
    seeds_for_power,
    slope_test,
    tost_p,
    welch_power,
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


# --- seeds as the unit: Welch, paired and one-sample t, TOST, Holm ------------------------------

SEEDS_A = np.array([0.412, 0.437, 0.398, 0.455, 0.421])
"""Fixed per-seed mean scores of one arm (5 seeds)."""
SEEDS_B = np.array([0.371, 0.449, 0.352, 0.401, 0.388, 0.366])
"""Another arm's (6 seeds: Welch needs no equal sizes)."""


def test_seed_test_of_two_arms_is_welchs_t_of_scipy():
    got = seed_test(SEEDS_A, SEEDS_B, margin=0.02)
    ref = stats.ttest_ind(SEEDS_B, SEEDS_A, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert got.kind == "welch" and (got.n_a, got.n_b) == (5, 6)
    assert got.delta == pytest.approx(SEEDS_B.mean() - SEEDS_A.mean())
    assert (got.t, got.p_two_sided, got.df) == pytest.approx((ref.statistic, ref.pvalue, ref.df))
    assert (got.ci_low, got.ci_high) == pytest.approx((ci.low, ci.high))
    # se by hand: sqrt(var_a / 5 + var_b / 6)
    assert got.se == pytest.approx(math.sqrt(SEEDS_A.var(ddof=1) / 5 + SEEDS_B.var(ddof=1) / 6))


def test_tost_is_the_larger_of_two_one_sided_scipy_tests():
    m = 0.02
    # Welch: H0 delta <= -m is Welch's one-sided test of b + m against a; H0 delta >= m of b - m
    low = stats.ttest_ind(SEEDS_B + m, SEEDS_A, equal_var=False, alternative="greater").pvalue
    high = stats.ttest_ind(SEEDS_B - m, SEEDS_A, equal_var=False, alternative="less").pvalue
    assert seed_test(SEEDS_A, SEEDS_B, margin=m).p_equivalence == pytest.approx(max(low, high))
    # one sample: per-seed differences against -m and +m
    d = SEEDS_A - 0.40
    low = stats.ttest_1samp(d, -m, alternative="greater").pvalue
    high = stats.ttest_1samp(d, m, alternative="less").pvalue
    got = seed_test([0.40], SEEDS_A, kind="one_sample", margin=m)
    assert got.kind == "one_sample" and got.p_equivalence == pytest.approx(max(low, high))
    # equivalence at alpha iff the (1 - 2 alpha) interval lies inside (-m, m)
    ci = stats.ttest_1samp(d, 0).confidence_interval(0.90)
    assert (got.p_equivalence < 0.05) == (-m < ci.low and ci.high < m)


def test_tost_p_by_hand_and_when_the_difference_is_known_exactly():
    # delta 0, se 1, margin 2, df 10: both tails are P(T > 2) = 0.0367
    assert tost_p(0.0, 1.0, 10, 2.0) == pytest.approx(stats.t.sf(2.0, 10))
    assert tost_p(0.5, 0.0, 10, 2.0) == 0.0 and tost_p(2.5, 0.0, 10, 2.0) == 1.0
    assert math.isnan(tost_p(0.5, 1.0, 10, float("nan")))  # no margin: no equivalence test


def test_paired_and_one_sample_seed_tests_match_scipy():
    later = SEEDS_A + np.array([0.010, -0.004, 0.021, 0.003, 0.008])
    got = seed_test(SEEDS_A, later, kind="paired")
    ref = stats.ttest_rel(later, SEEDS_A)
    assert got.kind == "paired" and (got.t, got.p_two_sided) == pytest.approx(
        (ref.statistic, ref.pvalue))
    start = seed_test([0.40], SEEDS_A, kind="one_sample")
    ref = stats.ttest_1samp(SEEDS_A - 0.40, 0.0)
    assert (start.t, start.p_two_sided, start.df) == pytest.approx((ref.statistic, ref.pvalue, 4))
    with pytest.raises(ValueError, match="one value per seed"):
        seed_test(SEEDS_A, SEEDS_B, kind="paired")
    with pytest.raises(ValueError, match="one fixed value"):
        seed_test(SEEDS_A, SEEDS_B, kind="one_sample")


def test_a_seed_test_without_spread_is_undefined_but_knows_its_difference():
    one = seed_test(SEEDS_A, [0.40])  # one seed against five: no spread on that side
    assert one.kind == "welch" and math.isnan(one.p_two_sided) and math.isnan(one.ci_low)
    lone = seed_test([0.40], SEEDS_A)  # one seed of an arm is no fixed reference: undefined
    assert lone.kind == "welch" and math.isnan(lone.p_two_sided)
    same = seed_test([0.40], [0.43, 0.43, 0.43], kind="one_sample", margin=0.05)  # +0.03 each
    assert same.delta == pytest.approx(0.03) and math.isnan(same.p_two_sided)
    assert same.p_equivalence == 0.0


def test_holm_adjusts_by_hand_and_keeps_the_input_order():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max
    # 0.02, 0.03, 0.06, 0.06; back in input order
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # 2 x 0.5 = 1, then max(1, 0.9)
    got = holm([0.02, float("nan"), 0.01])  # NaN is no member: m = 2
    assert got[0] == pytest.approx(0.02) and math.isnan(got[1]) and got[2] == pytest.approx(0.02)


def test_holm_rejects_exactly_what_the_step_down_procedure_rejects():
    # Holm (1979): reject the i-th smallest while every p_(j) <= alpha / (m - j + 1), j <= i
    rng = np.random.default_rng(3)
    for _ in range(200):
        p = rng.uniform(0, 0.08, size=rng.integers(1, 8))
        for alpha in (0.01, 0.05):
            order = np.argsort(p)
            reject = np.zeros(len(p), dtype=bool)
            for i, idx in enumerate(order):
                if p[idx] > alpha / (len(p) - i):
                    break
                reject[idx] = True
            assert ((np.array(holm(p)) <= alpha) == reject).all(), (p, alpha)


def test_slope_test_is_scipys_regression_slope_with_instances_as_the_unit():
    rng = np.random.default_rng(11)
    x = np.array([0.0, 4.0, 8.0, 12.0, 16.0, 20.0])
    scores = 0.4 + 0.002 * x[:, None] + rng.normal(0, 0.05, size=(6, 40))  # [evals, instances]
    got = slope_test(scores, x, margin=0.004)
    assert got.slope == pytest.approx(stats.linregress(x, scores.mean(axis=1)).slope)
    per_instance = np.array([stats.linregress(x, scores[:, i]).slope for i in range(40)])
    ref = stats.ttest_1samp(per_instance, 0.0)
    assert (got.t, got.p_two_sided, got.df) == pytest.approx((ref.statistic, ref.pvalue, 39))
    low = stats.ttest_1samp(per_instance, -0.004, alternative="greater").pvalue
    high = stats.ttest_1samp(per_instance, 0.004, alternative="less").pvalue
    assert got.p_equivalence == pytest.approx(max(low, high))
    flat = slope_test(np.tile(scores.mean(axis=0), (6, 1)), x, margin=0.004)  # no change at all
    assert flat.slope == pytest.approx(0.0, abs=1e-15) and flat.p_equivalence == 0.0
    with pytest.raises(ValueError, match="evaluations >= 3"):
        slope_test(scores[:2], x[:2], margin=0.01)


def test_welch_power_matches_a_simulation_of_scipys_welch_test():
    # 40,000 simulated studies of 4 vs 6 seeds (sd 1 and 2, true difference 2.5): the share in
    # which scipy's Welch test rejects at 0.05; Monte Carlo sd of a share near 0.5 is 0.0025
    rng = np.random.default_rng(5)
    a, b = rng.normal(0, 1, size=(40_000, 4)), rng.normal(2.5, 2, size=(40_000, 6))
    simulated = float((stats.ttest_ind(b, a, axis=1, equal_var=False).pvalue < 0.05).mean())
    assert welch_power(2.5, 1.0, 2.0, 4, 6) == pytest.approx(simulated, abs=0.02)
    n = seeds_for_power(2.5, 1.0, 2.0)
    assert welch_power(2.5, 1.0, 2.0, n, n) >= 0.8 > welch_power(2.5, 1.0, 2.0, n - 1, n - 1)
    assert seeds_for_power(2.5, 1.0, 2.0, alpha=0.01) > n  # a stricter level needs more seeds
