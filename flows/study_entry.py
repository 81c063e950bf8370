"""`python -m flows.study`: its arguments and inputs checked before the flows load.

`flows/study.py` opens with

    if __name__ == "__main__":
        from flows.study_entry import main
        main()

so that a bad argument, params file or missing input prints one `error:` line (or argparse's
usage) and exits with code 2 before prefect, mlflow or torch are imported; only then is
`flows.study` imported and the mode's flow run. Everything here is light: the params, the
study's plan (`brorl.study.plan`) and the input checks (`brorl.preflight`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: relative paths of params files are taken from here (as `tasks.tracking.ROOT`)."""

MODES = ("warmup", "pool", "plan", "start", "report")
"""The flows other than `--run RUN` (flows/study.py's docstring)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flows.study",
                                description="The flows of a study (docs/study.md).")
    p.add_argument("--params", required=True, help="the study's params file")
    p.add_argument("-S", "--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override one params key")
    mode = p.add_mutually_exclusive_group(required=True)
    for name in MODES:
        mode.add_argument(f"--{name}", action="store_true", help=f"the study-{name} flow")
    mode.add_argument("--run", metavar="RUN", help="train one run, e.g. prorl_s0")
    return p


def check(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the arguments, load the params and check the files the mode reads; on failure
    print one `error:` line and exit with code 2."""
    from brorl.params import ParamsError, load_params
    from brorl.preflight import InputError, check_checkpoint, check_inputs, check_split
    from brorl.study.plan import find_run, plan_runs, run_params, warmup_dir, warmup_params

    from flows.entry import fail, prefect_api_error

    args = parser().parse_args(argv)
    try:
        params = load_params(args.params, args.overrides)
        if args.warmup:  # the pipeline's data and the base policy
            check_inputs(warmup_params(params), "train", ROOT)
        if args.pool:  # the train split and the study's warm-up policy
            check_split(ROOT / params.data.path, "train")
            check_checkpoint(ROOT / warmup_dir(params) / "policy", "the study's warm-up policy")
        if args.run or args.start:  # the pool and the warm-up policy (or the run's checkpoint)
            run = find_run(params.study, args.run) if args.run else plan_runs(params.study)[0]
            check_inputs(run_params(params, run), "train", ROOT, resume=bool(args.run))
    except (ParamsError, InputError, ValueError) as err:
        fail(str(err))
    if error := prefect_api_error():
        fail(error)
    return args


def main(argv: list[str] | None = None) -> NoReturn:
    """Apply the environment defaults (`brorl.environment`), check (`check`), then import
    `flows.study` and run the mode's flow; exit with code 0."""
    from brorl.environment import apply_defaults

    apply_defaults()
    args = check(argv)
    from flows.study import run

    run(args)
    raise SystemExit(0)
