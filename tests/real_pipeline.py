"""The real-model pipeline at CI size, for tests/test_real_model.py (started by conftest.py when
the session collects those tests, in a clone of its own, under a Prefect server):

    python tests/real_pipeline.py OUT.json

runs the `data`, `model` and `compare` flows through their commands (`brorl <name> --params
params/smollm2*_ci.yaml`: checks, then the flow) in this process, from the working directory,
and writes the model flow's card to OUT.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from commands.cli import app


def brorl(*argv: str) -> dict:
    """`brorl ARGV` in this process; the flow's summary."""
    return app(list(argv), standalone_mode=False)


def main(out: Path) -> None:
    brorl("data", "--params", "params/smollm2_ci.yaml")
    made = brorl("model", "--params", "params/smollm2_ci.yaml")
    brorl("compare", "--params", "params/smollm2_compare_ci.yaml")
    out.write_text(json.dumps({"card": made["card"]}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
