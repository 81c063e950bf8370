"""MLflow UI: serve a store on 127.0.0.1 and capture its run-comparison pages in headless Chromium.

`serve` starts `mlflow server` (UI + REST API) in its own process group, waits for `/health`
and kills the whole group on exit; `make ui` runs it in the foreground (`python -m
tasks.mlflow_ui`). `capture_page` loads a UI page in Debian's `chromium` (installed by
`scripts/install_chromium.sh`, which `make test` runs), saves a PNG and returns the DOM after the
page's JavaScript ran. Two pages compare runs: `compare_runs_url` (MLflow's "Comparing N Runs"
page: a parallel-coordinates chart, run/param/metric tables) and `run_charts_url` (the experiment's
chart view filtered to the runs: one line chart per metric, one trace per run).
Deliberately ignored: authentication, remote stores, artifact proxying beyond a local folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
from PIL import Image

from tasks.tracking import ROOT, resolve_tracking_uri

HOST = "127.0.0.1"
INSTALL_HINT = "run scripts/install_chromium.sh (make test does it) to install Debian's chromium"
_LINE_STROKE = re.compile(r'class="js-line"[^>]*stroke: rgb\((\d+), (\d+), (\d+)\); stroke-opacity: 1;')


@dataclass(frozen=True)
class Server:
    """A running `mlflow server`: its base URL (no trailing slash) and process-group leader."""

    url: str
    process: subprocess.Popen


@dataclass(frozen=True)
class PageCapture:
    """One page as headless Chromium rendered it: the PNG, the DOM (HTML) and its visible text."""

    url: str
    png: Path
    html: str
    text: str


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def artifacts_dir_for(tracking_uri: str) -> Path:
    """`mlartifacts/` beside a SQLite store (as `tracking.ensure_experiment` lays it out)."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts"
    return ROOT / "mlartifacts"


def server_command(tracking_uri: str, artifacts_dir: Path, port: int, workers: int = 1) -> list[str]:
    """`mlflow server` on 127.0.0.1 with a SQL store; artifacts proxied from a local folder."""
    return [sys.executable, "-m", "mlflow", "server", "--host", HOST, "--port", str(port),
            "--backend-store-uri", tracking_uri, "--artifacts-destination", str(artifacts_dir),
            "--workers", str(workers)]


