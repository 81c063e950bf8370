"""Run the trainer from a params file, on one process or under a launcher (`torchrun`, `deepspeed`).

    python -m brorl.train --params params/prorl_ci.yaml --steps 1
    torchrun --nproc_per_node 2 -m brorl.train --params params/prorl_ci.yaml --steps 1 \
        --report-dir /tmp/ranks

Each rank prints one JSON line (rank, step, parameter digest, metrics); `--report-dir` also writes
it to `<dir>/rank<r>.json`. Resumes from the newest checkpoint in `train.checkpoint_dir` unless
`--fresh`. The pipeline (`flows/train.py`) is the tracked way to train; this entry point is for
launchers and multi-process checks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from brorl.data import load_split
from brorl.params import ParamsError, load_params
from brorl.train.trainer import Trainer, parameter_digest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brorl.train", description=__doc__.split("\n")[0])
    parser.add_argument("--params", required=True, help="params YAML file, e.g. params/prorl.yaml")
    parser.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a params key, e.g. -S train.steps=3 (repeatable)")
    parser.add_argument("--steps", type=int, default=None, help="steps to run now (default: train.steps)")
    parser.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")
    parser.add_argument("--report-dir", type=Path, default=None, help="write rank<r>.json here")
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params, args.set)
    except ParamsError as err:
        parser.error(str(err))
    trainer = Trainer(params.trainer_config(), load_split(params.data.path, "train"),
                      resume=not args.fresh)
    history = trainer.train(args.steps)
    report = {"rank": trainer.rank, "world_size": trainer.world, "step": trainer.step_count,
              "digest": parameter_digest(trainer.model), "metrics": history[-1] if history else {}}
    line = json.dumps(report, sort_keys=True)
    print(line, flush=True)
    if args.report_dir is not None:
        args.report_dir.mkdir(parents=True, exist_ok=True)
        (args.report_dir / f"rank{trainer.rank}.json").write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
