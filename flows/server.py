"""A local Prefect server on 127.0.0.1: start it, wait until it answers, stop it.

`python -m flows.server --port 4200` runs the server until Ctrl-C. With a command after `--`
(`python -m flows.server --port 4200 -- python -m flows.deploy --params params/prorl.yaml`) the
server runs in the background, the command in the foreground with `PREFECT_API_URL` pointing at
the server, and the server stops when the command ends or on Ctrl-C: `make serve` and `brorl serve`.

The server's database lives in PREFECT_HOME (default `.cache/prefect`, set by `flows/__init__.py`);
analytics are off. This module imports no prefect: the server is a child process in its own
session, stopped as a process group so that its uvicorn workers go with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

HOST = "127.0.0.1"


def api_url(port: int) -> str:
    """The Prefect API address of a server on this host and `port`."""
    return f"http://{HOST}:{port}/api"


def is_healthy(port: int) -> bool:
    """Whether a Prefect server answers its health check on `port`."""
    try:
        with urllib.request.urlopen(f"{api_url(port)}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def port_in_use(port: int) -> bool:
    """Whether something already listens on HOST:`port`."""
    with socket.socket() as sock:
        return sock.connect_ex((HOST, port)) == 0


def start(port: int, home: Path | None = None, log: IO[str] | None = None) -> subprocess.Popen:
    """Start `prefect server start` on HOST:`port` (returns at once; see `wait_healthy`)."""
    if port_in_use(port):
        raise RuntimeError(f"port {port} on {HOST} is already in use; pick another with --port "
                           "(or stop what holds it).")
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true"}
    env.pop("PREFECT_API_URL", None)  # the server must not try to reach another one
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", HOST,
               "--port", str(port)]
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT if log else None,
                            start_new_session=True)


def wait_healthy(port: int, process: subprocess.Popen, timeout_s: float = 180) -> None:
    """Block until the server on `port` answers; raise if it exits or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not is_healthy(port):
        if process.poll() is not None:
            raise RuntimeError(f"the Prefect server exited with code {process.returncode} "
                               "before answering; see its log above.")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Prefect server on port {port} did not answer within "
                               f"{timeout_s:.0f} s.")
        time.sleep(0.5)


def stop(process: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM the process group of `process`, then SIGKILL what is left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def running(port: int, home: Path | None = None, log: IO[str] | None = None,
            timeout_s: float = 180) -> Iterator[str]:
    """A server on `port` for the `with` block; yields its API URL and always stops it."""
    process = start(port, home, log)
    try:
        wait_healthy(port, process, timeout_s)
        yield api_url(port)
    finally:
        stop(process)


def _run_foreground(command: list[str], url: str) -> int:
    """Run `command` with PREFECT_API_URL=`url`; SIGTERM is passed on, Ctrl-C reaches it directly."""
    child = subprocess.Popen(command, env={**os.environ, "PREFECT_API_URL": url})
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())  # `prefect serve` stops cleanly
    try:
        return child.wait()
    except KeyboardInterrupt:  # the terminal sent SIGINT to the child too
        try:
            return child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            return child.wait()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # SIGTERM takes the path of Ctrl-C: the server is stopped on the way out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.server", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=4200, help="port on 127.0.0.1 (default 4200)")
    parser.add_argument("--home", type=Path, default=None,
                        help="PREFECT_HOME of the server (default $PREFECT_HOME, .cache/prefect)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for startup")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="after `--`: a command to run in the foreground against the server")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with running(args.port, args.home, timeout_s=args.timeout) as url:
            print(f"Prefect server: {url} (UI http://{HOST}:{args.port})", flush=True)
            if command:
                return _run_foreground(command, url)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 130
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
