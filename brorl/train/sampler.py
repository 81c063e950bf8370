"""The data cursor: prompts drawn in a seeded order, epoch after epoch, resumable exactly.

Each epoch is a permutation of the training problems drawn from (seed, epoch); the cursor is
(epoch, position). `take(n)` returns the next n problems, crossing into the next epoch when one
runs out, so refill rounds of dynamic sampling never reuse a prompt within an epoch. The state is
two integers, saved in every checkpoint.

Deliberately ignored: curriculum or per-task weighting (uniform over problems, as ProRL samples
its mixed dataset), skipping prompts already solved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from brorl.types import Problem


@dataclass
class SamplerState:
    """Where the cursor is: `epoch` (permutation number) and `position` within it."""

    epoch: int = 0
    position: int = 0


class PromptSampler:
    """Seeded, epoch-based prompt order over `problems`; `state` is all that a resume needs."""

    def __init__(self, problems: Sequence[Problem], seed: int, state: SamplerState | None = None):
        if not problems:
            raise ValueError("the prompt sampler got no problems; check the data split's path.")
        self.problems = tuple(problems)
        self.seed = seed
        self.state = state or SamplerState()
        self._order = self._permutation(self.state.epoch)

    def _permutation(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.problems), generator=gen).tolist()

    def take(self, n: int) -> list[Problem]:
        """The next `n` problems in order (n may exceed one epoch)."""
        out: list[Problem] = []
        while len(out) < n:
            if self.state.position == len(self._order):
                self.state = SamplerState(self.state.epoch + 1, 0)
                self._order = self._permutation(self.state.epoch)
            stop = min(len(self._order), self.state.position + n - len(out))
            out += [self.problems[i] for i in self._order[self.state.position : stop]]
            self.state.position = stop
        return out
