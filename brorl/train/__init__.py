"""RL training on DeepSpeed: `Run` (the loop: stop rules, schedules, resume), `Trainer` (one
step's mechanics: generate, verify, filter, PPO) and their checkpoints.

Python API:
    from brorl.params import load_params
    from brorl.train import Run
    run = Run.open(load_params("params/brorl.yaml"))   # resumes from its newest checkpoint
    summary = run.train()                                # until a stop rule of the params fires
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {"TrainerConfig": "config", "Direct": "run",
          "Driver": "run", "Timed": "run", "Run": "run", "RunConfig": "config",
          "RunState": "state", "Collected": "collection", "Trainer": "trainer",
          "draw_seed": "trainer", "init_distributed": "trainer", "parameter_digest": "trainer"}
"""Each public name's module: loaded when the name is first used, so `python -m brorl.train`
checks its arguments and inputs before torch and DeepSpeed load (PEP 562)."""

__all__ = ["Collected", "Direct", "Driver", "Run", "RunConfig", "RunState", "Timed",
           "Trainer", "TrainerConfig", "draw_seed", "init_distributed", "parameter_digest"]
"""`sorted(_HOMES)`, spelled out so that linters see the lazy names as exported."""

if TYPE_CHECKING:
    from brorl.train.collection import Collected
    from brorl.train.config import RunConfig, TrainerConfig
    from brorl.train.run import Direct, Driver, Run
    from brorl.train.state import RunState
    from brorl.train.trainer import Trainer, draw_seed, init_distributed, parameter_digest
    from brorl.types import Timed


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'brorl.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"brorl.train.{_HOMES[name]}"), name)
