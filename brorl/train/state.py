"""`RunState`: what a run has done so far (counters, seconds, per-step metrics, evaluation rows,
the plateau rule's reference), saved in every checkpoint so a resumed run continues exactly where
its checkpoint left it (`brorl.train.run`). A plain record: no torch.

The checkpoint holds `stable_dict()`: everything but the wall-clock figures (`TIMING_FIELDS`,
the timing metrics of each step, each evaluation row's `seconds`), so the same run writes the
same bytes. Those figures (`timings_dict()`) go beside the run's folder (`brorl.runs.timings`), and
`from_dict` puts them back when a resume finds them for its checkpoint's step; without them a
resumed run counts its seconds, and the `train.max_seconds` budget, from 0 again.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from brorl.runs.timings import merge_run_timings, run_timings, split_timings

TIMING_FIELDS = ("train_seconds", "eval_seconds", "checkpoint_seconds")
"""The state's wall-clock counters, kept out of checkpoints (`timings_dict`)."""


@dataclass
class RunState:
    """What a run has done so far; saved in every checkpoint (`Trainer.save_checkpoint`)."""

    rollouts: int = 0
    """Rollouts generated, refills included (the budget's unit, BroRL Table 1's "samples")."""
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
    """Evaluation rows, one per (step, split) (`brorl.evaluation.protocol`)."""
    probe_start: list[float] | None = None
    """The held-out probes' reference-token probabilities at the run's start, flat
    (`brorl.train.diagnostics.Shrinkage.start`); None before the first update."""

    @classmethod
    def from_dict(cls, saved: dict[str, Any], timings: dict[str, Any] | None = None) -> RunState:
        """The state of a checkpoint record (`stable_dict`, or an older record with the seconds
        inside it), with `timings_dict`'s record of the same step put back when given (rows
        whose seconds neither holds get NaN). Neither record is changed."""
        state = cls(**copy.deepcopy(saved))
        timings = timings or {}
        for name in TIMING_FIELDS:
            setattr(state, name, float(timings.get(name, getattr(state, name))))
        merge_run_timings(state.history, state.evals, timings)
        return state

    def stable_dict(self) -> dict[str, Any]:
        """The record a checkpoint holds: the state without its wall-clock figures."""
        record = {k: v for k, v in asdict(self).items() if k not in TIMING_FIELDS}
        record["history"] = [split_timings(m)[0] for m in self.history]
        record["evals"] = [split_timings(r)[0] for r in self.evals]
        return record

    def timings_dict(self) -> dict[str, Any]:
        """The wall-clock figures `stable_dict` leaves out (`brorl.runs.timings.run_timings`)."""
        return {**{name: getattr(self, name) for name in TIMING_FIELDS},
                **run_timings(self.history, self.evals)}
