"""Every entry point that starts servers stops them on SIGTERM and on Ctrl-C (SIGINT).

Each case starts an entry point in a session of its own, records every process below it while it
runs, waits until its server answers (its health URL: an event, not a fixed sleep), then sends
SIGTERM to the entry point alone (as `kill PID` does) or SIGINT to its process group (as a
terminal's Ctrl-C does). The entry point must exit, and no process it started may be left:
not the Prefect or MLflow server, nor PostgreSQL, nor a benchmark's per-configuration process.

The entry points: `python -m commands.server -- CMD` (Prefect server, PostgreSQL and a foreground
command), `benchmarks/prefect_overhead.py` (a Prefect server in a child process per
configuration) and `python -m commands.mlflow_ui`; below them, `brorl.system.servers.running` in a
plain script. A Prefect or MLflow server takes 10-30 s to start on 2 busy cores: 1-2 minutes in
all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from brorl.system.servers import HOST, answers, free_port
from tests.process_tree import descendants, settled, stat_fields

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 150
"""Seconds a server may take to answer (a Prefect server with PostgreSQL on 2 busy cores)."""
EXIT_S = 90
"""Seconds the entry point may take to stop its servers and exit after the signal."""


def _alive(pids: set[int]) -> list[int]:
    """The processes of `pids` still running (a zombie has ended: only its entry is left)."""
    return sorted(p for p in pids if (fields := stat_fields(p)) is not None and fields[0] != "Z")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _prefect_health(pids: set[int]) -> str | None:
    """The health URL of the `python -m prefect server start --port N` among `pids`, if any."""
    for pid in pids:
        argv = _cmdline(pid)
        if argv[1:5] == ["-m", "prefect", "server", "start"] and "--port" in argv:
            return f"http://{HOST}:{argv[argv.index('--port') + 1]}/api/health"
    return None


def _stop_and_check(command: list[str], tmp_path: Path,
                    health: Callable[[set[int]], str | None], sig: signal.Signals,
                    ready: Callable[[set[int]], bool] = lambda _: True) -> None:
    """Start `command`; once the URL that `health(pids)` names answers and `ready(pids)` (`pids`:
    the processes below it so far), send `sig`; assert that it exits and leaves none of the
    processes it started, and that the URL no longer answers."""
    log = tmp_path / "entry.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("PREFECT_API_URL", None)
    with log.open("wb") as out:
        job = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            seen |= set(descendants(job.pid))
            url = health(seen)
            if url and answers(url, timeout_s=2) and ready(seen):
                break
            assert job.poll() is None, f"exited with {job.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no server answered:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        if sig == signal.SIGINT:
            os.killpg(job.pid, sig)  # Ctrl-C reaches the terminal's foreground process group
        else:
            job.send_signal(sig)  # `kill PID`: the entry point alone
        deadline = time.monotonic() + EXIT_S
        while job.poll() is None:
            seen |= set(descendants(job.pid))  # what it starts while stopping counts too
            assert time.monotonic() < deadline, f"still running {EXIT_S} s after {sig.name}"
            time.sleep(0.1)
        left = settled(lambda: _alive(seen))
        assert not left, (f"{sig.name} left {[' '.join(_cmdline(p))[:120] for p in left]} "
                          f"running:\n{log.read_text()[-3000:]}")
        assert not answers(url, timeout_s=2)
    finally:
        for pid in [job.pid, *_alive(seen)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.wait()


SLEEPING_SERVER = """import sys, time
from brorl.system.servers import running
command = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", sys.argv[1]]
with running(command, f"http://127.0.0.1:{sys.argv[1]}/", timeout_s=30, grace_s=5):
    time.sleep(300)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_script_inside_servers_running_stops_its_server_on_the_signal(tmp_path, sig):
    port = free_port()
    command = [sys.executable, "-c", SLEEPING_SERVER, str(port)]
    _stop_and_check(command, tmp_path, lambda _: f"http://{HOST}:{port}/", sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_the_server_command_stops_prefect_postgres_and_its_command_on_the_signal(tmp_path, sig):
    port = free_port()
    command = [sys.executable, "-m", "commands.server", "--home", str(tmp_path / "prefect"),
               "--port", str(port), "--", "sleep", "300"]
    # ready once the foreground command runs too
    _stop_and_check(command, tmp_path, lambda _: f"http://{HOST}:{port}/api/health", sig,
                    ready=lambda pids: any(_cmdline(p)[:1] == ["sleep"] for p in pids))


@pytest.mark.parametrize("sig", [signal.SIGTERM,
                                 pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=lambda s: s.name)
def test_the_prefect_overhead_benchmark_stops_its_server_on_the_signal(tmp_path, sig):
    # SIGINT to the group (slow: another minute of make test) is the servers' own path, checked
    # on commands.server above; the benchmark adds its per-configuration child, which SIGTERM
    # to the entry point alone checks
    # so many iterations that it is stopped long before it could write benchmarks/results/
    command = [sys.executable, "benchmarks/prefect_overhead.py", "-k", "100000",
               "--configs", "lean-sqlite"]
    _stop_and_check(command, tmp_path, _prefect_health, sig)


def test_the_mlflow_ui_command_stops_its_server_on_sigterm(tmp_path):
    port = free_port()
    command = [sys.executable, "-m", "commands.mlflow_ui", "--port", str(port),
               "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
               "--artifacts-destination", str(tmp_path / "mlartifacts")]
    _stop_and_check(command, tmp_path, lambda _: f"http://{HOST}:{port}/health", signal.SIGTERM)


def _temporary_prefect_health(pids: set[int]) -> str | None:
    """The health URL of the temporary Prefect server (`uvicorn ... prefect.server.api.server`)
    that a flow run started without PREFECT_API_URL, if it runs among `pids`."""
    for pid in pids:
        argv = _cmdline(pid)
        if "prefect.server.api.server:create_app" in argv and "--port" in argv:
            return f"http://{HOST}:{argv[argv.index('--port') + 1]}/api/health"
    return None


def test_a_flow_run_alone_stops_its_temporary_prefect_server_on_sigterm(tmp_path):
    # the simulator at paper size runs long enough to be stopped mid-flow; its outputs go to tmp
    command = [sys.executable, "-m", "commands.cli", "simulate", "--params", "params/simulate.yaml",
               "-S", f"tracking.output_dir={tmp_path / 'out'}",
               "-S", f"tracking.metrics_dir={tmp_path / 'metrics'}",
               "-S", f"tracking.plots_dir={tmp_path / 'plots'}",
               "-S", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    _stop_and_check(command, tmp_path, _temporary_prefect_health, signal.SIGTERM)
