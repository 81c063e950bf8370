"""What the live shrinkage diagnostics cost against a default training step (issue target: <= 10%).

    python benchmarks/diagnostics_cost.py                      # default arms, 5 steps each
    python benchmarks/diagnostics_cost.py --steps 6 --arms brorl --decompose

For each arm (params/prorl.yaml, params/brorl.yaml: the CPU defaults, `diagnostics` as
configured there), K steps from the same start (`--init`, default the pipeline's warm-up
policy) on the same data, bare (`brorl.train.Run.train`, no Prefect, no MLflow). Each step's
diagnostics are timed inside the step (`time/diagnostics`: probe scoring before and after the
update) and the rest of the step is the step without them (`time/iteration` minus that), so the
ratio compares the two side by side in one run; the headline pools the steps (sum of the
diagnostics' seconds over sum of the rest), per arm. `--decompose` adds the optional first-order
split and reports it the same way. Steps that did not update (nothing informative) carry no
diagnostics and are left out of the ratio.

Prints the thread count and /proc/loadavg beside the figures: a busy second core slows all of it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import Table, save, show  # noqa: E402
from brorl.system.environment import apply_defaults  # noqa: E402

apply_defaults()  # offline, project-local environment defaults, before prefect or mlflow load


def overrides(out: Path, steps: int, data: str, init: str, decompose: bool) -> list[str]:
    return [f"train.run_dir={out}", f"train.checkpoint_dir={out / 'checkpoints'}",
            f"train.steps={steps}", "train.max_rollouts=null", "train.max_seconds=null",
            "train.plateau_patience=null", f"train.eval_every={10**6}",
            f"train.checkpoint_every={10**6}", "train.save_rollouts=false",
            f"data.path={data}", f"train.init_checkpoint={init}",
            f"diagnostics.decompose={str(decompose).lower()}",
            f"tracking.metrics_dir={out / 'metrics'}", f"tracking.plots_dir={out / 'plots'}"]


def run_arm(arm: str, steps: int, data: str, init: str, decompose: bool, tmp: Path) -> list[dict]:
    """The per-step histories of K bare steps of one arm."""
    from brorl.params import load_params
    from brorl.train import Run

    params = load_params(ROOT / "params" / f"{arm}.yaml",
                         overrides(tmp / arm, steps, data, init, decompose))
    return Run.open(params, ROOT, resume=False).train()["history"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=["prorl", "brorl"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--data", default="outputs/data/problems")
    parser.add_argument("--init", default="outputs/prorl_warmup/policy")
    parser.add_argument("--decompose", action="store_true")
    args = parser.parse_args(argv)
    import torch

    load = Path("/proc/loadavg").read_text().strip()
    print(f"torch threads {torch.get_num_threads()}, load {load}")
    worst, per_step, pooled_rows = 0.0, [], []
    with tempfile.TemporaryDirectory() as tmp:
        for arm in args.arms:
            history = run_arm(arm, args.steps, args.data, args.init, args.decompose, Path(tmp))
            ratios, diag_total, rest_total = [], 0.0, 0.0
            for m in (m for m in history if "time/diagnostics" in m):
                diag = m["time/diagnostics"]
                rest = m["time/iteration"] - diag
                ratios.append(diag / rest)
                diag_total, rest_total = diag_total + diag, rest_total + rest
                probes = "/".join(str(int(m.get(f"diag/{s}/probes", 0)))
                                  for s in ("heldout", "solved", "unsolved"))
                per_step.append([arm, int(m["train/step"]), round(rest, 2), round(diag, 3),
                                 f"{100 * ratios[-1]:.1f}%", probes])
            if ratios:
                pooled = diag_total / rest_total
                worst = max(worst, pooled)
                pooled_rows.append([arm, len(history), len(ratios), f"{100 * pooled:.1f}%",
                                    f"{100 * statistics.median(ratios):.1f}%",
                                    f"{100 * min(ratios):.1f}%", f"{100 * max(ratios):.1f}%"])
    tables = [Table("Per step with an update: the diagnostics' seconds against the rest of the "
                    "step", ["arm", "step", "step without diagnostics s", "diagnostics s",
                             "ratio", "probes held-out/solved/unsolved"], per_step),
              Table("Per arm: diagnostics / step without them" +
                    (" (with the first-order decomposition)" if args.decompose else ""),
                    ["arm", "steps", "with an update", "pooled", "median", "min", "max"],
                    pooled_rows, [f"worst arm, pooled: {100 * worst:.1f}% (target <= 10%)"])]
    show(tables)
    save("diagnostics_cost_decompose" if args.decompose else "diagnostics_cost", tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
