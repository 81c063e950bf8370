"""Work pools and workers: brorl's deployments (`prefect.yaml`) run by workers where the devices are.

    python -m commands.pools setup            # the pool and this machine's device limits
    python -m commands.pools deploy           # check prefect.yaml, set up, `prefect deploy --all`
    python -m commands.pools worker           # set up, then a process worker for the pool here
    python -m commands.pools status           # the pool, its workers, the runs waiting for one

`make deploy` and `make worker` run these against the project's server at $PREFECT_API_URL
(`make server` starts one on 127.0.0.1:4200; default http://127.0.0.1:4200/api). Setting up is
idempotent: the process work pool `POOL` exists, and each device of this machine (its CPU and
every CUDA device it sees, `flows.device_limit_names`) has a global concurrency limit of one slot,
which a training deployment's flow run holds while it trains (`flows.device_slot`): a second
training on the same device waits instead of sharing it. A worker runs its flow runs as child
processes in this checkout (`BRORL_CHECKOUT`, read by prefect.yaml's pull step), with this
checkout's Python, at most `--limit` at once (default 1).

Bad input answers in one line before anything is registered: a prefect.yaml deployment whose
params do not validate, whose entrypoint is missing, or whose work pool is not the project's and
does not exist on the server; no server at $PREFECT_API_URL. `status` says when no worker has
polled the pool for `--stale-minutes` while flow runs wait, and writes that into each waiting
run's log, so the UI shows why a run has not started.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from brorl.params import ParamsError, load_params
from brorl.system.checkout import find_root
from commands.entry import environment, fail, prefect_api_error

POOL = "brorl"
"""The project's work pool (process type), which `setup` creates and prefect.yaml names."""
DEFAULT_API = "http://127.0.0.1:4200/api"
"""$PREFECT_API_URL when unset: `make server`'s address."""
STALE_MINUTES = 5.0
"""`status`: a pool none of whose workers has polled for this long is said to have none."""


def deployments(path: Path) -> list[dict[str, Any]]:
    """The deployments prefect.yaml declares (its `deployments` list)."""
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise DeployCheckError(f"{path}: cannot be read as YAML ({err}).") from None
    found = (spec or {}).get("deployments")
    if not isinstance(found, list) or not found:
        raise DeployCheckError(f"{path}: no `deployments` list; see docs/deploy.md.")
    return found


class DeployCheckError(RuntimeError):
    """A prefect.yaml deployment that cannot run (one line)."""


def deployment_name(entry: dict[str, Any]) -> str:
    """A prefect.yaml deployment's full name, `flow/deployment` (a flow is named after its
    function, `_` written `-`: `study_run` -> `study-run`)."""
    function = str(entry.get("entrypoint", "")).partition(":")[2]
    return f"{function.replace('_', '-')}/{entry.get('name', '?')}"


def _where(path: Path, entry: dict[str, Any]) -> str:
    return (f"{path.name}: deployment {entry.get('name', '?')!r} "
            f"({entry.get('entrypoint') or 'no entrypoint'})")


def check_deployments(path: Path, pools: set[str] | None) -> list[str]:
    """Each deployment of `path`: its entrypoint file and function exist, its params file and
    overrides validate, and (with `pools`, `check_pools`) its pool is known. Returns their
    names (`deployment_name`); raises DeployCheckError naming the first bad one."""
    root = path.parent
    for entry in deployments(path):
        file, _, function = str(entry.get("entrypoint", "")).partition(":")
        if not (root / file).is_file() or f"def {function}(" not in (root / file).read_text():
            raise DeployCheckError(f"{_where(path, entry)}: no function {function!r} in {file}; "
                                   "give entrypoint as flows/NAME.py:FUNCTION.")
        parameters = entry.get("parameters") or {}
        try:
            load_params(root / parameters.get("params_path", ""), parameters.get("overrides") or [])
        except ParamsError as err:
            raise DeployCheckError(f"{_where(path, entry)}: {err}") from None
    if pools is not None:
        check_pools(path, pools)
    return [deployment_name(entry) for entry in deployments(path)]


