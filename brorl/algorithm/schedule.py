"""Per-step schedules of the ProRL -> BroRL switch: the learning-rate rule, the PPO mini-batch
split, and periodic reference resets.

- LR (BroRL §4.2.1): lr = base_lr * sqrt(samples_per_step / base_samples_per_step), the
  square-root rule in samples per step: BroRL's 128 x 512 = 65,536 over ProRL's 512 x 16 = 8,192
  gives x sqrt(8) = x 2.83.
- Mini-batches (BroRL §4.2.1, §4.2.3): the number of PPO mini-batches per step stays fixed across
  arms, so each BroRL mini-batch holds 8x the rollouts. When dynamic sampling returns fewer rollouts
  than planned (budget exhausted), the same count of near-equal mini-batches is kept.
- Reference resets (ProRL (arXiv 2505.24864) §2.3.1; the ProRLv2 blog post): every K steps the
  reference policy becomes the current one. ProRLv2 keeps the optimizer state
  (`reset_optimizer=False`); ProRL v1 re-initialised it.
  Deliberately ignored: resets triggered by KL spikes or stalled validation (a caller decision).

Plain Python, no torch: `brorl.params` uses `scaled_lr` for its derived `lr`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def scaled_lr(base_lr: float, samples_per_step: int, base_samples_per_step: int) -> float:
    """base_lr * sqrt(samples_per_step / base_samples_per_step) (BroRL §4.2.1)."""
    if samples_per_step <= 0 or base_samples_per_step <= 0:
        raise ValueError(
            f"samples per step must be positive, got {samples_per_step} and {base_samples_per_step}; "
            "pass prompts_per_step * rollouts_per_prompt for both arms."
        )
    return base_lr * math.sqrt(samples_per_step / base_samples_per_step)


def mini_batch_rollouts(rollouts_per_step: int, mini_batches_per_step: int) -> int:
    """Rollouts per PPO mini-batch that keep `mini_batches_per_step` fixed (BroRL §4.2.1)."""
    if mini_batches_per_step <= 0 or rollouts_per_step % mini_batches_per_step:
        raise ValueError(
            f"{rollouts_per_step} rollouts per step do not split into {mini_batches_per_step} equal "
            "mini-batches; choose mini_batches_per_step dividing prompts_per_step * rollouts_per_prompt."
        )
    return rollouts_per_step // mini_batches_per_step


def mini_batch_bounds(num_rollouts: int, mini_batches_per_step: int) -> list[tuple[int, int]]:
    """[start, end) slices of `num_rollouts` into that many near-equal mini-batches (sizes differ
    by at most one; fewer, of one rollout each, when num_rollouts < mini_batches_per_step)."""
    if mini_batches_per_step <= 0:
        raise ValueError(f"mini_batches_per_step must be positive, got {mini_batches_per_step}.")
    count = min(num_rollouts, mini_batches_per_step)
    bounds, start = [], 0
    for i in range(count):
        size = num_rollouts // count + (1 if i < num_rollouts % count else 0)
        bounds.append((start, start + size))
        start += size
    return bounds


def should_reset_reference(step: int, every: int | None) -> bool:
    """True after update step `step` (1-based) when `every` divides it; never if `every` is None."""
    if every is None:
        return False
    if every <= 0:
        raise ValueError(f"reference reset interval must be positive or None (never), got {every}.")
    return step > 0 and step % every == 0


@dataclass(frozen=True)
class ResetPlan:
    """What the trainer does after a step: copy the policy into the reference, clear the optimizer."""

    reset_reference: bool
    reset_optimizer: bool


def reset_plan(step: int, every: int | None, reset_optimizer: bool) -> ResetPlan:
    """The reset decision after `step`; the optimizer is only cleared together with the reference
    (ProRL v1: `reset_optimizer=True`; ProRLv2, our default: False, the ProRLv2 blog post)."""
    due = should_reset_reference(step, every)
    return ResetPlan(reset_reference=due, reset_optimizer=due and reset_optimizer)
