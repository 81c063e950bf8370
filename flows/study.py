"""Flows of a study (docs/study.md): `study-warmup`, `study-pool`, `study-plan`, `study-start`,
`study-run`, `study-report`.

    brorl study --params params/study.yaml --warmup        # train to a shown plateau
    brorl study --params params/study.yaml --pool          # the prompt pool
    brorl study --params params/study.yaml --plan          # the plan files
    brorl study --params params/study.yaml --start         # the shared step-0 scores
    brorl study --params params/study.yaml --run prorl_s0  # one run
    brorl study --params params/study.yaml --report        # the report

The stages of study/dvc.yaml call these; `make study` runs `dvc repro study/dvc.yaml:study_report`.
Composition only. `study-warmup` trains the warm-up as the `train` flow trains an arm (each step
an `iteration` subflow), driven by `brorl.study.warmup.train_to_plateau`, as a child of the
study's MLflow parent run. A `study-run` prints the study's progress, gets the run's folder
ready (resume an interrupted run, start over a changed one) and trains the run as the
`train-arm` subflow, its step-0 evaluation the one `study-start` scored for all runs.
`BRORL_STUDY_STARTED` (epoch seconds, set by `make study`) dates the progress line's elapsed time.
The arguments are checked, and the mode's flow chosen, by `brorl study` (`commands/cli.py`).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from brorl.params import ExperimentParams, load_params
from brorl.study.warmup import train_to_plateau, write_plateau
from flows import device_slot, prefect_settings
from flows.train import PrefectDriver, train_arm
from tasks import study as s
from tasks import train as t


def _params(params_path: str, overrides: list[str] | None) -> ExperimentParams:
    return load_params(params_path, overrides or [])


@flow(name="study-warmup")
def study_warmup(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Train the warm-up until its validation slope is shown flat or its cap; `plateau.json`.
    A frozen warm-up is reused as it is."""
    params = _params(params_path, overrides)
    if (frozen := s.frozen_warmup(params)) is not None:
        return frozen  # made once: never trained again
    wp = s.warmup(params)
    with device_slot():  # a deployment's run: one training per device
        run = t.open_run(wp)
        tracker = t.start_tracking(run, wp, s.parent_run(params))
        with prefect_settings():
            record = train_to_plateau(run, params.study, PrefectDriver(tracker))
        t.finish_run(run, tracker, wp)
    write_plateau(run.run_dir, record)
    return record


@flow(name="study-pool")
def study_pool(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Choose the prompt pool at the warm-up's policy."""
    return s.pool(_params(params_path, overrides))


@flow(name="study-plan")
def study_plan(params_path: str, overrides: list[str] | None = None) -> list[str]:
    """Write the study's plan files; the run ids."""
    return s.plan(_params(params_path, overrides))


@flow(name="study-start")
def study_start(params_path: str, overrides: list[str] | None = None) -> str:
    """Score the step-0 evaluation every run shares; its file."""
    return s.score_start(_params(params_path, overrides))


@flow(name="study-run", flow_run_name="{run}")
def study_run(params_path: str, run: str, overrides: list[str] | None = None,
              started: float | None = None) -> dict[str, Any]:
    """Train run `run` of the study (resuming an interrupted session) as a child MLflow run."""
    params = _params(params_path, overrides)
    prepared = s.prepare_run(params, run, started)
    with device_slot():  # a deployment's run: one training per device
        summary = train_arm(prepared["params"], prepared["params"].name,
                            parent_run_id=s.parent_run(params), start=prepared["start"])
    s.finish_run(prepared, summary)
    return summary


@flow(name="study-report")
def study_report(params_path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """The report from the finished runs; attached to the study's parent run."""
    params = _params(params_path, overrides)
    result = s.report(params)
    s.log_report(params, s.parent_run(params), result)
    return result

