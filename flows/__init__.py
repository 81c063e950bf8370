"""Prefect flows: composition only (load params, open the MLflow run, call tasks, summarise).

Importing the package changes nothing: each entry point applies the environment defaults
(`brorl.environment`) itself, before prefect or mlflow load. Here are the Prefect settings that
only the server or the flow runs take (measured by `benchmarks/prefect_overhead.py`):
`PIPELINE_SERVER` for the server `make run` starts for a whole `dvc repro` (`flows/server.py`),
and `prefect_settings()` for what no environment variable can say (no flow-run heartbeats).
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The server of a pipeline run records flow runs, task runs, logs and events (what the UI shows)
# and runs nothing else: no schedules, work pools, automations or cancellation clean-up, whose
# loops only compete with the API for the database and the two cores. `make serve` needs them
# and starts its server without these.
PIPELINE_SERVER = {
    f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
    for name in ("SCHEDULER", "LATE_RUNS", "FOREMAN", "CANCELLATION_CLEANUP", "PAUSE_EXPIRATIONS",
                 "REPOSSESSOR", "CLEANUP_RECONCILER", "TRIGGERS", "EVENT_LOGGER")
}


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
