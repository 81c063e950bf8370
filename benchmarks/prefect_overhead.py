"""What Prefect costs per training step: K `iteration` subflows of 7 trivial tasks, per config.

    python benchmarks/prefect_overhead.py                     # every configuration, K=20
    python benchmarks/prefect_overhead.py -k 40 --configs defaults pipeline

A training step of the `train` flow is an `iteration` subflow whose stages are tasks
(flows/train.py). Here each iteration is that shape with no work: 7 tasks that log one line and
return, called directly (sync) inside the subflow. Each configuration runs in a fresh process
(Prefect reads most settings at import) against its own server (`commands.server.running`) on
a free 127.0.0.1 port with a fresh database in a temporary folder; the table prints them side by side,
with "7 tasks without subflow" (the same tasks called in the parent flow) as the floor.

After its flow, each process checks on the server what the UI would show: K Completed flow runs of
`iteration`, 7 Completed task runs in each, and all 7K task log lines; and it counts the server's
"database is locked" answers (each a 503 that the client retries after about 2 s).

Configurations (`commands/server.py` holds the server's settings and the database):
    defaults      Prefect 3.7 as installed: SQLite, heartbeats, task-run states recorded one event
                  per transaction, every server service
    no-heartbeat  defaults without flow-run heartbeats (`flows.prefect_settings()`)
    lean-sqlite   no heartbeat, events recorded in batches, only the services a pipeline needs
                  (`PIPELINE_SERVER`), SQLite
    pipeline      lean-sqlite on PostgreSQL (`commands.server.database`): what `make run` starts

With `--stage N`, it also times a DVC stage process whose work is about a second, N times each way:
the `data` flow at `params/tiny_ci.yaml` size (written to a temporary folder) as `brorl data`
runs it, with no server (a temporary one per process, as a stage run on its own) and
against the pipeline's server (as `make run` runs stages), heartbeats on and off. The process
reports its imports, the time inside its tasks' functions (the work) and its interpreter teardown;
fixed cost = wall - those three.

Prints the thread count and /proc/loadavg beside the figures: a busy second core slows all of it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import Table, save, show  # noqa: E402
from brorl.system.environment import apply_defaults  # noqa: E402
from brorl.system.servers import run_in_session  # noqa: E402

apply_defaults()  # offline, project-local environment defaults, before prefect or mlflow load
import flows  # noqa: E402  (imports no prefect)
from commands.server import PIPELINE_SERVER  # noqa: E402  (imports no prefect)

TASKS = 7
BATCHED = [f"PREFECT_SERVER_SERVICES_{service}_{knob}" for service in ("TASK_RUN_RECORDER",
           "EVENT_PERSISTER") for knob in ("BATCH_SIZE", "READ_BATCH_SIZE")]
PREFECT_DEFAULTS = dict.fromkeys(BATCHED, "1") | {
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "20"}
# name: (no heartbeat, server settings, PostgreSQL)
CONFIGS = {
    "defaults": (False, PREFECT_DEFAULTS, False),
    "no-heartbeat": (True, PREFECT_DEFAULTS, False),
    "lean-sqlite": (True, PIPELINE_SERVER, False),
    "pipeline": (True, PIPELINE_SERVER, True),
}
LOCKED = "Encountered retryable exception in request"  # logged with LOG_RETRYABLE_ERRORS


def run_config(name: str, iterations: int, tmp: Path) -> dict:
    """In this process: start the configuration's server, run the flow, check its record."""
    from brorl.system.servers import free_port
    from commands import server

    no_heartbeat, settings, use_postgres = CONFIGS[name]
    log = tmp / "server.log"
    with ExitStack() as stack:
        db = stack.enter_context(server.database(tmp, tmp / "postgres.log")) if use_postgres else {}
        if use_postgres and not db:
            raise SystemExit("PostgreSQL could not start (see above)")
        started = time.perf_counter()
        url = stack.enter_context(server.running(
            free_port(), home=tmp / "prefect", log=log,
            settings={**settings, **db, "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true"}))
        start_s = time.perf_counter() - started
        os.environ["PREFECT_API_URL"] = url  # before prefect is imported
        with flows.prefect_settings() if no_heartbeat else nullcontext():
            times = measure(iterations)
        record = check(iterations)
    return {"server_start_s": start_s, **times, **record,
            "locked": log.read_text(errors="replace").count(LOCKED)}


