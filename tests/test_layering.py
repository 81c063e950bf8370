"""Dependencies point one way: flows -> tasks -> brorl. brorl never imports prefect, mlflow or dvc."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import brorl

ROOT = Path(__file__).resolve().parents[1]


def brorl_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(brorl.__path__, "brorl."))


def test_importing_every_brorl_module_loads_no_orchestration_library():
    modules = brorl_modules()
    assert "brorl.theory.simulator" in modules
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(x for x in ('prefect', 'mlflow', 'dvc') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_brorl_and_tasks_never_import_upward():
    for path in (ROOT / "brorl").rglob("*.py"):
        text = path.read_text()
        for name in ("prefect", "mlflow", "dvc", "tasks", "flows"):
            assert f"\nimport {name}" not in text and f"\nfrom {name}" not in text, (path, name)
    for path in (ROOT / "tasks").rglob("*.py"):
        assert "from flows" not in path.read_text(), path
