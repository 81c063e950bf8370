"""Statistics of a comparison: bootstrap intervals over seeds and instances, a paired test, power.

- `bootstrap_mean(scores)`: mean of a `[seeds, instances]` score table with a percentile
  bootstrap interval that resamples seeds AND instances with replacement (two-way), so the
  interval holds both sources of noise: which RL seed ran and which problems were drawn. With one
  seed it is the ordinary instance bootstrap.
- `bootstrap_difference(a, b)`: mean(b) - mean(a) on the same instances (columns): instances
  resampled jointly (the difference stays paired), each arm's seeds independently.
- `paired_test(a, b)`: per-instance scores (already averaged over seeds), b - a: the paired
  t-test (`scipy.stats.ttest_rel`, the paper's test, spec §5.3) with its t interval, the effect
  size d_z = mean / sd of the differences, the Wilcoxon signed-rank p (no normality assumed) and
  the minimum detectable difference.
- `minimum_detectable_difference(sd, n)`: the smallest |mean difference| a two-sided paired
  t-test over n instances detects with the given power, from the noncentral t
  (`scipy.stats.nct`), solved with `scipy.optimize.brentq`.

Resampling is numpy index resampling under `np.random.default_rng(seed)`: the same seed gives
the same interval. Percentile intervals with linear interpolation, as
`scipy.stats.bootstrap(method="percentile")`. The two-way scheme is our choice (the paper reports
no intervals; one run per arm). Zero-variance differences give NaN tests (undefined there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

_CELLS_PER_CHUNK = 2_000_000
"""Resample-by-instance cells held at once (16 MB of float64); bounds memory for large sets."""
_EQUAL = 1e-12
"""Differences within this of each other count as equal (zero variance): float rounding of
scores that differ by the same amount must not make a test out of noise."""


@dataclass(frozen=True)
class Interval:
    """A point estimate and its interval (95% unless asked otherwise)."""

    mean: float
    low: float
    high: float


def _table(scores: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(scores, dtype=float)
    x = x[None, :] if x.ndim == 1 else x
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 2:
        raise ValueError(f"{name} must be [seeds, instances] with at least 2 instances, "
                         f"got shape {np.shape(scores)}.")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} holds NaN or infinite scores; score every instance of every "
                         "seed (the same instances in every row).")
    return x


def _counts(rng: np.random.Generator, rows: int, size: int) -> np.ndarray:
    """`[rows, size]`: how often each index was drawn in `rows` resamples of `size` with
    replacement (index resampling, then counted)."""
    idx = rng.integers(0, size, size=(rows, size)) + size * np.arange(rows)[:, None]
    return np.bincount(idx.ravel(), minlength=rows * size).reshape(rows, size).astype(float)


def _interval(estimate: float, draws: np.ndarray, confidence: float) -> Interval:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    tail = (1 - confidence) / 2
    low, high = np.percentile(draws, [100 * tail, 100 * (1 - tail)])
    return Interval(float(estimate), float(low), float(high))


def _resampled_means(tables: Sequence[np.ndarray], signs: Sequence[float], resamples: int,
                     seed: int) -> np.ndarray:
    """Per resample: sum over tables of sign x mean of the table resampled on shared instance
    indices and its own seed indices. Mean of a resample = c_seeds @ X @ c_instances / (S I)."""
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}.")
    rng = np.random.default_rng(seed)
    n_inst = tables[0].shape[1]
    chunk = max(1, _CELLS_PER_CHUNK // n_inst)
    out = []
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        inst = _counts(rng, rows, n_inst)
        total = np.zeros(rows)
        for x, sign in zip(tables, signs, strict=True):
            seeds = _counts(rng, rows, x.shape[0])
            total += sign * ((seeds @ x) * inst).sum(axis=1) / x.size
        out.append(total)
    return np.concatenate(out)


def bootstrap_mean(scores: np.ndarray, *, confidence: float = 0.95, resamples: int = 10_000,
                   seed: int = 0) -> Interval:
    """Mean of `scores` `[seeds, instances]` (1-D: one seed) with a two-way percentile bootstrap
    interval: each resample draws seeds and instances with replacement."""
    x = _table(scores, "scores")
    draws = _resampled_means([x], [1.0], resamples, seed)
    return _interval(float(x.mean()), draws, confidence)


def bootstrap_difference(a: np.ndarray, b: np.ndarray, *, confidence: float = 0.95,
                         resamples: int = 10_000, seed: int = 0) -> Interval:
    """mean(b) - mean(a) for `a` `[seeds_a, I]` and `b` `[seeds_b, I]` scored on the same
    instances (same column order), with a percentile bootstrap interval: instances resampled
    jointly (paired), the seeds of each arm independently."""
    xa, xb = _table(a, "a"), _table(b, "b")
    if xa.shape[1] != xb.shape[1]:
        raise ValueError(f"a and b must score the same instances: {xa.shape[1]} and "
                         f"{xb.shape[1]} columns; align both on the same instance ids.")
    draws = _resampled_means([xa, xb], [-1.0, 1.0], resamples, seed)
    return _interval(float(xb.mean() - xa.mean()), draws, confidence)


@dataclass(frozen=True)
class PairedTest:
    """b - a over n instances: mean difference `delta` with its t interval, the paired t-test
    (two- and one-sided, H1 b > a), d_z, the Wilcoxon signed-rank p, and the smallest
    difference the test detects (`mde`, same units as delta)."""

    n: int
    delta: float
    ci_low: float
    ci_high: float
    t: float
    p_two_sided: float
    p_one_sided: float
    effect_size_dz: float
    wilcoxon_p: float
    mde: float


def paired_test(a: Sequence[float], b: Sequence[float], *, alpha: float = 0.05,
                power: float = 0.8) -> PairedTest:
    """Paired comparison of per-instance scores `b` against `a` (same instances, same order).

    The interval is the (1 - alpha) t interval of the mean difference. When every difference is
    equal the test is undefined: t, p, d_z and the Wilcoxon p are NaN and the interval is the
    point; the Wilcoxon p is NaN too when every difference is zero.
    """
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.shape != xb.shape or xa.ndim != 1 or len(xa) < 2:
        raise ValueError(f"need two 1-D score arrays of equal length >= 2 over the same "
                         f"instances, got shapes {xa.shape} and {xb.shape}.")
    if not (np.isfinite(xa).all() and np.isfinite(xb).all()):
        raise ValueError("paired_test: NaN or infinite scores; score every instance in both arms.")
    d = xb - xa
    n, delta, sd = len(d), float(d.mean()), float(d.std(ddof=1))
    if np.ptp(d) <= _EQUAL:  # equal differences up to rounding (0.35 - 0.25 vs 0.6 - 0.5)
        sd = 0.0
    mde = minimum_detectable_difference(sd, n, alpha=alpha, power=power)
    if sd == 0:
        nan = float("nan")
        return PairedTest(n, delta, delta, delta, nan, nan, nan, nan, nan, mde)
    two = stats.ttest_rel(xb, xa)
    one = stats.ttest_rel(xb, xa, alternative="greater")
    ci = two.confidence_interval(confidence_level=1 - alpha)
    wilcoxon_p = float(stats.wilcoxon(d).pvalue) if np.any(d != 0) else float("nan")
    return PairedTest(n, delta, float(ci.low), float(ci.high), float(two.statistic),
                      float(two.pvalue), float(one.pvalue), delta / sd, wilcoxon_p, mde)


def _power(noncentrality: float, df: int, alpha: float) -> float:
    """Power of the two-sided t-test with `df` degrees of freedom at this noncentrality. The
    lower tail P(T < -crit | lambda) is taken as P(T > crit | -lambda) (the same by symmetry):
    scipy's `nct.cdf` returns NaN far in that tail (df 1, lambda 8), its `sf` does not."""
    crit = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(crit, df, noncentrality) + stats.nct.sf(crit, df, -noncentrality))


def minimum_detectable_difference(sd_diff: float, n: int, *, alpha: float = 0.05,
                                  power: float = 0.8) -> float:
    """Smallest |mean difference| that a two-sided paired t-test of n instances (differences
    with standard deviation `sd_diff`) detects at level `alpha` with probability `power`.

    Solves power(lambda) = power for the noncentrality lambda = delta sqrt(n) / sd of the
    noncentral t with n - 1 degrees of freedom; delta = lambda sd / sqrt(n). Large n gives
    (z_{1-alpha/2} + z_power) sd / sqrt(n). 0 when sd_diff is 0.
    """
    if n < 2:
        raise ValueError(f"minimum_detectable_difference needs n >= 2 instances, got {n}.")
    if not 0 < alpha < power < 1:
        raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}.")
    if not sd_diff >= 0:
        raise ValueError(f"sd_diff must be >= 0, got {sd_diff}.")
    if sd_diff == 0:
        return 0.0
    df = n - 1
    high = 1.0
    while _power(high, df, alpha) < power:  # the power rises with lambda: bracket the root
        high *= 2
    lam = optimize.brentq(lambda x: _power(x, df, alpha) - power, 0.0, high, xtol=1e-10)
    return float(lam * sd_diff / np.sqrt(n))
