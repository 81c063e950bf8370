"""Prefect flows: composition only (load params, open the MLflow run, call tasks, summarise).

Importing the package changes nothing: each entry point (`commands/`) applies the environment
defaults (`brorl.system.environment`) itself, before prefect or mlflow load. Here is the one Prefect
setting the flow runs take that no environment variable can say, `prefect_settings()` (no
flow-run heartbeats; measured by `benchmarks/prefect_overhead.py`); the server's own settings are
`commands.server.PIPELINE_SERVER`.
"""

import os
import re
import socket
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


DEVICE_LIMIT_PREFIX = "brorl-device"


def device_limit_names(environ: dict[str, str] | None = None) -> list[str]:
    """The global concurrency limits of this machine's devices, one slot each: the CPU and every
    CUDA device this process sees (`CUDA_VISIBLE_DEVICES`' ids when set), named
    `brorl-device-<host>-<device>`. `python -m commands.pools setup` creates them (`make worker`
    runs it), a training deployment's flow run holds one (`device_slot`)."""
    environ = os.environ if environ is None else environ
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())
    names = ["cpu"]
    import torch

    if torch.cuda.is_available():
        visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                   if v.strip()]
        names += [f"cuda{v}" for v in (visible or map(str, range(torch.cuda.device_count())))]
    return [f"{DEVICE_LIMIT_PREFIX}-{host}-{name}" for name in names]


def device_limit_name(environ: dict[str, str] | None = None) -> str:
    """The limit of the device a training in this process runs on: the first CUDA device it
    sees, else the CPU (`device_limit_names`)."""
    names = device_limit_names(environ)
    return names[1] if len(names) > 1 else names[0]


@contextmanager
def device_slot() -> Iterator[None]:
    """Hold this machine's training device (`device_limit_name`, a global concurrency limit of 1)
    for the block when the flow run belongs to a deployment (a worker or `serve` runs it): a
    second training that a worker starts on the same device waits here until the first ends,
    instead of sharing the device. Outside a deployment (`dvc repro`, `brorl train`)
    nothing is held. A missing limit fails the run with the command that creates it."""
    from prefect.runtime import deployment

    if deployment.id is None:
        yield
        return
    from prefect import get_run_logger
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectNotFound

    name = device_limit_name()
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            raise RuntimeError(f"no concurrency limit {name!r} on the Prefect server: start this "
                               "machine's workers with `make worker` (or run `python -m "
                               "commands.pools setup`), which creates it.") from None
    get_run_logger().info("waiting for %s (one training per device)", name)
    with concurrency(name, occupy=1, strict=True):
        get_run_logger().info("holding %s", name)
        yield
