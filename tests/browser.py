"""Test helper: render MLflow UI pages in headless Chromium and read the result (DOM, text, pixels).

`capture_page` loads a page in Debian's `chromium` (installed by `scripts/install_chromium.sh`,
which `make test` runs), saves a PNG and returns the DOM after the page's JavaScript ran;
`capture_run_comparison` does so for both run-comparison pages of `commands.mlflow_ui`.
`page_text`, `line_colours` and `pixels_near` read a capture. Used by tests/test_mlflow_ui.py only.
Deliberately ignored: other browsers, interaction with the page (clicks, scrolling).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
from PIL import Image

from brorl.system.servers import stop
from commands.mlflow_ui import compare_runs_url, run_charts_url

INSTALL_HINT = "run scripts/install_chromium.sh (make test does it) to install Debian's chromium"
_LINE_STROKE = re.compile(r'class="js-line"[^>]*stroke: rgb\((\d+), (\d+), (\d+)\); stroke-opacity: 1;')


@dataclass(frozen=True)
class PageCapture:
    """One page as headless Chromium rendered it: the PNG, the DOM (HTML) and its visible text."""

    url: str
    png: Path
    html: str
    text: str


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
            stop(process, grace_s=2.0)
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
