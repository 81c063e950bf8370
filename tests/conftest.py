"""Shared fixtures: offline project-local environment, a temporary MLflow store, a Prefect harness."""

from __future__ import annotations

import os
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