def measure(iterations: int) -> dict[str, list[float]]:
    """Seconds per iteration subflow and per 7 tasks without a subflow, in one parent flow."""
    from prefect import flow, get_run_logger, task
    from prefect.cache_policies import NO_CACHE

    @task(name="trivial", cache_policy=NO_CACHE, persist_result=False)
    def trivial(step: int, index: int) -> int:
        get_run_logger().info("trivial task %d of step %d", index, step)
        return index

    @flow(name="iteration", flow_run_name="step-{step}", validate_parameters=False)
    def iteration(step: int) -> int:
        return sum(trivial(step, index) for index in range(TASKS))

    @flow(name="overhead")
    def overhead() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"subflow": [], "tasks": []}
        for step in range(iterations):
            started = time.perf_counter()
            iteration(step)
            out["subflow"].append(time.perf_counter() - started)
        for step in range(iterations):
            started = time.perf_counter()
            sum(trivial(-1 - step, index) for index in range(TASKS))
            out["tasks"].append(time.perf_counter() - started)
        return out

    return overhead()


def check(iterations: int, timeout_s: float = 30) -> dict[str, int]:
    """Flow runs, task runs and task log lines the server holds for the iterations (waits for the
    batched recorders, which flush every 5 s)."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)  # logs ship every 2 s; send what is queued
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["iteration"])))
            ids = [run.id for run in runs]
            tasks = read_all(client.read_task_runs,
                             flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
            logs = read_all(client.read_logs,
                            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))
            record = {
                "flow_runs": sum(run.state_name == "Completed" for run in runs),
                "task_runs": sum(t.state_name == "Completed" for t in tasks),
                "task_logs": sum(log.message.startswith("trivial task") for log in logs),
            }
            complete = record["task_runs"] == record["task_logs"] == iterations * TASKS
            if complete or time.monotonic() > deadline:
                return record
            time.sleep(1)


def read_all(read, **filters) -> list:
    """Every row of a paged Prefect read (the API returns at most 200 per call)."""
    rows: list = []
    while page := read(**filters, limit=200, offset=len(rows)):
        rows += page
    return rows


# A stage process that reports its own phases: imports; the time inside its tasks' functions (the
# work, lazy library imports and first MLflow use included, as a run without Prefect pays); and
# when its last exit handler ran (registered first, it runs after Prefect's log and event flushes),
# after which the interpreter tears the libraries down (about 3 s for torch, mlflow, datasets).
PROBE = """import atexit, contextlib, sys, time
atexit.register(lambda: print("FINAL", time.time(), flush=True))
started = time.perf_counter()
import flows, flows.data, tasks.data
from commands.cli import app
imported = time.perf_counter()
work = []
def timed(fn):
    def wrapper(*args, **kwargs):
        begun = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            work.append(time.perf_counter() - begun)
    return wrapper
for task in (tasks.data.build_data, tasks.data.log_data):
    task.fn = timed(task.fn)
with flows.prefect_settings() if sys.argv[1] == "quiet" else contextlib.nullcontext():
    app(["data", *sys.argv[2:]], standalone_mode=False)
