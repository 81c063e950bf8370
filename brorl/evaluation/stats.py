"""Statistics of a comparison: bootstrap intervals over seeds and instances, a paired test, power.

- `bootstrap_mean(scores)`: mean of a `[seeds, instances]` score table with a percentile
  bootstrap interval that resamples seeds AND instances with replacement (two-way), so the
  interval holds both sources of noise: which RL seed ran and which problems were drawn. With one
  seed it is the ordinary instance bootstrap.
- `bootstrap_difference(a, b)`: mean(b) - mean(a) on the same instances (columns): instances
  resampled jointly (the difference stays paired), each arm's seeds independently.
- `paired_test(a, b)`: per-instance scores (already averaged over seeds), b - a: the paired
  t-test (`scipy.stats.ttest_rel`, the paper's test, BroRL §4.2.2) with its t interval, the effect
  size d_z = mean / sd of the differences, the Wilcoxon signed-rank p (no normality assumed) and
  the minimum detectable difference.
- `minimum_detectable_difference(sd, n)`: the smallest |mean difference| a two-sided paired
  t-test over n instances detects with the given power, from the noncentral t
  (`scipy.stats.nct`), solved with `scipy.optimize.brentq`.

Resampling is numpy index resampling under `np.random.default_rng(seed)`: the same seed gives
the same interval. Percentile intervals with linear interpolation, as
`scipy.stats.bootstrap(method="percentile")`. The two-way scheme is our choice (the paper reports
no intervals; one run per arm). Zero-variance differences give NaN tests (undefined there).

Seeds as the unit (a study's tests; the paired test above conditions on the seeds drawn):
- `seed_test(a, b, kind=)`: b - a over per-seed values (each seed's mean score): Welch's t for
  two sets of seeds (`scipy.stats.ttest_ind(equal_var=False)`), the one-sample t of per-seed
  differences for the same seeds scored twice (`paired`: a run at two points) or against one
  fixed value (`one_sample`: the start); with its t interval and the TOST p of equivalence
  within +-margin.
- `tost_p(delta, se, df, margin)`: two one-sided t tests (Schuirmann 1987): the larger of the
  p of H0 delta <= -margin and of H0 delta >= +margin; below alpha, the difference lies within
  the margin (the (1 - 2 alpha) interval inside (-margin, +margin)).
- `holm(p)`: Holm's step-down adjustment of a family of p-values (Holm 1979).
- `slope_test(scores, x)`: the slope of a score curve `[evaluations, instances]` over x, the
  instances as the unit (per-instance least-squares slopes, their mean and one-sample t), with
  its TOST p: is the curve flat within +-margin per unit of x.
- `evaluation_slope_test(means, x)`: the same slope with the evaluations as the unit: the
  least-squares line through the curve's per-evaluation means, its residual standard error (df =
  evaluations - 2) and TOST p. Unlike `slope_test` it counts each evaluation once: instances
  share the policy of an evaluation, so their slopes are not independent replicates.
- `welch_power`, `seeds_for_power`: the power of Welch's t at a true difference, and the fewest
  seeds per arm that reach a power (noncentral t at the Welch-Satterthwaite df); `tost_power`:
  the power of the TOST at a true difference (the same se and df).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


def _t_inference(estimate: float, se: float, df: float, margin: float, alpha: float,
                 result: Any = None,
                 interval: tuple[float, float] = (float("nan"), float("nan"))) -> dict[str, float]:
    """The t-test fields of `SeedTest` and `SlopeTest` for `estimate` (se, df, t interval, t,
    two-sided p, margin, TOST p), as keyword arguments of the record.

    `result` is scipy's t-test of the estimate (`ttest_1samp`, `ttest_ind`): t, p and the
    (1 - alpha) interval come from it. Without one the test is undefined: t and p are NaN and
    the interval is `interval` (NaN, or the point where the estimate is exact). The TOST p is
    computed either way, from `se` and `df`: an exact estimate still knows its equivalence.
    """
    t = p = float("nan")
    if result is not None:
        ci = result.confidence_interval(confidence_level=1 - alpha)
        interval = (float(ci.low), float(ci.high))
        t, p = float(result.statistic), float(result.pvalue)
    return dict(se=se, df=df, ci_low=interval[0], ci_high=interval[1], t=t, p_two_sided=p,
                margin=margin, p_equivalence=tost_p(estimate, se, df, margin))


@dataclass(frozen=True)
class SeedTest:
    """b - a with seeds as the unit: `kind` "welch" (two sets of seeds), "paired" (one set
    scored twice: per-seed differences) or "one_sample" (seeds against one fixed value); the
    mean difference, its standard error, degrees of freedom, (1 - alpha) t interval, t, the
    two-sided p, and the TOST p of |b - a| < `margin` (NaN without a margin)."""

    kind: str
    n_a: int
    n_b: int
    delta: float
    se: float
    df: float
    ci_low: float
    ci_high: float
    t: float
    p_two_sided: float
    margin: float
    p_equivalence: float


def tost_p(delta: float, se: float, df: float, margin: float) -> float:
    """The TOST p of equivalence within +-`margin`: max(P(T >= (delta + margin) / se),
    P(T <= (delta - margin) / se)) for T ~ t(df). With se 0 the difference is known exactly:
    0 inside the margin, 1 outside; NaN for an undefined test or margin."""
    if not (np.isfinite(delta) and np.isfinite(margin) and margin > 0 and se >= 0):
        return float("nan")
    if se == 0:
        return 0.0 if abs(delta) < margin else 1.0
    if not df > 0:
        return float("nan")
    lower = stats.t.sf((delta + margin) / se, df)   # H0: delta <= -margin
    upper = stats.t.cdf((delta - margin) / se, df)  # H0: delta >= +margin
    return float(max(lower, upper))


def _values(x: Sequence[float], name: str) -> np.ndarray:
    v = np.asarray(x, dtype=float).ravel()
    if len(v) < 1 or not np.isfinite(v).all():
        raise ValueError(f"{name} must hold at least one finite per-seed value, got {list(v)}.")
    return v


def seed_test(a: Sequence[float], b: Sequence[float], *, kind: str = "welch",
              alpha: float = 0.05, margin: float = float("nan")) -> SeedTest:
    """b - a over per-seed values (see `SeedTest`). `kind`: "welch" (two sets of seeds),
    "paired" (a[i] and b[i] are the same seed) or "one_sample" (`a` is one fixed value: the
    start policy's score). Fewer than 2 seeds on a varying side, or no spread at all, leave t, p
    and the interval NaN (the TOST p too, unless the difference is exactly known: every paired
    or one-sample difference equal)."""
    xa, xb = _values(a, "a"), _values(b, "b")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}.")
    if kind == "paired" and len(xa) != len(xb):
        raise ValueError(f"paired seed test needs one value per seed on both sides, got "
                         f"{len(xa)} and {len(xb)}.")
    if kind == "one_sample" and len(xa) != 1:
        raise ValueError(f"one-sample seed test needs one fixed value in a, got {len(xa)}.")
    if kind not in ("welch", "paired", "one_sample"):
        raise ValueError(f"kind must be welch, paired or one_sample, got {kind!r}.")
    nan = float("nan")
    if kind != "welch":
        d = xb - xa if kind == "paired" else xb - xa[0]
        delta = float(d.mean())
        if len(d) < 2 or np.ptp(d) <= _EQUAL:  # one seed: unknown spread; equal ones: none
            se = nan if len(d) < 2 else 0.0
            return SeedTest(kind, len(xa), len(xb), delta,
                            **_t_inference(delta, se, len(d) - 1.0, margin, alpha))
        result = stats.ttest_1samp(d, 0.0)
        se = float(d.std(ddof=1) / np.sqrt(len(d)))
    else:
        delta = float(xb.mean() - xa.mean())
        if min(len(xa), len(xb)) < 2 or (np.ptp(xa) <= _EQUAL and np.ptp(xb) <= _EQUAL):
            return SeedTest(kind, len(xa), len(xb), delta,
                            **_t_inference(delta, nan, nan, margin, alpha))
        result = stats.ttest_ind(xb, xa, equal_var=False)
        se = float(np.sqrt(xa.var(ddof=1) / len(xa) + xb.var(ddof=1) / len(xb)))
    return SeedTest(kind, len(xa), len(xb), delta,
                    **_t_inference(delta, se, float(result.df), margin, alpha, result))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values, in the input order: the i-th smallest of m p-values times
    (m - i + 1), made non-decreasing in that order, capped at 1. NaN p-values stay NaN and do
    not count in m (an undefined test is no member of the family)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    if np.any((p[finite] < 0) | (p[finite] > 1)):
        raise ValueError(f"p-values must lie in [0, 1], got {list(p)}.")
    order = finite[np.argsort(p[finite], kind="stable")]
    m = len(order)
    running = 0.0
    for i, idx in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[idx]))
        out[idx] = running
    return out.tolist()


@dataclass(frozen=True)
class SlopeTest:
    """The slope of a score curve per unit of x with the instances as the unit: mean of the
    per-instance least-squares slopes (equal to the slope of the mean curve), its standard error,
    t (df = instances - 1), two-sided p, the margin and the TOST p of |slope| < margin."""

    evaluations: int
    instances: int
    slope: float
    se: float
    df: float
    ci_low: float
    ci_high: float
    t: float
    p_two_sided: float
    margin: float
    p_equivalence: float


def slope_test(scores: np.ndarray, x: Sequence[float], *, margin: float,
               alpha: float = 0.05) -> SlopeTest:
    """Slope of `scores` `[evaluations, instances]` against `x` `[evaluations]` (see
    `SlopeTest`). The per-instance slope is sum((x - mean x)(y_i - mean y_i)) / sum((x -
    mean x)^2); the (1 - alpha) interval is the t interval of their mean."""
    y = np.asarray(scores, dtype=float)
    xs = np.asarray(x, dtype=float)
    if y.ndim != 2 or y.shape[0] != len(xs) or y.shape[0] < 3 or y.shape[1] < 2:
        raise ValueError(f"slope_test needs scores [evaluations >= 3, instances >= 2] and one x "
                         f"per evaluation, got {y.shape} and {len(xs)} x values.")
    if not (np.isfinite(y).all() and np.isfinite(xs).all()) or np.ptp(xs) == 0:
        raise ValueError("slope_test: scores and x must be finite and x must vary.")
    centred = xs - xs.mean()
    slopes = centred @ (y - y.mean(axis=0)) / (centred @ centred)
    n, slope = slopes.size, float(slopes.mean())
    se = float(slopes.std(ddof=1) / np.sqrt(n))
    if se <= _EQUAL:  # every instance's slope the same: the slope is exact
        return SlopeTest(len(xs), n, slope,
                         **_t_inference(slope, 0.0, n - 1.0, margin, alpha, None, (slope, slope)))
    result = stats.ttest_1samp(slopes, 0.0)
    return SlopeTest(len(xs), n, slope,
                     **_t_inference(slope, se, n - 1.0, margin, alpha, result))


def evaluation_slope_test(means: Sequence[float], x: Sequence[float], *, margin: float,
                          alpha: float = 0.05, instances: int = 0) -> SlopeTest:
    """Slope of a curve's per-evaluation `means` against `x`, the evaluations as the unit (see
    the module docstring): b = Sxy / Sxx, se = sqrt(RSS / (E - 2) / Sxx), df = E - 2, the
    (1 - alpha) t interval, the two-sided p of b = 0 and the TOST p within +-margin.
    `instances`: how many instances each mean averages (recorded only)."""
    y, xs = np.asarray(means, dtype=float), np.asarray(x, dtype=float)
    if y.ndim != 1 or len(y) != len(xs) or len(y) < 3:
        raise ValueError(f"evaluation_slope_test needs >= 3 evaluations and one x each, got "
                         f"{len(y)} means and {len(xs)} x values.")
    if not (np.isfinite(y).all() and np.isfinite(xs).all()) or np.ptp(xs) == 0:
        raise ValueError("evaluation_slope_test: means and x must be finite and x must vary.")
    centred = xs - xs.mean()
    sxx = float(centred @ centred)
    slope = float(centred @ (y - y.mean()) / sxx)
    residuals = y - y.mean() - slope * centred
    df = len(y) - 2.0
    se = float(np.sqrt(residuals @ residuals / df / sxx))
    if se <= _EQUAL:  # the means lie on a line: the slope is exact
        return SlopeTest(len(y), instances, slope,
                         **_t_inference(slope, 0.0, df, margin, alpha, None, (slope, slope)))
    t = slope / se
    half = float(stats.t.ppf(1 - alpha / 2, df)) * se
    return SlopeTest(len(y), instances, slope, se=se, df=df, ci_low=slope - half,
                     ci_high=slope + half, t=t, p_two_sided=float(2 * stats.t.sf(abs(t), df)),
                     margin=margin, p_equivalence=tost_p(slope, se, df, margin))


def _welch_se_df(sd_a: float, sd_b: float, n_a: int, n_b: int) -> tuple[float, float]:
    va, vb = sd_a ** 2 / n_a, sd_b ** 2 / n_b
    return float(np.sqrt(va + vb)), float((va + vb) ** 2 / (va ** 2 / (n_a - 1) +
                                                           vb ** 2 / (n_b - 1)))


def tost_power(delta: float, sd_a: float, sd_b: float, n_a: int, n_b: int, *, margin: float,
               alpha: float = 0.05) -> float:
    """Power of the TOST (each one-sided test at `alpha`) to show |b - a| < `margin` when the
    true difference is `delta`, Welch's se and df from the true sds (`welch_power`'s
    approximation): P(t > t_crit - (delta + margin) / se) - P(t > -t_crit - (delta - margin) /
    se) with the noncentral t, 0 when negative (an interval wider than the margin never fits)."""
    if min(n_a, n_b) < 2 or min(sd_a, sd_b) < 0 or max(sd_a, sd_b) == 0 or not margin > 0:
        raise ValueError(f"tost_power needs >= 2 seeds per side, a positive sd and margin, got "
                         f"n = ({n_a}, {n_b}), sd = ({sd_a}, {sd_b}), margin = {margin}.")
    se, df = _welch_se_df(sd_a, sd_b, n_a, n_b)
    crit = float(stats.t.ppf(1 - alpha, df))
    upper = stats.nct.cdf(-crit, df, (delta - margin) / se)  # rejects H0 delta >= +margin
    lower = stats.nct.cdf(crit, df, (delta + margin) / se)   # fails to reject delta <= -margin
    return float(max(0.0, upper - lower))


def welch_power(delta: float, sd_a: float, sd_b: float, n_a: int, n_b: int, *,
                alpha: float = 0.05) -> float:
    """Power of the two-sided Welch t-test at level `alpha` when the true difference is `delta`
    and the per-seed values have standard deviations sd_a, sd_b (n_a, n_b seeds): the noncentral
    t with noncentrality delta / se at the Welch-Satterthwaite df of the true variances (an
    approximation, as in every Welch power calculation)."""
    if min(n_a, n_b) < 2 or min(sd_a, sd_b) < 0 or max(sd_a, sd_b) == 0:
        raise ValueError(f"welch_power needs >= 2 seeds per side and a positive sd, got n = "
                         f"({n_a}, {n_b}), sd = ({sd_a}, {sd_b}).")
    se, df = _welch_se_df(sd_a, sd_b, n_a, n_b)
    return _power(abs(delta) / se, df, alpha)


def seeds_for_power(delta: float, sd_a: float, sd_b: float, *, alpha: float = 0.05,
                    power: float = 0.8, most: int = 1000) -> int:
    """The fewest seeds per arm (equal on both sides) at which `welch_power` reaches `power`;
    a ValueError past `most`."""
    for n in range(2, most + 1):
        if welch_power(delta, sd_a, sd_b, n, n, alpha=alpha) >= power:
            return n
    raise ValueError(f"more than {most} seeds per arm needed for power {power} at delta = "
                     f"{delta} (sd {sd_a}, {sd_b}).")
