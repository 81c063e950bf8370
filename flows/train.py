"""Flow `train`: one RL run (`brorl train --params params/prorl.yaml`).

Composition only. The loop is the library's (`brorl.train.Run.train`, the same one `python -m
brorl.train` runs: stop rules, evaluation and checkpoint schedules, resume); this flow drives it
with `PrefectDriver`: each step is an `iteration` subflow whose stages (sample_prompts ->
generate_rollouts -> verify -> filter, repeated while dynamic sampling refills, -> ppo_update ->
evaluate when due -> checkpoint when due) are tasks, and each finished step's metrics go to MLflow
(queued from the flow itself, not a task).
A rerun resumes from the newest checkpoint into the same MLflow run.
"""

from __future__ import annotations

from collections.abc import Callable

from prefect import flow
from prefect.utilities.annotations import quote

from brorl.evaluation.protocol import read_start
from brorl.params import ExperimentParams, load_params
from brorl.train import Run, Timed
from brorl.train.run import P, Stage, T
from flows import device_slot, prefect_settings
from tasks import train as t


@flow(name="iteration", flow_run_name="step-{step}", validate_parameters=False)
def iteration(step: int, body: Callable[[], dict[str, float]]) -> dict[str, float]:
    """One RL step: `body` is `Run.step` bound to the driver, which runs its stages as tasks."""
    return body()


class PrefectDriver:
    """Stages as tasks, steps as `iteration` subflows, finished steps logged to MLflow."""

    def __init__(self, tracker: t.Tracker) -> None:
        self.tracker = tracker

    def stage(self, run: Run, method: Stage[P, T], *args: P.args) -> Timed[T]:
        # quote(): Prefect would otherwise walk every argument (the run, its batches of problems
        # and rollouts) looking for futures, about 0.15 s per step
        return t.STAGES[method](quote(run), *(quote(a) for a in args))

    def iteration(self, step: int, body: Callable[[], dict[str, float]]) -> dict[str, float]:
        return iteration(step, body)

    def on_step(self, run: Run, metrics: dict[str, float]) -> None:
        t.log_step(self.tracker, run.step_count, metrics, run.config.name)


@flow(name="train-arm", flow_run_name="{name}")
def train_arm(params: ExperimentParams, name: str, parent_run_id: str | None = None,
              start: str | None = None) -> dict:
    """Train one arm from resolved params; returns the run summary. `start`: the file of its
    step-0 evaluation already scored (`brorl.evaluation.protocol.read_start`, `brorl.train.Run.train`)."""
    run = t.open_run(params)
    tracker = None
    try:
        tracker = t.start_tracking(run, params, parent_run_id)
        with prefect_settings():  # no heartbeat thread to join at each iteration's end
            run.train(PrefectDriver(tracker), start=read_start(start) if start else None)
        return t.finish_run(run, tracker, params)
    except BaseException:
        t.fail_run(tracker)
        raise


@flow(name="train")
def train(params_path: str, overrides: list[str] | None = None) -> dict:
    """Load params and train the arm they describe."""
    params = load_params(params_path, overrides or [])
    with device_slot():  # a deployment's run: one training per device
        return train_arm(params, params.name)
