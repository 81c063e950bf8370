"""Prefect flows: composition only (load params, open the MLflow run, call tasks, summarise).

Importing the package sets offline, project-local defaults before prefect or mlflow load, so
`dvc repro` and `python -m flows.NAME` behave like `make run` (already-set variables win).

It is also the one place of the Prefect settings that decide orchestration overhead (measured by
`benchmarks/prefect_overhead.py`): the client settings below apply to every flow process,
`PIPELINE_SERVER` to the server `make run` starts for a whole `dvc repro` (`flows/server.py`), and
`prefect_settings()` holds what no environment variable can say (no flow-run heartbeats).
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_HOME = Path(os.environ.setdefault("PREFECT_HOME", str(_ROOT / ".cache" / "prefect")))
_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    # Prefect 3.7 defaults these three to ~/.prefect whatever PREFECT_HOME says (the server warns
    # "Unable to write to memo_store.toml"); the memo store also spares later server starts the
    # block auto-registration.
    "PREFECT_SERVER_MEMO_STORE_PATH": str(_HOME / "memo_store.toml"),
    "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(_HOME / "storage"),
    "PREFECT_LOGGING_CONFIG_PATH": str(_HOME / "logging.yml"),
    # Task-run states reach the server as events: record them (and persist the events) in one
    # transaction per flush instead of one per event, which on SQLite collides with the API's
    # writes ("database is locked", a 2 s client retry each). Flushed every 5 s and at shutdown.
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "1000",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "1000",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "1000",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE": "1000",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TORCH_EXTENSIONS_DIR": str(_ROOT / ".cache" / "torch_extensions"),  # DeepSpeed's JIT ops
}
for _key, _value in _DEFAULTS.items():
    os.environ.setdefault(_key, _value)
_HOME.mkdir(parents=True, exist_ok=True)

# The server of a pipeline run records flow runs, task runs, logs and events (what the UI shows)
# and runs nothing else: no schedules, work pools, automations or cancellation clean-up, whose
# loops only compete with the API for the database and the two cores. `make serve` needs them
# and starts its server without these.
PIPELINE_SERVER = {
    f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
    for name in ("SCHEDULER", "LATE_RUNS", "FOREMAN", "CANCELLATION_CLEANUP", "PAUSE_EXPIRATIONS",
                 "REPOSSESSOR", "CLEANUP_RECONCILER", "TRIGGERS", "EVENT_LOGGER")
}


@contextmanager
def prefect_settings() -> Iterator[None]:
    """Run flows inside this: no flow-run heartbeats.

    Prefect 3.7 sends a heartbeat event per flow run from a thread that sleeps in 1 s steps, and
    the sync engine joins it when the run ends (`flow_engine._send_heartbeats`): up to 1 s at the
    end of every flow and subflow run. Nothing in a pipeline reads heartbeats (they serve
    automations that detect crashed deployment runs). `None` disables them, and no environment
    variable can carry `None`, hence a settings context (it reaches subflows and their threads).
    """
    from prefect.settings import temporary_settings

    with temporary_settings(updates={"flows.heartbeat_frequency": None}):
        yield
