"""Local server processes on 127.0.0.1: free ports, start, wait until healthy, always stop.

The one home of process plumbing: the Prefect server (`commands/server.py`), the MLflow UI
(`commands/mlflow_ui.py`) and the trainer's single-process rendezvous port all use it. A server
is a command started in its own session (`start_new_session=True`), so that stopping it signals
its whole process group (uvicorn workers, gunicorn, ...): SIGTERM, then SIGKILL after a grace
period.
`running` refuses a port that already answers, since a health check would then see another server.

Deliberately ignored: remote hosts, TLS, restarting a server that dies, Windows (process groups
are POSIX). This module imports no prefect, mlflow or dvc; it only starts subprocesses.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on HOST that nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something already accepts connections on HOST:`port`."""
    with socket.socket() as sock:
        return sock.connect_ex((HOST, port)) == 0


def start(command: Sequence[str], *, env: Mapping[str, str] | None = None,
          log: Path | None = None) -> subprocess.Popen:
    """Start `command` in a new session (its own process group); returns at once.

    Output (stdout and stderr) is appended to `log`, else it goes to the console.
    """
    if log is None:
        return subprocess.Popen(list(command), env=env, start_new_session=True)
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(list(command), env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def answers(url: str, timeout_s: float = 5.0) -> bool:
    """Whether a GET of `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return reply.status == 200
    except (OSError, http.client.HTTPException):  # refused, reset, timed out, 4xx/5xx
        return False


def _tail(log: Path | None, chars: int = 3000) -> str:
    if log is None or not log.exists():
        return "(its output went to the console)"
    return log.read_text(errors="replace")[-chars:]


def wait_healthy(process: subprocess.Popen, health_url: str, *, timeout_s: float = 180.0,
                 log: Path | None = None) -> None:
    """Block until `health_url` answers 200; raise RuntimeError (with the log's tail) if the
    process exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not answers(health_url):
        if process.poll() is not None:
            command = " ".join(map(str, process.args[:5]))
            raise RuntimeError(f"`{command}` exited with code {process.returncode} before "
                               f"{health_url} answered:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{health_url} did not answer within {timeout_s:.0f} s:\n{_tail(log)}")
        time.sleep(0.2)


def stop(process: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group of `process`, SIGKILL it after `grace_s`; returns once no process
    of the group is left (or 5 s after SIGKILL) and the leader is reaped."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait_s
        try:
            os.killpg(process.pid, sig)
            while time.monotonic() < deadline:
                process.poll()  # reap the leader, else its zombie keeps the group "alive"
                os.killpg(process.pid, 0)
                time.sleep(0.1)
        except ProcessLookupError:
            break  # the whole group is gone
    process.wait()


@contextmanager
def running(command: Sequence[str], health_url: str, *, env: Mapping[str, str] | None = None,
            log: Path | None = None, timeout_s: float = 180.0,
            grace_s: float = 15.0) -> Iterator[subprocess.Popen]:
    """`command` as a server for the `with` block, yielded once `health_url` answers 200; its
    process group is stopped on the way out, whatever happens (`stop`)."""
    port = urllib.parse.urlsplit(health_url).port
    if port is not None and port_in_use(port):
        raise RuntimeError(f"port {port} on {HOST} is already in use: pick another port "
                           "(or stop what holds it).")
    process = start(command, env=env, log=log)
    try:
        wait_healthy(process, health_url, timeout_s=timeout_s, log=log)
        yield process
    finally:
        stop(process, grace_s)
