"""The MLflow server on 127.0.0.1 lists both arms and headless Chromium renders their metric charts.

The runs are the CI pipeline's (`ci_pipeline` in conftest.py: dvc repro in a temporary clone).
Needs Debian's `chromium` (scripts/install_chromium.sh, run by `make test`; driven by
tests/browser.py); without it the test fails and says so. About 40 s: the server starts in
10-20 s, each page renders in 5-15 s.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from commands.mlflow_ui import search_runs, serve
from tests.browser import capture_run_comparison, find_chromium, line_colours, pixels_near
from tracking import RUN_COLOURS

ARMS = ("prorl-ci", "brorl-ci")  # the CI pipeline's arm runs (params/prorl_ci.yaml, brorl_ci.yaml)
# early in the views' (alphabetical) order: charts and rows far below the window stay unrendered
METRICS = ("diag/heldout/pct_improved", "diag/heldout/q_pos")
WINDOW = (1600, 2000)  # capture_page's default screenshot size


def _assert_real_screenshot(png: Path) -> None:
    """A PNG of the window's size that is not a blank page."""
    assert png.exists() and png.stat().st_size > 20_000, f"{png} is missing or tiny"
    image = Image.open(png)
    image.load()
    assert image.size == WINDOW
    assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 200, f"{png} looks blank"


@pytest.mark.slow  # chromium is installed by make test-all only
def test_chromium_is_installed() -> None:
    try:
        find_chromium()
    except FileNotFoundError as error:
        pytest.fail(str(error))


@pytest.mark.slow  # the MLflow UI rendered in chromium (installed by make test-all)
def test_server_lists_both_arms_and_renders_their_metric_charts(ci_arms_updated: Path,
                                                               tmp_path: Path) -> None:
    """The CI pipeline's own runs (conftest `ci_pipeline`), served from its MLflow store; both
    arms updated their weights (conftest `ci_arms_updated` fails otherwise), so both logged the
    `diag/*` metrics drawn here."""
    ci_pipeline = ci_arms_updated
    mlflow_uri = f"sqlite:///{ci_pipeline / 'mlflow.db'}"
    experiment_id = MlflowClient(mlflow_uri).get_experiment_by_name("brorl").experiment_id

    with serve(mlflow_uri, log_path=tmp_path / "mlflow-server.log") as server:
        assert server.url.startswith("http://127.0.0.1:")
        runs = search_runs(server.url, [experiment_id])
        run_ids = {run["info"]["run_name"]: run["info"]["run_id"] for run in runs}
        assert set(ARMS) <= set(run_ids), sorted(run_ids)  # both arms, among the pipeline's runs
        run_names = {run_ids[arm]: arm for arm in ARMS}
        shared = set.intersection(*({m["key"] for m in run["data"].get("metrics", [])}
                                    for run in runs if run["info"]["run_name"] in ARMS))
        assert set(METRICS) <= shared
        pages = capture_run_comparison(server.url, experiment_id, run_names, METRICS, tmp_path / "ui")

    # The server's whole process group is gone and the port no longer answers.
    assert server.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(server.process.pid, 0)
    with pytest.raises((urllib.error.URLError, OSError)):
        urllib.request.urlopen(f"{server.url}/health", timeout=5)

    compare, charts = pages["compare"], pages["charts"]
    assert compare.png.parent == tmp_path / "ui" and charts.png.parent == tmp_path / "ui"
    # Compare-runs page: header, both run names, every metric in the metrics table, and the
    # parallel-coordinates chart (plotly) with a metric axis.
    assert "Comparing 2 Runs from 1 Experiment" in compare.text
    for arm in ARMS:
        assert arm in compare.text.split()
    for metric in METRICS:
        assert metric in compare.text
    assert "pcp-plot" in compare.html
    axes = re.findall(r'class="axis-title"[^>]*data-unformatted="([^"]+)"', compare.html)
    assert shared & set(axes), f"no metric axis in the parallel-coordinates chart: {axes}"
    # Chart view: one line chart per metric, whose legend names each arm's trace "arm (metric)".
    for arm in ARMS:
        for metric in METRICS:
            assert f"{arm} ({metric})" in charts.text, f"no {arm} trace in the {metric} chart: {charts.text}"
    assert charts.html.count("js-plotly-plot") >= len(METRICS)

    _assert_real_screenshot(compare.png)
    _assert_real_screenshot(charts.png)
    # Each arm's line is drawn in its own colour (its `mlflow.runColor` tag, tracking/__init__.py;
    # at full opacity in the SVG) and painted in the screenshot.
    colours = line_colours(charts.html)
    arm_colours = {tuple(int(hex_[i:i + 2], 16) for i in (1, 3, 5))
                   for hex_ in RUN_COLOURS.values()}
    assert arm_colours <= colours, f"expected the arms' colours {arm_colours}, found {colours}"
    for rgb in colours:
        assert pixels_near(charts.png, rgb) > 50, f"no pixels of line colour rgb{rgb} in {charts.png}"


def test_a_busy_port_is_one_line_naming_it_and_the_fix(capsys) -> None:
    import socket

    from brorl.system.servers import HOST, free_port
    from commands import mlflow_ui

    with socket.socket() as taken:
        port = free_port()
        taken.bind((HOST, port))
        taken.listen()
        with pytest.raises(SystemExit) as exit_info:
            mlflow_ui.main(["--port", str(port)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(port) in err and "make ui PORT=" in err


@pytest.mark.parametrize(("target", "given", "port"), [
    ("ui", [], 5000), ("ui", ["PORT=5001"], 5001), ("serve", [], 4200),
    ("serve", ["PORT=4300"], 4300)])
def test_make_ui_and_serve_take_port_with_defaults_of_their_own(target, given, port) -> None:
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "MAKEFLAGS")}
    shown = subprocess.run(["make", "-n", target, *given], cwd=Path(__file__).parents[1], env=env,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    server = "commands.mlflow_ui" if target == "ui" else "commands.server"
    assert any(server in line and f"--port {port}" in line for line in shown), shown
