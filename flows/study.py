"""Flows of a study (docs/study.md): `study-plan`, `study-run`, `study-report`.

    python -m flows.study --params params/study.yaml --plan            # the plan files
    python -m flows.study --params params/study.yaml --start           # the shared step-0 scores
    python -m flows.study --params params/study.yaml --run n16_s0      # one run
    python -m flows.study --params params/study.yaml --report          # the report

DVC's stages `study_plan`, `study_start`, `study_run@<run>` and `study_report` call these; `make study` runs
`dvc repro study_report`. Composition only: a `study-run` prints the study's progress, gets the
run's folder ready (resume an interrupted run, start over a changed one), finds or creates the
study's MLflow parent run and trains the run as the `train-arm` subflow (each step an
`iteration`, as every arm; its step-0 evaluation the one `study-start` scored for all runs), then
tags its child run and marks it finished.
`BRORL_STUDY_STARTED` (epoch seconds, set by `make study`) dates the progress line's elapsed time.
"""

from __future__ import annotations

if __name__ == "__main__":  # the environment defaults before prefect loads (brorl.environment)
    from brorl.environment import apply_defaults
    from flows import prefect_home

    apply_defaults()
    prefect_home()

import argparse
import os
import sys
from typing import Any

from prefect import flow

from brorl.params import ParamsError, load_params
from brorl.preflight import InputError, check_inputs
from brorl.study import find_run
from flows import prefect_settings
from flows.train import train_arm
from tasks import study as s
from tasks import tracking


@flow(name="study-plan")
def study_plan(params_path: str, overrides: list[str] | None = None) -> list[str]:
    """Write the study's plan files; the run ids."""
    return s.plan(load_params(params_path, overrides or []).model_dump(mode="json"))


@flow(name="study-start")
def study_start(params_path: str, overrides: list[str] | None = None) -> str:
    """Score the step-0 evaluation every run shares; its file."""
    return s.score_start(load_params(params_path, overrides or []).model_dump(mode="json"))


@flow(name="study-run", flow_run_name="{run}")
def study_run(params_path: str, run: str, overrides: list[str] | None = None,
              started: float | None = None) -> dict[str, Any]:
    """Train run `run` of the study (resuming an interrupted session) as a child MLflow run."""
    params = load_params(params_path, overrides or []).model_dump(mode="json")
    prepared = s.prepare_run(params, run, started)
    parent = s.parent_run(params)
    summary = train_arm(prepared["params"], prepared["params"]["name"], parent_run_id=parent,
                        start=prepared["start"])
    s.finish_run(prepared, summary)
    return summary


@flow(name="study-report")
def study_report(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """The report from the finished runs; attached to the study's parent run."""
    params = load_params(params_path, overrides or []).model_dump(mode="json")
    result = s.report(params)
    s.log_report(params, s.parent_run(params), result)
    return result


def main(argv: list[str] | None = None) -> Any:
    parser = argparse.ArgumentParser(prog="python -m flows.study",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--params", required=True, help="the study's params file")
    parser.add_argument("-S", "--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override one params key")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--plan", action="store_true", help="write the plan files")
    mode.add_argument("--start", action="store_true",
                      help="score the step-0 evaluation every run shares")
    mode.add_argument("--run", metavar="RUN", help="train one run, e.g. n16_s0")
    mode.add_argument("--report", action="store_true", help="write the report")
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params, args.overrides)
        if args.run:
            find_run(params.study, args.run)
        if args.run or args.start:  # the warm-up's policy and the splits every run reads
            check_inputs(params, "train", tracking.ROOT, resume=False)
    except (ParamsError, InputError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    started = os.environ.get("BRORL_STUDY_STARTED")
    with prefect_settings():  # no heartbeat thread joined at the end of each flow run
        if args.plan:
            return study_plan(args.params, args.overrides)
        if args.start:
            return study_start(args.params, args.overrides)
        if args.run:
            return study_run(args.params, args.run, args.overrides,
                             float(started) if started else None)
        return study_report(args.params, args.overrides)


if __name__ == "__main__":
    main()
