"""`make gpu-check` (benchmarks/gpu_check.py): without CUDA it refuses in one line before any
work; `--tiny` runs every part but the tests on this CPU, ends with the summary table and
records nowhere but a temporary folder (a machine's recorded figures stay as they are)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("BRORL_BENCHMARK_RESULTS", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def _recorded() -> dict[str, float]:
    return {p.name: p.stat().st_mtime for p in (ROOT / "benchmarks" / "results").glob("*.json")}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_without_cuda_it_refuses_in_one_line():
    done = _run()
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr and "--tiny" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_tiny_runs_every_part_and_records_nothing_here(tmp_path):
    before = _recorded()
    done = _run("--tiny", "--json", str(tmp_path / "rows.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r[0] for r in rows] == ["rollouts", "decode step", "RL step"]
    assert all(r[3].startswith("ok") for r in rows), rows
    assert "rollouts/s" in rows[0][2] and "ms per step" in rows[1][2]
    assert "ppo_update" in rows[2][2] and "generate_rollouts" in rows[2][2]
    assert "| part | case | figure | status |" in done.stdout
    assert _recorded() == before
