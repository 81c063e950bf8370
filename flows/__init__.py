"""Prefect flows: composition only (load params, open the MLflow run, call tasks, summarise).

Importing the package changes nothing: each entry point (`commands/`) applies the environment
defaults (`brorl.environment`) itself, before prefect or mlflow load. Here is the one Prefect
setting the flow runs take that no environment variable can say, `prefect_settings()` (no
flow-run heartbeats; measured by `benchmarks/prefect_overhead.py`); the server's own settings are
`commands.server.PIPELINE_SERVER`.
"""

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def prefect_home() -> None:
    """Create PREFECT_HOME (the ephemeral server's database and the results live there) before
    prefect loads: prefect creates it without its parents."""
    if os.environ.get("PREFECT_HOME"):
        Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)


@contextmanager
def prefect_settings() -> Iterator[None]:
    """Run flows inside this: PREFECT_HOME created (`prefect_home`), no flow-run heartbeats.

    Prefect 3.7 sends a heartbeat event per flow run from a thread that sleeps in 1 s steps, and
    the sync engine joins it when the run ends (`flow_engine._send_heartbeats`): up to 1 s at the
    end of every flow and subflow run. Nothing in a pipeline reads heartbeats (they serve
    automations that detect crashed deployment runs). `None` disables them, and no environment
    variable can carry `None`, hence a settings context (it reaches subflows and their threads).
    """
    prefect_home()
    from prefect.settings import temporary_settings

    with temporary_settings(updates={"flows.heartbeat_frequency": None}):
        yield


def run_stage(task: Callable[[Any], dict[str, Any]], log: Callable[..., str], logged: set[str],
              params_path: str, overrides: list[str] | None) -> dict[str, Any]:
    """The body of a one-task stage's flow (`data`, `model`, `base`): load the params, run the
    stage's task, record it in one MLflow run whose params are the `logged` sections; return the
    task's summary with the run's id."""
    import tracking
    from brorl.params import load_params

    params = load_params(params_path, overrides or [])
    return tracking.record_stage(log, params, logged, task(params))
