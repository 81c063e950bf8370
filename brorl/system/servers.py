"""Local server processes on 127.0.0.1: free ports, start, wait until healthy, always stop.

The one home of process plumbing: the Prefect server and its PostgreSQL (`commands/server.py`),
the MLflow UI (`commands/mlflow_ui.py`), the benchmarks that start them and the trainer's
single-process rendezvous port all use it. A server is a command started in its own session
(`start_new_session=True`), so that stopping it signals its whole process group (uvicorn workers,
gunicorn, ...): SIGTERM, then SIGKILL after a grace period.
`running` refuses a port that already answers, since a health check would then see another server.

Stopping on signals lives here too. A server's session does not get the Ctrl-C of our terminal,
and SIGTERM (`kill`, a CI job's timeout) kills Python without running `finally` clauses; so while
a server runs (`launched`), `interrupts` turns SIGTERM into `Terminated`, a KeyboardInterrupt, and
Ctrl-C into KeyboardInterrupt even where the shell started us with SIGINT ignored, and both leave
through the `finally` that stops the server. `stop` holds those signals back until it is done, so
a second Ctrl-C cannot cut it short. A command that starts servers in turn runs under
`run_in_session`, which passes the signal on to it and waits for it to stop them.

Deliberately ignored: remote hosts, TLS, restarting a server that dies, Windows (process groups
are POSIX). This module imports no prefect, mlflow or dvc; it only starts subprocesses.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

HOST = "127.0.0.1"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop a process which runs servers: `kill` (or a job's timeout) and Ctrl-C."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt (`interrupts`), so that both leave
    through the same `finally` clauses; `except KeyboardInterrupt` catches both."""

    signum = signal.SIGTERM


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _swap_handlers(handlers: Mapping[int, Callable | int]) -> dict[int, Callable | int | None]:
    """Install `handlers` (signal -> handler) in the main thread; the previous ones."""
    previous = {}
    for signum, handler in handlers.items():
        previous[signum] = signal.getsignal(signum)
        signal.signal(signum, handler)
    return previous


def _restore(previous: Mapping[int, Callable | int | None]) -> None:
    for signum, handler in previous.items():
        if handler is not None:  # None: set outside Python, which cannot put it back
            signal.signal(signum, handler)


@contextmanager
def interrupts() -> Iterator[None]:
    """For the `with` block, SIGTERM raises `Terminated` and SIGINT KeyboardInterrupt, whatever
    handlers were there (even SIG_IGN, as a shell leaves it for `command &`); the previous handlers
    come back afterwards. Nests. Outside the main thread, where Python runs no signal handler and
    cannot set one, it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = _swap_handlers({signal.SIGTERM: _terminated,
                               signal.SIGINT: signal.default_int_handler})
    try:
        yield
    finally:
        _restore(previous)


@contextmanager
def _held() -> Iterator[None]:
    """SIGTERM and SIGINT wait until the block ends and are then raised again, to the handlers that
    were there: a stop that has begun finishes (in the main thread; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = _swap_handlers(dict.fromkeys(STOP_SIGNALS,
                                            lambda signum, frame: received.append(signum)))
    try:
        yield
    finally:
        _restore(previous)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)


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
    of the group is left (or 5 s after SIGKILL) and the leader is reaped. SIGTERM and Ctrl-C to
    this process wait until then (`_held`)."""
    with _held():
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
def launched(command: Sequence[str], *, env: Mapping[str, str] | None = None,
             log: Path | None = None, grace_s: float = 15.0) -> Iterator[subprocess.Popen]:
    """`command` started (`start`) for the `with` block and its process group stopped on the way
    out (`stop`), on SIGTERM and Ctrl-C too (`interrupts`): every server starts here."""
    with interrupts():
        process = None
        try:
            process = start(command, env=env, log=log)
            yield process
        finally:
            if process is not None:
                stop(process, grace_s)


@contextmanager
def running(command: Sequence[str], health_url: str, *, env: Mapping[str, str] | None = None,
            log: Path | None = None, timeout_s: float = 180.0,
            grace_s: float = 15.0) -> Iterator[subprocess.Popen]:
    """`command` as a server for the `with` block, yielded once `health_url` answers 200; its
    process group is stopped on the way out, whatever happens, SIGTERM included (`launched`)."""
    port = urllib.parse.urlsplit(health_url).port
    if port is not None and port_in_use(port):
        raise RuntimeError(f"port {port} on {HOST} is already in use: pick another port "
                           "(or stop what holds it).")
    with launched(command, env=env, log=log, grace_s=grace_s) as process:
        wait_healthy(process, health_url, timeout_s=timeout_s, log=log)
        yield process


def run_in_session(command: Sequence[str], *, env: Mapping[str, str] | None = None,
                   cwd: Path | None = None, capture: bool = False,
                   grace_s: float = 30.0) -> subprocess.CompletedProcess:
    """Run `command` to its end in a session of its own (its output captured as text if
    `capture`). SIGTERM or Ctrl-C here is passed on to its whole group as the same signal, which
    gets `grace_s` to stop what it started before SIGKILL, and is then raised here as
    KeyboardInterrupt (`Terminated` for SIGTERM).

    For a command that starts servers: under `subprocess.run` it would outlive a SIGTERM to us,
    and Ctrl-C would SIGKILL it 0.25 s later, before it stopped them.
    """
    pipe = subprocess.PIPE if capture else None
    with interrupts():
        process = subprocess.Popen(list(command), env=env, cwd=cwd, stdout=pipe, stderr=pipe,
                                   text=capture, start_new_session=True)
        try:
            out, err = process.communicate()
        except KeyboardInterrupt as interrupt:
            with _held():
                try:
                    os.killpg(process.pid, getattr(interrupt, "signum", signal.SIGINT))
                    process.communicate(timeout=grace_s)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
                stop(process, grace_s=5.0)  # what is left of its group
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)
