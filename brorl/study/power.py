"""The study's a-priori power analysis (docs/study.md, the plan, version 2): from the per-seed sds
the plan assumes (`study.design_sd`), the effect each confirmatory contrast detects at the planned
seeds, the seeds the paper's effect would need, and the TOST's power at no change.
`python -m brorl.study.power [--params params/study.yaml]` prints the plan's table.

The design sds are the per-seed sds of each arm's overall test score at the budget (avg@8 on
300 test instances, 3 seeds each) in the two runs of the version-1 design, the larger of the
two per arm: ProRL 1.6 and 0.43, BroRL at ProRL's LR 4.1 and 1.58, BroRL at the sqrt-rule LR 7.5
and 7.83 points (commit 115c69e's as reported when this redesign was asked for; d567208's from its
run folders). The B = 64 x N = 16 arm did not run there; it takes BroRL-at-ProRL's-LR's 4.1 (the
larger of the two shapes it sits between). The start's draws differ only in evaluation
sampling: at 64 samples on about 190 hold-out instances with pass rates near 0.1 the sd of a
draw's mean is about 0.25 points; the plan takes 0.5. These are sds of the full test split; the
hold-out's are unknown before the study runs, and the report states every detectable effect
from these, not from what it observes.

Seeds: the time budget of `make study` (3 hours on the 2-core CPU, docs/study.md) affords 6 per
confirmatory arm and 3 for the exploratory one; the paper's effect (1-1.6 points, BroRL Table 1)
would need about 80 per arm: out of reach, so the plan states what it can detect instead.
"""

from __future__ import annotations

import argparse

from brorl.evaluation.stats import seeds_for_power, tost_power, welch_power

PAPER_EFFECT = 0.016
"""BroRL's largest gain over ProRL in its Table 1 (points / 100)."""


def detectable(sd_a: float, sd_b: float, n_a: int, n_b: int, *, alpha: float,
               power: float = 0.8) -> float:
    """The smallest difference (score units, to 0.001) Welch's t at `alpha` detects with
    `power`."""
    effect = 0.001
    while welch_power(effect, sd_a, sd_b, n_a, n_b, alpha=alpha) < power and effect < 1:
        effect += 0.001
    return round(effect, 3)


def plan_table(params) -> list[str]:
    """The plan's power table, one line per contrast of the confirmatory family and the
    premise."""
    study = params.study
    sd = study.design_sd
    m = len(study.confirmatory)
    lines = ["design sds (points): " + ", ".join(f"{k} {100 * v:.2f}" for k, v in sd.items()),
             f"confirmatory family: {m} contrasts, Welch at alpha {study.alpha}/{m} (Holm's "
             f"first step), power {study.power}"]
    for name in study.confirmatory:
        c = study.contrasts[name]
        a, b = c.a.partition("@")[0], c.b.partition("@")[0]
        na, nb = study.arms[a].seeds, study.arms[b].seeds
        effect = detectable(sd[a], sd[b], na, nb, alpha=study.alpha / m, power=study.power)
        need = seeds_for_power(PAPER_EFFECT, sd[a], sd[b], alpha=study.alpha / m,
                               power=study.power)
        tost = tost_power(0.0, sd[a], sd[b], na, nb, margin=study.margin, alpha=study.alpha)
        lines.append(f"  {name}: {na} x {nb} seeds detect {100 * effect:.1f} points; the "
                     f"paper's {100 * PAPER_EFFECT:.1f} points would need {need} per arm; TOST "
                     f"power at no change {tost:.2f} (equivalence not read)")
    if study.premise:
        c = study.contrasts[study.premise]
        b = c.b.partition("@")[0]
        nb, na = study.arms[b].seeds, study.start_replicates
        for true in (0.0, 0.01):
            lines.append(f"premise {study.premise}: TOST within +-{100 * study.margin:.0f} "
                         f"points, {nb} seeds against {na} start draws, power at a true change of "
                         f"{100 * true:.0f} points "
                         f"{tost_power(true, sd['start'], sd[b], na, nb, margin=study.margin, alpha=study.alpha):.2f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    from brorl.params import load_params

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params/study.yaml")
    args = parser.parse_args(argv)
    print("\n".join(plan_table(load_params(args.params, []))))


if __name__ == "__main__":
    main()
