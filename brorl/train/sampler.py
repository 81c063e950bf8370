"""The data cursor: prompts drawn in a seeded order, epoch after epoch, resumable exactly, and
continued across runs.

Each epoch is a permutation of the training problems drawn from (seed, epoch); the cursor is
(epoch, position). `take(n)` returns the next n problems, crossing into the next epoch when one
runs out, so refill rounds of dynamic sampling never reuse a prompt within an epoch. The state is
saved in every checkpoint.

Continuation (`continue_stream`): a run's end writes `run.json` beside its policy (`run_record`:
seed, global step, cursor, data). A run starting from that policy continues the stream: with the
same seed at exactly the saved cursor; with another seed it first draws the unseen rest of the
saved epoch, in an order shuffled by its own seed, then its own epochs. `SamplerState.carry`
records how that first epoch's order was made ([seed, position] links), so a resume is exact.

Deliberately ignored: curriculum or per-task weighting (uniform over problems, as ProRL samples
its mixed dataset), skipping prompts already solved.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from brorl.types import Problem

RUN_RECORD = "run.json"
"""The file beside a finished run's policy that a continuing run reads."""


@dataclass
class SamplerState:
    """Where the cursor is: `epoch` (permutation number) and `position` within it.

    `carry` (empty unless this run continued another seed's stream inside `epoch`): links
    [seed, position]; the epoch's order is the first link's seed's permutation of `epoch`, cut at
    each link's position and reshuffled by the next link's seed (the last by this run's seed).
    """

    epoch: int = 0
    position: int = 0
    carry: list[list[int]] = field(default_factory=list)


def _permutation(seed: int, epoch: int, size: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=gen).tolist()


def _reshuffle(order: list[int], seed: int, epoch: int) -> list[int]:
    """`order` shuffled by `seed` (a stream distinct from the seed's own epoch permutations)."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 7 + 3)
    return [order[i] for i in torch.randperm(len(order), generator=gen).tolist()]


class PromptSampler:
    """Seeded, epoch-based prompt order over `problems`; `state` is all that a resume needs."""

    def __init__(self, problems: Sequence[Problem], seed: int, state: SamplerState | None = None):
        if not problems:
            raise ValueError("the prompt sampler got no problems; check the data split's path.")
        self.problems = tuple(problems)
        self.seed = seed
        self.state = state or SamplerState()
        self._order = self._epoch_order()

    def _epoch_order(self) -> list[int]:
        """The problem indices of the current epoch, in draw order."""
        epoch, size = self.state.epoch, len(self.problems)
        if not self.state.carry:
            return _permutation(self.seed, epoch, size)
        links = self.state.carry
        order = _permutation(links[0][0], epoch, size)
        for i, (_, position) in enumerate(links):
            next_seed = links[i + 1][0] if i + 1 < len(links) else self.seed
            order = _reshuffle(order[position:], next_seed, epoch)
        return order

    def take(self, n: int) -> list[Problem]:
        """The next `n` problems in order (n may exceed one epoch)."""
        out: list[Problem] = []
        while len(out) < n:
            if self.state.position == len(self._order):
                self.state = SamplerState(self.state.epoch + 1, 0)
                self._order = self._epoch_order()
            stop = min(len(self._order), self.state.position + n - len(out))
            out += [self.problems[i] for i in self._order[self.state.position : stop]]
            self.state.position = stop
        return out


def run_record(seed: int, step: int, state: SamplerState, data: str,
               problems: int) -> dict[str, Any]:
    """What `run.json` holds: the run's seed, its global step, its cursor, its data path and
    number of training problems (a continuing run checks that it draws from the same list)."""
    return {"seed": seed, "step": step, "sampler": vars(state), "data": data, "problems": problems}


def read_run_record(folder: str | Path) -> dict[str, Any] | None:
    """The `run.json` in `folder`, or None (a base checkpoint or any other HF folder)."""
    path = Path(folder) / RUN_RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def continue_stream(record: dict[str, Any], seed: int, problems: int) -> tuple[int, SamplerState]:
    """(step offset, cursor) of a run with `seed` over `problems` training problems continuing
    the run of `record`: the same cursor for the same seed, else the saved epoch's unseen rest
    (reshuffled by `seed`), then `seed`'s own epochs."""
    if record["problems"] != problems:
        raise ValueError(
            f"the start checkpoint's {RUN_RECORD} was written by a run over {record['problems']} "
            f"training problems ({record['data']}), this run has {problems}: its cursor would "
            "index another list. Point data.path at that run's data or set "
            "train.continue_stream: false.")
    saved = SamplerState(**record["sampler"])
    if record["seed"] == seed:
        return record["step"], saved
    carry = [*saved.carry, [record["seed"], saved.position]]
    return record["step"], SamplerState(saved.epoch, 0, carry)
