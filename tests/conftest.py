"""Shared fixtures: offline project-local environment, a temporary MLflow store, a Prefect harness."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import flows  # noqa: F401  (sets offline, project-local environment defaults; imports no prefect)

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture()
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite MLflow store under the test's temporary folder, set as the tracking URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server for all flow tests of the session (startup takes ~10 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def clone_repository(dest: Path) -> Path:
    """`git clone` of this checkout plus its uncommitted (tracked or new, not ignored) files."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True, timeout=120)
    changed = subprocess.run(["git", "ls-files", "-m", "-o", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    for name in changed:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="session")
def ci_pipeline(tmp_path_factory, prefect_harness) -> Path:
    """A clone after `dvc repro compare` with CI params (a few minutes on 2 cores).

    The clone is `git clone` of this repository plus the working tree's uncommitted files, with
    `params/pipeline_ci.yaml` copied over `params/pipeline.yaml` (the switch dvc.yaml reads); its
    flows report to the session's Prefect harness, its MLflow store is `<clone>/mlflow.db`.
    """
    from prefect.settings import PREFECT_API_URL

    clone = clone_repository(tmp_path_factory.mktemp("pipeline") / "repo")
    shutil.copy(clone / "params" / "pipeline_ci.yaml", clone / "params" / "pipeline.yaml")
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
           "PREFECT_API_URL": PREFECT_API_URL.value(), "OMP_NUM_THREADS": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{clone / 'mlflow.db'}",
           "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}
    done = subprocess.run([str(venv_bin / "dvc"), "repro", "compare"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return clone