def check_pools(path: Path, pools: set[str]) -> None:
    """DeployCheckError for the first deployment of `path` whose work pool is neither the
    project's nor one of `pools` (the server's)."""
    for entry in deployments(path):
        pool = (entry.get("work_pool") or {}).get("name")
        if pool != POOL and pool not in pools:
            raise DeployCheckError(f"{_where(path, entry)}: work pool {pool!r} does not exist on "
                                   f"the server; use the project's pool {POOL!r} (which `make "
                                   f"worker` creates) or create it: prefect work-pool create "
                                   f"{pool} --type process.")


def api_url() -> str:
    """$PREFECT_API_URL, set to `DEFAULT_API` when unset (so that prefect and its CLI use it)."""
    os.environ.setdefault("PREFECT_API_URL", DEFAULT_API)
    return os.environ["PREFECT_API_URL"]


def require_server() -> None:
    """Exit 2 with one line when no Prefect server answers at $PREFECT_API_URL."""
    api_url()
    if error := prefect_api_error():
        fail(f"{error} (`make server` starts the project's server at {DEFAULT_API}.)")


def setup(pool: str = POOL) -> list[str]:
    """Create the process work pool `pool` (the project's, `POOL`) and this machine's device
    limits (one slot each) where missing; set a device limit back to one slot where it is not.
    Returns what it did."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
        WorkPoolCreate,
    )
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from flows import device_limit_names

    done = []
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            try:
                client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
                done.append(f"created work pool {pool} (process)")
            except ObjectAlreadyExists:  # another setup created it meanwhile
                pass
        for name in device_limit_names():
            try:
                limit = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                try:
                    client.create_global_concurrency_limit(
                        GlobalConcurrencyLimitCreate(name=name, limit=1))
                    done.append(f"created concurrency limit {name} (1 slot)")
                except ObjectAlreadyExists:
                    pass
                continue
            if limit.limit != 1 or not limit.active:
                client.update_global_concurrency_limit(
                    name, GlobalConcurrencyLimitUpdate(limit=1, active=True))
                done.append(f"set concurrency limit {name} to 1 slot")
    return done


def check_pool(pool: str) -> None:
    """DeployCheckError (one line) when the server has no work pool `pool`."""
    if pool not in pool_names():
        raise DeployCheckError(f"work pool {pool!r} does not exist on the server at {api_url()}; "
                               f"use the project's pool {POOL!r} (`make worker` creates it) or "
                               f"create it: prefect work-pool create {pool} --type process.")


def pool_names() -> set[str]:
    """The work pools the server at $PREFECT_API_URL has."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {p.name for p in client.read_work_pools()}


def deploy(prefect_file: Path) -> int:
    """Check prefect.yaml (params and entrypoints, before the server is asked), set up, check
    the pools, then `prefect deploy --all` with it; prefect's exit code."""
    check_deployments(prefect_file, None)
    require_server()
    for line in setup():
        print(line)
    check_pools(prefect_file, pool_names())
    command = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all",
               "--prefect-file", str(prefect_file)]
    return subprocess.run(command, cwd=prefect_file.parent, check=False).returncode


def worker_command(pool: str, name: str | None, limit: int) -> list[str]:
    """`prefect worker start` for a process worker of `pool`."""
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool,
               "--type", "process", "--limit", str(limit)]
    return command + (["--name", name] if name else [])


