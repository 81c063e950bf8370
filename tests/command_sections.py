"""Which params sections each command runs: an example's params file must set one of them (else
the command would run that section's defaults, e.g. `brorl simulate --params params/prorl.yaml`
the paper-size sweep), and its `-S` overrides must set a key the command reads. Shared by
tests/test_help_examples.py (the `--help` texts) and tests/test_doc_examples.py (docs/*.md).
"""

from __future__ import annotations

from pathlib import Path

import typer

from commands import cli

ROOT = Path(__file__).resolve().parents[1]
RL = frozenset({"train", "update", "generate", "filter", "verify", "diagnostics"})
SECTIONS = {"simulate": {"simulate"}, "data": {"data"}, "model": {"model"}, "base": {"base"},
            "train": RL, "evaluate": RL, "serve": RL, "run": RL, "compare": {"compare"},
            "study": {"study"}}
"""The params sections each `brorl` command runs."""
OPTION_SECTIONS = {
    ("brorl.train", "--params"): RL,
    ("commands.deploy", "--params"): RL,  # the default served flows: train and evaluate
    ("benchmarks/base_pass_rates.py", "--params"): {"model"},
    ("benchmarks/eval_sampler.py", "--params"): {"data", "model", "train", "generate", "verify"},
    ("benchmarks/rollout_throughput.py", "--params"): {"model"},
    ("benchmarks/rollout_throughput.py", "--data-params"): {"data"},
    ("benchmarks/step_memory.py", "--params"): {"model"},
    ("benchmarks/step_memory.py", "--data-params"): {"data"},
    ("benchmarks/vs_trl.py", "--data-params"): {"data"},
    ("benchmarks/simulate_speed.py", "--params"): {"simulate"},
    ("brorl.study.power", "--params"): {"study"},
    ("brorl.study.probe", "--params"): {"data", "model", "generate", "filter", "verify"},
    ("brorl.study.frozen", "--params"): {"study"},
}
"""The sections each params-file option of the other programs (`python -m MODULE`, `python
benchmarks/X.py`) reads; its `-S` overrides, where it has them, set keys of the same sections.
Every option whose argparse dest ends in `params` is listed (tests/test_help_examples.py)."""
COMMANDS = typer.main.get_command(cli.app).commands
FLOWS = sorted(p.stem for p in (ROOT / "flows").glob("*.py") if p.name != "__init__.py")
"""The flow modules, each run by the `brorl` command of its name."""
