"""The real `Trainer`'s collection methods, shared by the stand-ins that replace its model
(`FakeTrainer` in tests/test_run.py, `EngineTrainer` in tests/test_verification.py)."""

from __future__ import annotations

from brorl.train import Trainer


class TrainerCollection:
    """`Trainer.start_collection` (budget cap, keep rule), `draw_share`, `gather_groups`,
    `generating_ranks` and `global_step`, unchanged; a subclass sets the state they read."""

    start_collection = Trainer.start_collection
    draw_share = Trainer.draw_share
    gather_groups = Trainer.gather_groups
    generating_ranks = Trainer.generating_ranks
    global_step = Trainer.global_step