def worker(pool: str, name: str | None, limit: int) -> None:
    """Set up, then run a process worker of `pool` in this checkout until Ctrl-C. A pool other
    than the project's must exist already (DeployCheckError)."""
    require_server()
    for line in setup():
        print(line)
    check_pool(pool)
    root = str(find_root())  # the flow runs' working directory and import path
    env = {**os.environ, "BRORL_CHECKOUT": root,
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    os.execvpe(sys.executable, worker_command(pool, name, limit), env)


def status(pool: str, stale_minutes: float) -> list[str]:
    """Lines on `pool`: its workers and when each last polled, its flow runs waiting for a
    worker, the device limits' slots in use; a warning (also written into each waiting run's
    log) when runs wait and no worker has polled for `stale_minutes`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import LogCreate
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import ObjectNotFound

    from flows import DEVICE_LIMIT_PREFIX

    now = datetime.datetime.now(datetime.timezone.utc)
    lines = []
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            check_pool(pool)  # says so in one line
        workers = client.read_workers_for_work_pool(pool)
        polled = [w.last_heartbeat_time for w in workers if w.last_heartbeat_time]
        lines.append(f"work pool {pool}: {len(workers)} worker(s)")
        for w in workers:
            ago = (now - w.last_heartbeat_time).total_seconds() / 60 if w.last_heartbeat_time \
                else float("inf")
            lines.append(f"  worker {w.name}: {w.status.value if w.status else '?'}, last polled "
                         f"{ago:.1f} min ago")
        waiting = client.read_flow_runs(
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                any_=[StateType.SCHEDULED, StateType.PENDING]))))
        due = [r for r in waiting if r.expected_start_time is None or r.expected_start_time <= now]
        lines.append(f"flow runs due and waiting for a worker: {len(due)}")
        for run in due:
            lines.append(f"  {run.name} ({run.state_name}, {run.id})")
        for limit in client.read_global_concurrency_limits(limit=200):
            if limit.name.startswith(DEVICE_LIMIT_PREFIX):
                lines.append(f"device {limit.name}: {limit.active_slots}/{limit.limit} slot(s) "
                             "in use")
        last = max(polled, default=None)
        idle = (now - last).total_seconds() / 60 if last else float("inf")
        if due and idle >= stale_minutes:
            since = "no worker has ever polled it" if last is None else \
                f"no worker has polled it for {idle:.0f} min"
            warning = (f"work pool {pool}: {since} and {len(due)} flow run(s) wait; start one "
                       f"where the devices are: make worker (python -m commands.pools worker)")
            lines.append(f"warning: {warning}")
            client.create_logs([LogCreate(name="brorl.pools", level=30, message=warning,
                                          timestamp=now, flow_run_id=run.id)
                                for run in due])
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m commands.pools",
                                description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="create the work pool and this machine's device limits")
    d = sub.add_parser("deploy", help="check prefect.yaml, set up, prefect deploy --all")
    d.add_argument("--prefect-file", type=Path, default=None,
                   help="the deployments' file (default: prefect.yaml of this checkout)")
    w = sub.add_parser("worker", help="set up, then start a process worker here")
    w.add_argument("--pool", default=POOL)
    w.add_argument("--name", default=None, help="the worker's name (default: Prefect's)")
    w.add_argument("--limit", type=int, default=1, help="most flow runs at once (default 1)")
    s = sub.add_parser("status", help="the pool, its workers, the runs waiting for one")
    s.add_argument("--pool", default=POOL)
    s.add_argument("--stale-minutes", type=float, default=STALE_MINUTES,
                   help=f"warn when no worker polled for this long (default {STALE_MINUTES:g})")
    return p


def main(argv: list[str] | None = None) -> None:
    environment()
    args = parser().parse_args(argv)
    try:
        if args.command == "deploy":
            path = args.prefect_file or find_root() / "prefect.yaml"
            raise SystemExit(deploy(path.resolve()))
        if args.command == "worker":
            if args.limit < 1:
                fail(f"--limit {args.limit}: give at least 1 (flow runs at once).")
            worker(args.pool, args.name, args.limit)
        require_server()
        if args.command == "setup":
            print("\n".join(setup()) or f"work pool {POOL} and this machine's device limits "
                  "exist")
        else:
            print("\n".join(status(args.pool, args.stale_minutes)))
    except DeployCheckError as err:
        fail(str(err))


if __name__ == "__main__":
    main()
