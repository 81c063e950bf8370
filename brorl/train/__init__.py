"""RL training on DeepSpeed: `Run` (the loop: stop rules, schedules, resume), `Trainer` (one
step's mechanics: generate, verify, filter, PPO) and their checkpoints.

Python API:
    from brorl.params import load_params
    from brorl.train import Run
    run = Run.open(load_params("params/brorl.yaml"))   # resumes from its newest checkpoint
    summary = run.train()                                # until a stop rule of the params fires
"""

from brorl.train.config import LossConfig, TrainerConfig
from brorl.train.driver import Direct, Driver, Timed
from brorl.train.run import Run, RunConfig, RunState
from brorl.train.collection import Collected
from brorl.train.trainer import Trainer, draw_seed, init_distributed, parameter_digest

__all__ = ["Collected", "Direct", "Driver", "LossConfig", "Run", "RunConfig", "RunState", "Timed",
           "Trainer", "TrainerConfig", "draw_seed", "init_distributed", "parameter_digest"]
