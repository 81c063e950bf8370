"""Flow `train`: one RL run (`python -m flows.train --params params/prorl.yaml`).

Composition only. The run opens (or resumes, from the newest checkpoint, into the same MLflow run)
a trainer session, evaluates the start, then runs one `iteration` subflow per step until a budget
is spent (steps, rollouts, seconds, or the held-out plateau rule): sample_prompts ->
generate_rollouts -> verify -> filter (repeated while dynamic sampling refills) -> ppo_update ->
evaluate (every `train.eval_every` steps) -> checkpoint. Each step's metrics go to MLflow.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from brorl.params import load_params
from flows.entry import run_flow_cli
from tasks import train as t


@flow(name="iteration", flow_run_name="step-{step}")
def iteration(handle: str, step: int) -> dict[str, float]:
    """One RL step as tasks; returns its metrics."""
    done = False
    while not done:
        problems = t.sample_prompts(handle)
        batch = t.generate_rollouts(handle, problems)
        groups = t.verify(handle, problems, batch)
        done = t.filter_groups(handle, groups)
    metrics = t.ppo_update(handle)
    if t.eval_due(handle):
        metrics = {**metrics, **t.evaluate(handle)}
    t.checkpoint(handle)
    return metrics


@flow(name="train-arm", flow_run_name="{name}")
def train_arm(params: dict[str, Any], name: str, parent_run_id: str | None = None) -> dict:
    """Train one arm from resolved params; returns the run summary."""
    handle = t.open_trainer(params)
    try:
        run_id = t.start_run(handle, parent_run_id)
        if t.session(handle).trainer.step_count == 0:
            t.begin_step(handle)
            t.log_step(handle, t.evaluate(handle) | {"train/step": 0.0})
        while t.budget_left(handle):
            step = t.begin_step(handle)
            t.log_step(handle, iteration(handle, step))
        summary = t.finish_run(handle)
    except BaseException:
        t.fail_run(handle)
        raise
    return {**summary, "mlflow_run_id": run_id}


@flow(name="train")
def train(params_path: str, overrides: list[str] | None = None) -> dict:
    """Load params and train the arm they describe."""
    params = load_params(params_path, overrides or [])
    return train_arm(params.model_dump(mode="json"), params.name)


if __name__ == "__main__":
    run_flow_cli(train)
