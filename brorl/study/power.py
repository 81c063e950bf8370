"""The study's a-priori power analysis (docs/study.md, the plan): the seed variance components of
the study of commit 2cac7b5, the power of the seed-level tests at a number of seeds, the seeds the plan
fixes. `python -m brorl.study.power` prints the plan's table.

Variance components come from the committed figures of the study of 2026-11-24 (make study of
commit 2cac7b5: its report's intervals; its run folders are in no DVC remote, so nothing finer
can be recomputed). Overall score, points, 300 test instances at avg@8:

- BroRL - ProRL at equal rollouts (5 and 5 seeds): paired t interval over the seed-averaged
  instances [-6.82, -3.29] (df 299), two-way bootstrap interval [-8.23, -1.84];
- adaptive - ProRL (3 and 5 seeds; adaptive has ProRL's shape and LR): t [-0.88, +1.95],
  bootstrap [-1.85, +3.05].

The t interval's variance V_t is the instance part; the bootstrap's V_b adds each arm's seed part,
sd^2 (S - 1) / S^2 (the bootstrap's plug-in variance of a mean of S seeds). Taking adaptive's seed
sd as ProRL's: sd_P^2 = (V_b - V_t)[adaptive] / (2/9 + 4/25), sd_B^2 = (V_b - V_t)[BroRL] / (4/25)
- sd_P^2. The per-seed sd holds the seed's training noise and its avg@8 sampling noise on the
fixed instances: what a seed-level test over per-seed means sees. Our approximation: normal
intervals (z 1.96) for the bootstrap, the t quantile for the t interval.

Deliberately ignored: seed noise of arms that study did not run (BroRL at ProRL's LR and
the N = 16, B = 2 arm take BroRL's sd: the larger one, the conservative choice).
"""

from __future__ import annotations

import math

from scipy import stats

from brorl.stats import seeds_for_power, welch_power

PILOT = {
    "brorl_vs_prorl": {"t": (-6.82, -3.29), "bootstrap": (-8.23, -1.84), "seeds": (5, 5)},
    "adaptive_vs_prorl": {"t": (-0.88, 1.95), "bootstrap": (-1.85, 3.05), "seeds": (5, 3)},
}
"""The 2cac7b5 study's intervals (points; seeds of the baseline side first) and seeds."""
INSTANCES = 300
CONTRASTS = 9
"""Contrasts in the Holm family of params/study.yaml: the power is taken at Holm's first, most
stringent level alpha / CONTRASTS (the power of the contrast with the smallest p)."""
EFFECT = 5.0
"""The effect (points) the plan asks power for: the size of the 2cac7b5 study's BroRL - ProRL
difference (-5.06), so the new design can confirm or overturn it."""
AFFORDABLE = 3
"""Seeds per arm that fit `make study` in about 100 minutes on the 2-core CPU (docs/study.md,
the time estimate); the plan runs min(needed, AFFORDABLE) and states the power that buys."""


def _variance(interval: tuple[float, float], quantile: float) -> float:
    return ((interval[1] - interval[0]) / 2 / quantile) ** 2


def components() -> dict[str, float]:
    """Per-seed sd of the overall score (points) of ProRL and BroRL, and the instance part of a
    difference's variance (points^2), from `PILOT` (module docstring)."""
    t, z = stats.t.ppf(0.975, INSTANCES - 1), stats.norm.ppf(0.975)

    def seed_part(name: str) -> float:
        row = PILOT[name]
        return _variance(row["bootstrap"], z) - _variance(row["t"], t)

    def factor(s: int) -> float:
        return (s - 1) / s ** 2

    a, b = PILOT["adaptive_vs_prorl"]["seeds"], PILOT["brorl_vs_prorl"]["seeds"]
    var_p = seed_part("adaptive_vs_prorl") / (factor(a[0]) + factor(a[1]))
    var_b = (seed_part("brorl_vs_prorl") - factor(b[0]) * var_p) / factor(b[1])
    return {"sd_prorl": math.sqrt(var_p), "sd_brorl": math.sqrt(var_b),
            "instance_variance": _variance(PILOT["brorl_vs_prorl"]["t"], t)}


def needed_seeds(effect: float = EFFECT, *, alpha: float = 0.05, power: float = 0.8,
                 n_contrasts: int = CONTRASTS) -> dict[str, int]:
    """Seeds per arm for `power` at `effect` points, Welch's t at alpha / n_contrasts: ProRL
    against a BroRL arm, and two BroRL arms against each other."""
    c = components()
    level = alpha / n_contrasts
    return {"prorl_vs_brorl": seeds_for_power(effect, c["sd_prorl"], c["sd_brorl"], alpha=level,
                                              power=power),
            "brorl_vs_brorl": seeds_for_power(effect, c["sd_brorl"], c["sd_brorl"], alpha=level,
                                              power=power)}


def power_at(seeds: int, effect: float, *, alpha: float = 0.05,
             n_contrasts: int = CONTRASTS) -> float:
    """Power of Welch's t, ProRL against a BroRL arm, `seeds` each, at alpha / n_contrasts."""
    c = components()
    return welch_power(effect, c["sd_prorl"], c["sd_brorl"], seeds, seeds,
                       alpha=alpha / n_contrasts)


def detectable(seeds: int, *, alpha: float = 0.05, power: float = 0.8,
               n_contrasts: int = CONTRASTS) -> float:
    """The smallest effect (points, to 0.01) ProRL against a BroRL arm detects with `power`."""
    effect = 0.01
    while power_at(seeds, effect, alpha=alpha, n_contrasts=n_contrasts) < power:
        effect += 0.01
    return round(effect, 2)


def plan_seeds() -> int:
    """The seeds per arm of the plan: what the power analysis asks for, capped by what the time
    budget affords."""
    return min(max(needed_seeds().values()), AFFORDABLE)


def main() -> None:
    c = components()
    print(f"per-seed sd: ProRL {c['sd_prorl']:.2f}, BroRL {c['sd_brorl']:.2f} points; instance "
          f"variance of a difference {c['instance_variance']:.2f} points^2")
    for effect in (3.0, 4.0, 5.0):
        print(f"seeds per arm for power 0.8 at {effect:.0f} points, alpha 0.05/{CONTRASTS}: "
              f"{needed_seeds(effect)}")
    for seeds in range(2, 9):
        print(f"{seeds} seeds: power at {EFFECT:.0f} points {power_at(seeds, EFFECT):.2f} "
              f"(unadjusted {power_at(seeds, EFFECT, n_contrasts=1):.2f}); detectable at power "
              f"0.8: {detectable(seeds):.2f} points (unadjusted "
              f"{detectable(seeds, n_contrasts=1):.2f})")
    print(f"plan: {plan_seeds()} seeds per arm")


if __name__ == "__main__":
    main()
