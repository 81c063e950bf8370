"""A local Prefect server on 127.0.0.1: start it, wait until it answers, stop it.

`python -m flows.server --port 4200` runs the server until Ctrl-C. With a command after `--`
(`python -m flows.server --port 4200 -- python -m flows.deploy --params params/prorl.yaml`) the
server runs in the background, the command in the foreground with `PREFECT_API_URL` pointing at
the server, and the server stops when the command ends or on Ctrl-C: `make serve` and `brorl serve`.

The server's database lives in PREFECT_HOME (default `.cache/prefect`, set by `flows/__init__.py`);
analytics are off. This module imports no prefect and holds only what is Prefect's (the command,
its environment, the API URL, the CLI); starting, health checks and stopping the process group,
uvicorn workers included, are `brorl.servers`'.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from brorl import servers
from brorl.servers import HOST


def api_url(port: int) -> str:
    """The Prefect API address of a server on this host and `port`."""
    return f"http://{HOST}:{port}/api"


def server_command(port: int) -> list[str]:
    """`prefect server start` on HOST:`port`."""
    return [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)]


def server_env(home: Path | None = None) -> dict[str, str]:
    """The server's environment: analytics off, its own PREFECT_HOME (created), no PREFECT_API_URL."""
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true"}
    env.pop("PREFECT_API_URL", None)  # the server must not try to reach another one
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    return env


@contextmanager
def running(port: int, home: Path | None = None, log: Path | None = None,
            timeout_s: float = 180) -> Iterator[str]:
    """A server on `port` for the `with` block; yields its API URL and always stops it.

    Its output is appended to `log` (else the console); startup takes 10-30 s on 2 busy cores.
    """
    with servers.running(server_command(port), f"{api_url(port)}/health", env=server_env(home),
                         log=log, timeout_s=timeout_s):
        yield api_url(port)


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
