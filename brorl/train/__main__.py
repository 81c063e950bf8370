"""Run an RL run from a params file, on one process or under a launcher (`torchrun`, `deepspeed`).

    python -m brorl.train --params params/prorl_ci.yaml
    torchrun --nproc_per_node 2 -m brorl.train --params params/prorl_ci.yaml --report-dir /tmp/r

The loop is `brorl.train.Run.train`, the same one the Prefect flow (`flows/train.py`) drives: it
honours every stop rule and schedule of the params file (`train.steps`, `max_rollouts`,
`max_seconds`, `plateau_patience`, `eval_every`, `checkpoint_every`). `--steps K` runs at most K
more steps now. Each rank prints one JSON line (rank, step, stop reason, parameter digest, last
metrics); `--report-dir` also writes it to `<dir>/rank<r>.json`. Resumes from the newest
checkpoint in `train.checkpoint_dir` unless `--fresh`. Relative paths in the params are taken
from the checkout it runs in (`brorl.system.checkout`: `$BRORL_ROOT`, else the folder from the working
directory up that holds dvc.yaml and params/). The Prefect flow adds MLflow tracking and the
DVC metrics files. The params and every file the run reads (`brorl.runs.preflight.check_inputs`:
splits, checkpoints, the resumed one written by the same run unless `--allow-changed-params`)
are checked before torch loads: a bad one is one `error:` line and exit code 2 within about a
second.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from brorl.params import ParamsError, load_params
from brorl.runs.preflight import InputError, check_inputs
from brorl.system.checkout import CheckoutError, find_root
from brorl.system.environment import apply_defaults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brorl.train", description=__doc__.split("\n")[0])
    parser.add_argument("--params", required=True, help="params YAML file, e.g. params/prorl.yaml")
    parser.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a params key, e.g. -S train.steps=3 (repeatable)")
    parser.add_argument("--steps", type=int, default=None,
                        help="run at most this many more steps now (the stop rules still apply)")
    parser.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")
    parser.add_argument("--allow-changed-params", action="store_true",
                        help="resume a checkpoint written under other params (by default only "
                             "the stop rules and schedules may change: brorl/runs/folder.py)")
    parser.add_argument("--quiet", action="store_true", help="no progress line per step")
    parser.add_argument("--report-dir", type=Path, default=None, help="write rank<r>.json here")
    args = parser.parse_args(argv)
    try:
        apply_defaults()
        root = find_root()
        params = load_params(args.params, args.set)
        notes = check_inputs(params, "train", root, resume=not args.fresh,
                             allow_changed_params=args.allow_changed_params)
    except (ParamsError, InputError, CheckoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    from brorl.train.run import Direct, Run  # torch, deepspeed: after the checks
    from brorl.train.trainer import parameter_digest, shutdown_distributed

    run = Run.open(params, root, resume=not args.fresh)
    summary = run.train(Direct(progress=None if args.quiet else print), max_steps=args.steps)
    history = summary["history"]
    report = {"rank": run.trainer.rank, "world_size": run.trainer.world, "step": run.step_count,
              "stopped_by": summary["stopped_by"], "rollouts": summary["rollouts"],
              "digest": parameter_digest(run.trainer.model),
              "metrics": history[-1] if history else {}}
    line = json.dumps(report, sort_keys=True)
    print(line, flush=True)
    if args.report_dir is not None:
        args.report_dir.mkdir(parents=True, exist_ok=True)
        (args.report_dir / f"rank{run.trainer.rank}.json").write_text(line + "\n")
    shutdown_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