def _stop(process: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group (mlflow's CLI, uvicorn), SIGKILL it after `grace_s`; returns
    once no process of the group is left (or 5 s after SIGKILL)."""
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


def _tail(path: Path | None, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path and path.exists() else "(log on the console)"


def _wait_healthy(server: Server, log_path: Path | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {server.process.returncode}:\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"mlflow server at {server.url} not healthy after {timeout_s:.0f} s:\n"
                       f"{_tail(log_path)}")


@contextmanager
def serve(tracking_uri: str, artifacts_dir: Path | None = None, port: int | None = None,
          log_path: Path | None = None, startup_timeout_s: float = 180.0) -> Iterator[Server]:
    """Run `mlflow server` on 127.0.0.1 until the block ends; yields once `/health` answers.

    Output goes to `log_path` (else the console). Startup takes 10-20 s on 2 busy cores.
    """
    port = port or free_port()
    artifacts_dir = artifacts_dir or artifacts_dir_for(tracking_uri)
    # Job execution (GenAI scorers) would start seven huey worker processes we never use.
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed in finally)
    try:
        process = subprocess.Popen(server_command(tracking_uri, artifacts_dir, port), env=env,
                                   stdout=log, stderr=subprocess.STDOUT if log else None,
                                   start_new_session=True)
        server = Server(f"http://{HOST}:{port}", process)
        try:
            _wait_healthy(server, log_path, startup_timeout_s)
            yield server
        finally:
            _stop(process)
    finally:
        if log:
            log.close()


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


def find_chromium() -> str:
    """The `chromium` executable, or an error that says how to install it."""
    found = shutil.which("chromium")
    if found is None:
        raise FileNotFoundError(f"no `chromium` on PATH: {INSTALL_HINT}")
    return found


class _TextParser(HTMLParser):
    """Visible text of an HTML document: everything outside <script>, <style> and <noscript>."""

    _HIDDEN = {"script", "style", "noscript"}

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self._HIDDEN:
            self._hidden += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self._HIDDEN and self._hidden:
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self._hidden and data.strip():
            self.parts.append(data.strip())


def page_text(html: str) -> str:
    """The visible text of a rendered DOM, one space between text nodes."""
    parser = _TextParser()
    parser.feed(html)
    return " ".join(parser.parts)


def _render(url: str, png: Path, window: tuple[int, int], budget_ms: int, timeout_s: float) -> PageCapture:
    """One headless Chromium run: screenshot to `png` and the DOM after `budget_ms` virtual ms.

    No GPU: the parallel-coordinates chart is WebGL, so software WebGL (SwiftShader) is opted in.
    """
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        command = [find_chromium(), "--headless", "--disable-gpu", "--enable-unsafe-swiftshader",
                   "--no-sandbox", "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
                   f"--window-size={window[0]},{window[1]}", f"--virtual-time-budget={budget_ms}",
                   f"--screenshot={png}", "--dump-dom", url]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=True)
        try:
            html, errors = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(process, grace_s=2.0)
            raise TimeoutError(f"chromium did not finish {url} in {timeout_s:.0f} s") from None
    if process.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium failed ({process.returncode}) on {url}:\n{errors.decode()[-3000:]}")
    html_text = html.decode(errors="replace")
    return PageCapture(url, png, html_text, page_text(html_text))


def capture_page(url: str, png: Path, expect: Sequence[str] = (), window: tuple[int, int] = (1600, 2000),
                 budgets_ms: Sequence[int] = (30_000, 60_000, 120_000),
                 timeout_s: float = 180.0) -> PageCapture:
    """Load `url` in headless Chromium, save a PNG screenshot and return the DOM after JavaScript.

    `--virtual-time-budget` lets the page run that many virtual ms before the capture. Charts
    fetch their data late (a 20 s budget often catches spinners), so while any `expect` string is
    missing from the page text the page is loaded again with the next, larger budget; the last
    capture is returned either way and the caller asserts on it.
    """
    png.parent.mkdir(parents=True, exist_ok=True)
    for budget_ms in budgets_ms:
        capture = _render(url, png, window, budget_ms, timeout_s)
        if all(text in capture.text for text in expect):
            break
    return capture


def capture_run_comparison(base_url: str, experiment_id: str, run_names: Mapping[str, str],
                           metrics: Sequence[str], out_dir: Path) -> dict[str, PageCapture]:
    """Both comparison pages of the runs `{run_id: run_name}`: `compare.png` and `charts.png`.

    Each page is captured once it shows what a rendered page must: the compare-runs page every
    run name and metric, the chart view a legend entry `run_name (metric)` per run and metric.
    `metrics` should be few and early in the chart view: charts far below the window stay unrendered.
    """
    run_ids = list(run_names)
    names = list(run_names.values())
    return {
        "compare": capture_page(compare_runs_url(base_url, experiment_id, run_ids),
                                out_dir / "compare.png", expect=[*names, *metrics]),
        "charts": capture_page(run_charts_url(base_url, experiment_id, run_ids), out_dir / "charts.png",
                               expect=[f"{name} ({metric})" for name in names for metric in metrics]),
    }


def line_colours(html: str) -> set[tuple[int, int, int]]:
    """The RGB colours of the chart lines (plotly `js-line` paths at full opacity) in a DOM."""
    return {(int(r), int(g), int(b)) for r, g, b in _LINE_STROKE.findall(html)}


def pixels_near(png: Path, rgb: tuple[int, int, int], tol: int = 12) -> int:
    """How many pixels of the image lie within `tol` of `rgb` in every channel."""
    pixels = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    return int((np.abs(pixels - np.array(rgb)) <= tol).all(axis=-1).sum())


def main(argv: list[str] | None = None) -> None:
    """`make ui`: serve the project's store on 127.0.0.1 in the foreground until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--backend-store-uri", default=None,
                        help="default: $MLFLOW_TRACKING_URI, else the project's mlflow.db")
    parser.add_argument("--artifacts-destination", type=Path, default=None,
                        help="default: mlartifacts/ beside the SQLite store")
    args = parser.parse_args(argv)
    uri = args.backend_store_uri or resolve_tracking_uri()
    # Ctrl-C or `kill` leave through `serve`'s cleanup, even if the shell started us with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        with serve(uri, args.artifacts_destination, args.port) as server:
            print(f"MLflow UI for {uri} at {server.url} (Ctrl-C stops it)", flush=True)
            server.process.wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
