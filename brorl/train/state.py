"""`RunState`: what a run has done so far (counters, seconds, per-step metrics, evaluation rows,
the plateau rule's reference), saved in every checkpoint so a resumed run continues exactly where
its checkpoint left it (`brorl.train.run`). A plain record: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunState:
    """What a run has done so far; saved in every checkpoint (`Trainer.save_checkpoint`)."""

    rollouts: int = 0
    """Rollouts generated, refills included (the budget's unit, spec §4.4 "samples")."""
    train_seconds: float = 0.0
    """Seconds of the training stages (`brorl.train.run.TRAIN_STAGES`): evaluation and checkpoints excluded."""
    eval_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    budget_step: int | None = None
    """The step that spent the rollout budget (fewer than N rollouts of it left); None before."""
    best_eval: float | None = None
    """Best `val/score_mean` so far (the plateau rule's reference); None without validation."""
    best_step: int | None = None
    """The step of `best_eval`."""
    evals_since_best: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    """Per-step metrics, one dict per finished step."""
    evals: list[dict[str, Any]] = field(default_factory=list)
    """Evaluation rows, one per (step, split) (`brorl.evals`)."""
    probe_start: list[float] | None = None
    """The held-out probes' reference-token probabilities at the run's start, flat
    (`brorl.train.diagnostics.Shrinkage.start`); None before the first update."""

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> RunState:
        return cls(**saved)
