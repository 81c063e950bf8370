"""The README's command blocks, run as a user would type them (CI-sized where the README says so).

Every fenced `bash`, `python` and `yaml` block of README.md is preceded by a marker the reader
does not see, `<!-- test: HOW -->`:

- `run`: each command (or the Python program) runs as typed;
- `ci: OLD -> NEW; ...`: the same after these replacements (CI-sized params, fewer steps);
- `params`: a params example: it must load (`brorl.params.load_params`);
- `skip: WHY`: not run here, and the marker says why (what covers it instead).

They run in the CI pipeline's clone (`ci_pipeline` in conftest.py: CI data, warm-up and arms
already there), with its MLflow store and the session's Prefect server, so a README command that
breaks fails this test. Every README example that trains writes its own folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?:<!-- test: (?P<how>.*?) -->\n)?```(?P<lang>bash|python|yaml)\n"
                   r"(?P<body>.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    """A fenced block of the README and its marker (None when it has none)."""

    lang: str
    body: str
    how: str | None
    line: int

    def commands(self) -> list[str]:
        """The block's commands after its `ci:` replacements: one per non-comment line of a
        bash block (trailing `# ...` comments dropped), the whole program of a Python one."""
        body = self.body
        if self.how and self.how.startswith("ci:"):
            for pair in self.how.removeprefix("ci:").split(";"):
                old, new = (part.strip() for part in pair.split("->"))
                assert old in body, f"README line {self.line}: `{old}` is not in its block"
                body = body.replace(old, new)
        if self.lang == "python":
            return [body]
        return [re.sub(r"\s+#\s.*$", "", line).strip() for line in body.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]


def readme_blocks(text: str) -> list[Block]:
    return [Block(m["lang"], m["body"], m["how"], text[:m.start()].count("\n") + 1)
            for m in BLOCK.finditer(text)]


BLOCKS = readme_blocks((ROOT / "README.md").read_text())


def test_every_block_says_how_it_is_tested():
    unmarked = [b.line for b in BLOCKS if b.how is None]
    assert BLOCKS and unmarked == [], f"README blocks without a `<!-- test: ... -->` marker at lines {unmarked}"
    for b in BLOCKS:
        kind = b.how.split(":")[0].strip()
        assert kind in {"run", "ci", "params", "skip"}, (b.line, b.how)
        if kind == "skip":
            assert len(b.how.removeprefix("skip:").strip()) > 20, f"line {b.line}: say why"


def test_every_example_that_trains_writes_its_own_folder():
    text = (ROOT / "README.md").read_text()
    folders = re.findall(r"train\.run_dir=(\S+?)[\"'\s,\]]", text)
    folders += re.findall(r"run_dir: (\S+?)[,}\s]", text)
    assert folders and len(folders) == len(set(folders)), folders


def test_the_params_examples_load(tmp_path):
    from brorl.params import load_params

    examples = [b for b in BLOCKS if b.how == "params"]
    assert examples
    for b in examples:
        path = ROOT / "params" / f".readme_example_{b.line}.yaml"
        try:
            path.write_text(b.body)
            load_params(path)
        finally:
            path.unlink(missing_ok=True)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.how and b.how.split(":")[0] in
                                   ("run", "ci")], ids=lambda b: f"line{b.line}")
def test_the_command_block_runs(block, ci_pipeline, prefect_harness):
    from prefect.settings import PREFECT_API_URL

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "BRORL_PYTHON": sys.executable, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "MLFLOW_TRACKING_URI": f"sqlite:///{ci_pipeline / 'mlflow.db'}",
           "PYTHONPATH": str(ci_pipeline)}  # `brorl` runs the clone's code, as in a user's clone
    for command in block.commands():
        if block.lang == "python":
            done = subprocess.run([sys.executable, "-c", command], cwd=ci_pipeline, env=env,
                                  capture_output=True, text=True, timeout=900)
        else:
            done = subprocess.run(["bash", "-c", command], cwd=ci_pipeline, env=env,
                                  capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (block.line, command, done.stdout[-2000:],
                                      done.stderr[-3000:])