print("PHASES", imported - started, sum(work), flush=True)
"""


def stage_seconds(repeats: int, tmp: Path) -> dict[str, list[float]]:
    """Per run of the `data` stage process: wall seconds, its imports and interpreter teardown,
    its tasks' work and its fixed cost (wall - those), with a temporary server (as a stage run on
    its own) and with the pipeline's server (as `make run` runs stages), heartbeats on and off."""
    from brorl.system.servers import free_port
    from commands import server

    sets = [f"data.path={tmp / 'data' / 'problems'}", f"tracking.metrics_dir={tmp / 'metrics'}"]
    args = ["--params", "params/tiny_ci.yaml", *(a for s in sets for a in ("-S", s))]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}"}
    env.pop("PREFECT_API_URL", None)
    out: dict[str, list[float]] = {}

    def run(mode: str, quiet: bool, extra: dict[str, str]) -> None:
        started = time.perf_counter()
        # without PREFECT_API_URL the stage starts a temporary server: stopped with it on SIGTERM
        done = run_in_session([sys.executable, "-c", PROBE, "quiet" if quiet else "-", *args],
                              cwd=ROOT, env={**env, **extra}, capture=True)
        done.check_returncode()
        wall, ended = time.perf_counter() - started, time.time()
        imports, work = map(float, done.stdout.split("PHASES")[-1].split()[:2])
        teardown = ended - float(done.stdout.split("FINAL")[-1].split()[0])
        for key, value in (("wall", wall), ("imports + teardown", imports + teardown),
                           ("work", work), ("fixed", wall - imports - teardown - work)):
            out.setdefault(f"{mode}: {key}", []).append(value)

    for _ in range(repeats):  # the project's PREFECT_HOME and SQLite, as a stage run alone
        run("temporary server", False, {})
    with ExitStack() as stack:
        db = stack.enter_context(server.database(tmp, tmp / "postgres.log"))
        url = stack.enter_context(server.running(
            free_port(), home=tmp / "prefect", log=tmp / "server.log",
            settings={**PIPELINE_SERVER, **db}))
        for _ in range(repeats):
            run("pipeline server", False, {"PREFECT_API_URL": url})
            run("pipeline server, no heartbeat", True, {"PREFECT_API_URL": url})
    return out


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-k", "--iterations", type=int, default=20,
                        help="iterations per configuration")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--stage", type=int, default=0, metavar="N",
                        help="also time the data stage process N times each way")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(run_config(args.child, args.iterations, Path(tmp))))
        return 0
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"{os.cpu_count()} cores, loadavg {loadavg()}; K={args.iterations} iterations of "
          f"{TASKS} tasks")
    results = {}
    for name in args.configs:
        # the child starts the servers; SIGTERM and Ctrl-C reach it, and it stops them
        done = run_in_session([sys.executable, __file__, "--child", name,
                               "-k", str(args.iterations)], capture=True, grace_s=60)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(f"{name}: failed (exit {done.returncode})\n{done.stderr[-3000:]}",
                  file=sys.stderr)
            continue
        results[name] = json.loads(lines[-1].removeprefix("RESULT "))
    expected = args.iterations * TASKS

    def spread(values: list[float]) -> str:
        return " / ".join(f"{v:.3f}" for v in (min(values), statistics.median(values),
                                               max(values))) if values else "-"

    tables = [Table(f"Seconds per iteration (min / median / max over {args.iterations}): a "
                    f"subflow of {TASKS} trivial tasks, and the {TASKS} tasks without a subflow",
                    ["configuration", "subflow", "tasks alone", "locked", "flow runs",
                     "task runs", "task logs", "server start s"],
                    [[name, spread(r["subflow"]), spread(r["tasks"]), r["locked"],
                      f"{r['flow_runs']}/{args.iterations}", f"{r['task_runs']}/{expected}",
                      f"{r['task_logs']}/{expected}", round(r["server_start_s"], 1)]
                     for name, r in results.items()])]
    if args.stage:
        with tempfile.TemporaryDirectory() as tmp:
            stages = stage_seconds(args.stage, Path(tmp))
        tables.append(Table(f"The data stage's process, seconds (min / median / max over "
                            f"{args.stage})", ["way", "seconds"],
                            [[name, spread(values)] for name, values in stages.items()]))
    show(tables)
    save("prefect_overhead", tables)
    print(f"loadavg after: {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
