"""RL training on DeepSpeed: `Trainer` (one step = generate, verify, filter, PPO) and its checkpoints.

Python API:
    from brorl.params import load_params
    from brorl.data import load_split
    from brorl.train import Trainer
    params = load_params("params/brorl.yaml")
    trainer = Trainer(params.trainer_config(), load_split(params.data.path, "train"))
    metrics = trainer.step()
"""

from brorl.train.config import LossConfig, TrainerConfig
from brorl.train.trainer import Collected, Trainer, draw_seed, init_distributed, parameter_digest

__all__ = ["Collected", "LossConfig", "Trainer", "TrainerConfig", "draw_seed", "init_distributed",
           "parameter_digest"]
