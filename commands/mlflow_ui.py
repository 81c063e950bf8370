"""MLflow UI: serve a store on 127.0.0.1 (`make ui`) and the URLs of its run-comparison pages.

`serve` runs `mlflow server` (UI + REST API) through `brorl.system.servers.running`: its own process
group, ready once `/health` answers, the whole group stopped on exit, SIGTERM and Ctrl-C
included; `make ui` runs it in the foreground (`python -m commands.mlflow_ui`). Two pages
compare runs: `compare_runs_url` (MLflow's "Comparing N Runs" page: a parallel-coordinates
chart, run/param/metric tables) and
`run_charts_url` (the experiment's chart view filtered to the runs: one line chart per metric,
one trace per run); tests/browser.py renders them in headless Chromium.
Deliberately ignored: authentication, remote stores, artifact proxying beyond a local folder.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from brorl.system.checkout import CheckoutError, find_root
from brorl.system.environment import apply_defaults, with_defaults
from brorl.system.servers import HOST, Terminated, free_port, port_in_use, running
from tracking import resolve_tracking_uri


@dataclass(frozen=True)
class Server:
    """A running `mlflow server`: its base URL (no trailing slash) and process-group leader."""

    url: str
    process: subprocess.Popen


def artifacts_dir_for(tracking_uri: str) -> Path:
    """`mlartifacts/` beside a SQLite store (as `tracking.ensure_experiment` lays it out)."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts"
    return find_root() / "mlartifacts"


def server_command(tracking_uri: str, artifacts_dir: Path, port: int, workers: int = 1) -> list[str]:
    """`mlflow server` on 127.0.0.1 with a SQL store; artifacts proxied from a local folder."""
    return [sys.executable, "-m", "mlflow", "server", "--host", HOST, "--port", str(port),
            "--backend-store-uri", tracking_uri, "--artifacts-destination", str(artifacts_dir),
            "--workers", str(workers)]


@contextmanager
def serve(tracking_uri: str, artifacts_dir: Path | None = None, port: int | None = None,
          log_path: Path | None = None, startup_timeout_s: float = 180.0) -> Iterator[Server]:
    """Run `mlflow server` on 127.0.0.1 until the block ends; yields once `/health` answers.

    Output goes to `log_path` (else the console). Startup takes 10-20 s on 2 busy cores.
    """
    port = port or free_port()
    artifacts_dir = artifacts_dir or artifacts_dir_for(tracking_uri)
    # Job execution (GenAI scorers) would start seven huey worker processes we never use.
    env = {**with_defaults(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    url = f"http://{HOST}:{port}"
    with running(server_command(tracking_uri, artifacts_dir, port), f"{url}/health", env=env,
                 log=log_path, timeout_s=startup_timeout_s) as process:
        yield Server(url, process)


def search_runs(base_url: str, experiment_ids: Sequence[str]) -> list[dict]:
    """The runs of these experiments as the server's REST API lists them (`runs/search`)."""
    body = json.dumps({"experiment_ids": list(experiment_ids), "max_results": 1000}).encode()
    request = urllib.request.Request(f"{base_url}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.load(reply).get("runs", [])


def compare_runs_url(base_url: str, experiment_id: str, run_ids: Sequence[str]) -> str:
    """MLflow's run-comparison page (the route the UI's "Compare" button opens)."""
    query = {"runs": json.dumps(list(run_ids)), "experiments": json.dumps([experiment_id])}
    return f"{base_url}/#/compare-runs?{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}"


def run_charts_url(base_url: str, experiment_id: str, run_ids: Sequence[str]) -> str:
    """The experiment's chart view (one line chart per metric) filtered to `run_ids`."""
    ids = ", ".join(f"'{run_id}'" for run_id in run_ids)
    query = {"searchFilter": f"attributes.run_id IN ({ids})", "compareRunsMode": "CHART"}
    return (f"{base_url}/#/experiments/{experiment_id}/runs?"
            f"{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}")


def main(argv: list[str] | None = None) -> None:
    """`make ui`: serve the checkout's store on 127.0.0.1 in the foreground until Ctrl-C."""
    try:
        apply_defaults()
    except CheckoutError as err:
        raise SystemExit(f"error: {err}") from None
    parser = argparse.ArgumentParser(prog="python -m commands.mlflow_ui",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=5000, help="default 5000 (make ui PORT=...)")
    parser.add_argument("--backend-store-uri", default=None,
                        help="default: $MLFLOW_TRACKING_URI, else the project's mlflow.db")
    parser.add_argument("--artifacts-destination", type=Path, default=None,
                        help="default: mlartifacts/ beside the SQLite store")
    args = parser.parse_args(argv)
    if port_in_use(args.port):  # one line, not the server's traceback 20 s later
        print(f"error: port {args.port} on {HOST} is already in use (another MLflow UI?); pick "
              "another one: make ui PORT=5001 (python -m commands.mlflow_ui --port 5001).",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        uri = args.backend_store_uri or resolve_tracking_uri()
    except CheckoutError as err:
        raise SystemExit(f"error: {err}") from None
    # Ctrl-C or `kill` leave through `serve`'s cleanup (`brorl.system.servers.launched`), even if the
    # shell started us with SIGINT ignored.
    try:
        with serve(uri, args.artifacts_destination, args.port) as server:
            print(f"MLflow UI for {uri} at {server.url} (Ctrl-C stops it)", flush=True)
            server.process.wait()
    except Terminated:
        raise SystemExit(128 + signal.SIGTERM) from None
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
