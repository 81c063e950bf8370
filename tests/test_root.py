"""One checkout, one root (`brorl.system.checkout`): every entry point works in the checkout it is started
in, found from the working directory (or `$BRORL_ROOT`), never in the one the code is installed
from. Two clones share this virtualenv, whose editable install points at this checkout: a command
started in clone b reads b's params and writes into b, and clone a and this checkout stay as
they were."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from brorl.system.checkout import CheckoutError, find_root, in_checkout
from brorl.system.environment import defaults
from tests.conftest import clone_repository

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "brorl"
"""The installed `brorl` script: it imports this checkout's code, whatever the working folder."""

PROBE = {
    # a sweep small enough for a test: N = 4 only, 20 steps, one seed
    "params/root_probe.yaml": "extends: simulate_ci.yaml\nname: root-probe\n"
                              "simulate: {steps: 20, rollouts_per_prompt: [4], num_seeds: 1, "
                              "log_every: 10, report_steps: [10, 20]}\n"
                              "tracking: {experiment: root-probe, output_dir: outputs/root_probe, "
                              "metrics_dir: outputs/root_probe/metrics, "
                              "plots_dir: outputs/root_probe/plots}\n",
    # a run whose data the train stage's check looks for (and, never built, does not find)
    "params/root_probe_train.yaml": "extends: prorl_ci.yaml\nname: root-probe-train\n"
                                    "data: {path: outputs/root_probe/problems}\n",
}
"""Params files that only clone b has: a command that loads them read b's params."""


def child_env(**extra: str) -> dict[str, str]:
    """This environment without the defaults the test session applied for this checkout (the
    caches under its `.cache`), the store and server it chose, or PYTHONPATH: a child sets its
    own for the checkout it runs in."""
    drop = {*defaults({}, ROOT), "BRORL_ROOT", "MLFLOW_TRACKING_URI", "PREFECT_API_URL",
            "PYTHONPATH"}
    return {k: v for k, v in os.environ.items() if k not in drop} | {"OMP_NUM_THREADS": "1",
                                                                     **extra}


@pytest.fixture(scope="module")
def clones(tmp_path_factory) -> tuple[Path, Path]:
    """Clones a and b of this checkout (with its uncommitted files); the probe params in b only."""
    base = tmp_path_factory.mktemp("clones")
    a, b = clone_repository(base / "a"), clone_repository(base / "b")
    for name, text in PROBE.items():
        (b / name).write_text(text)
    return a, b


def run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=child_env(**env), capture_output=True, text=True,
                          timeout=300)


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` but .git: path -> (size, mtime)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file() and ".git" not in p.relative_to(folder).parts}


def experiments(store: Path) -> set[str]:
    if not store.is_file():
        return set()
    with sqlite3.connect(store) as db:
        return {name for (name,) in db.execute("SELECT name FROM experiments")}


def checked_data(command: list[str], cwd: Path, **env: str) -> str:
    """The data folder a command's check looked for (its one `error:` line: the probe's data is
    never built), as it named it."""
    out = run(command, cwd, **env)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr + out.stdout
    return lines[0].split()[1].rstrip(":")


def test_the_root_is_brorl_root_else_the_nearest_checkout_above_the_working_folder(tmp_path):
    outer, inner = tmp_path / "outer", tmp_path / "outer" / "docs" / "inner"
    for checkout in (outer, inner):
        (checkout / "params").mkdir(parents=True)
        (checkout / "dvc.yaml").write_text("stages: {}\n")
    (outer / "study").mkdir()
    (outer / "study" / "dvc.yaml").write_text("stages: {}\n")  # no params/: not a checkout
    assert find_root({}, outer / "study") == outer
    assert find_root({}, inner / "params") == inner  # the nearest one
    assert find_root({"BRORL_ROOT": str(outer)}, inner) == outer
    assert in_checkout("outputs/x", {"BRORL_ROOT": str(outer)}) == outer / "outputs/x"
    assert in_checkout(tmp_path / "abs", {}) == tmp_path / "abs"  # needs no checkout
    with pytest.raises(CheckoutError, match=r"not inside a brorl checkout .* cd into your "
                                            r"checkout, or set BRORL_ROOT"):
        find_root({}, tmp_path)
    with pytest.raises(CheckoutError, match=r"BRORL_ROOT=.* is not a brorl checkout"):
        find_root({"BRORL_ROOT": str(tmp_path)}, outer)


def test_the_script_and_python_m_check_the_files_of_the_checkout_they_run_in(clones):
    """Started in clone b (or a folder inside it, where `python -m` imports this checkout's code
    too), each entry point reads b's params and looks for b's data."""
    _, b = clones
    expected = str(b / "outputs/root_probe/problems")
    train = "params/root_probe_train.yaml"
    assert checked_data([str(SCRIPT), "train", "--params", train], b) == expected
    for program in (["commands.cli", "train"], ["brorl.train"]):
        assert checked_data([sys.executable, "-m", *program, "--params", f"../{train}"],
                            b / "docs") == expected


@pytest.mark.slow  # a Prefect flow run, about 30 s on two busy cores
def test_a_command_writes_into_the_checkout_it_runs_in_and_nowhere_else(clones, prefect_harness):
    """`brorl simulate` started in clone b: its report, headline, MLflow store and Prefect home
    are b's; clone a and this checkout get nothing."""
    from prefect.settings import PREFECT_API_URL

    a, b = clones
    before_a, store = tree(a), ROOT / "mlflow.db"
    assert "root-probe" not in experiments(store)
    train = [str(SCRIPT), "train", "--params", "params/root_probe_train.yaml"]
    assert checked_data(train, b).startswith(f"{b}/")  # else it would write elsewhere: stop here
    out = run([str(SCRIPT), "simulate", "--params", "params/root_probe.yaml"], b,
              PREFECT_API_URL=PREFECT_API_URL.value())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    written = b / "outputs" / "root_probe"
    assert (written / "simulate" / "results.md").is_file()
    assert (written / "metrics" / "simulate.json").is_file()
    assert any((written / "plots" / "simulate").iterdir())
    assert "root-probe" in experiments(b / "mlflow.db")
    assert (b / ".cache" / "prefect").is_dir()  # the environment defaults followed the checkout
    assert tree(a) == before_a
    assert not (ROOT / "outputs" / "root_probe").exists()
    assert "root-probe" not in experiments(store)


def test_outside_any_checkout_a_command_says_so_in_one_line_unless_brorl_root_names_one(
        clones, tmp_path):
    _, b = clones
    train = [str(SCRIPT), "train", "--params", str(b / "params/root_probe_train.yaml")]
    expected = str(b / "outputs/root_probe/problems")
    assert checked_data(train, tmp_path, BRORL_ROOT=str(b)) == expected
    out = run(train, tmp_path)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0] == (f"error: {tmp_path} is not inside a brorl checkout (no folder from it up "
                        "holds dvc.yaml and params/): cd into your checkout, or set "
                        "BRORL_ROOT=/path/to/checkout.")
    assert "Traceback" not in out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []
