"""Scored rollout groups: one step's problems, their B x N rollouts and rewards, as one record.

`ScoredGroups` is what generation plus verification returns and what dynamic sampling filters
(`brorl.algorithm.filtering.GroupBatch`): `select` keeps whole groups, `select_rollouts` keeps
the same number of rollouts of every group (a training subset, `brorl.algorithm.downsample`),
`concat` joins the pieces of several refill rounds (right-padding responses to the widest). Rows
stay prompt-major: row i is rollout i % N of problem i // N.

Groups of different sizes (adaptive allocation, `brorl.algorithm.allocation`) are padded to one
width N with empty rows and a `valid` mask `[b, N]`: `merge_rounds` builds them from a first
round of n0 rollouts per prompt and a second round of each prompt's extra rollouts. Padded rows
have no response tokens (so they carry no loss and no advantage) and are left out of every
count; `valid` is None when every row is real.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from brorl.types import Problem, RolloutBatch


@dataclass(frozen=True)
class ScoredGroups:
    """b problems, their rollouts `batch` (b*N rows) and rewards `[b, N]` with verdict reasons;
    `valid` `[b, N]` bool marks the real rollouts of padded groups (None: all are real)."""

    problems: tuple[Problem, ...]
    batch: RolloutBatch
    rewards: Tensor
    reasons: tuple[str, ...]
    valid: Tensor | None = None

    def __post_init__(self) -> None:
        b, n = len(self.problems), self.batch.rollouts_per_prompt
        if self.batch.num_prompts != b or tuple(self.rewards.shape) != (b, n):
            raise ValueError(
                f"{b} problems, {self.batch.num_prompts} prompts in the batch and rewards of shape "
                f"{tuple(self.rewards.shape)}: all must describe the same {b} groups of N={n}."
            )
        if len(self.reasons) != b * n:
            raise ValueError(f"{len(self.reasons)} verdict reasons for {b * n} rollouts.")
        if self.valid is not None and tuple(self.valid.shape) != (b, n):
            raise ValueError(f"valid has shape {tuple(self.valid.shape)}; it must be [b, N] = "
                             f"[{b}, {n}], one flag per rollout slot.")

    @property
    def num_groups(self) -> int:
        return len(self.problems)

    def valid_mask(self) -> Tensor:
        """bool `[b, N]`: the real rollouts (all True for unpadded groups)."""
        if self.valid is None:
            return torch.ones_like(self.rewards, dtype=torch.bool)
        return self.valid

    @property
    def num_rollouts(self) -> int:
        """Real rollouts (padding excluded)."""
        return int(self.valid.sum()) if self.valid is not None else self.rewards.numel()

    def select(self, index: Tensor) -> ScoredGroups:
        """The groups at `index` (`[k]` long), whole, in the order given."""
        return ScoredGroups(
            problems=tuple(self.problems[i] for i in index.tolist()),
            batch=select_groups(self.batch, index),
            rewards=self.rewards[index],
            reasons=tuple(self.reasons[r] for r in group_rows(index, self.batch.rollouts_per_prompt).tolist()),
            valid=None if self.valid is None else self.valid[index],
        )

    def select_rollouts(self, index: Tensor) -> ScoredGroups:
        """Every group with only its rollouts at `index` `[b, M]` (positions 0..N-1 in each
        group, in the order given): the same problems, M rollouts each."""
        if self.valid is not None:
            raise ValueError("select_rollouts needs whole groups of N; padded groups (adaptive "
                             "allocation) cannot take a training subset.")
        batch = select_rollouts(self.batch, index)  # checks index first
        rows = rollout_rows(index, self.batch.rollouts_per_prompt)
        return ScoredGroups(
            problems=self.problems,
            batch=batch,
            rewards=self.rewards.gather(1, index.to(torch.long)),
            reasons=tuple(self.reasons[r] for r in rows.tolist()),
        )


def group_rows(index: Tensor, n: int) -> Tensor:
    """Row indices `[k*n]` of the groups at `index` `[k]` in a prompt-major batch."""
    return (index.to(torch.long)[:, None] * n + torch.arange(n)[None, :]).reshape(-1)


def rollout_rows(index: Tensor, n: int) -> Tensor:
    """Row indices `[b*M]` of the rollouts at `index` `[b, M]` (positions 0..n-1 in each group
    of n), prompt-major."""
    index = index.to(torch.long)
    return (torch.arange(index.shape[0])[:, None] * n + index).reshape(-1)


def _take_rows(batch: RolloutBatch, rows: Tensor, prompts: list[int], n: int) -> RolloutBatch:
    """The batch of `rows` (prompt-major, n per prompt) of the prompts `prompts`, re-indexed
    0..len(prompts)-1, responses trimmed to the longest kept."""
    width = int(batch.response_lengths[rows].max()) if rows.numel() else 0
    row_list = rows.tolist()
    return RolloutBatch(
        prompt_index=torch.arange(len(prompts)).repeat_interleave(n),
        prompt_ids=tuple(batch.prompt_ids[i] for i in prompts),
        response_ids=batch.response_ids[rows, :width],
        response_lengths=batch.response_lengths[rows],
        logprobs=batch.logprobs[rows, :width],
        texts=tuple(batch.texts[r] for r in row_list),
        finish_reasons=tuple(batch.finish_reasons[r] for r in row_list),
        rollouts_per_prompt=n,
        pad_id=batch.pad_id,
    )


def select_groups(batch: RolloutBatch, index: Tensor) -> RolloutBatch:
    """The sub-batch of the prompts at `index` `[k]`, with all their rollouts, re-indexed 0..k-1."""
    n = batch.rollouts_per_prompt
    return _take_rows(batch, group_rows(index, n), index.tolist(), n)


def select_rollouts(batch: RolloutBatch, index: Tensor) -> RolloutBatch:
    """Every prompt with only its rollouts at `index` `[B, M]` (positions 0..N-1 in each
    group): a batch of N = M, still prompt-major."""
    if index.dim() != 2 or index.shape[0] != batch.num_prompts:
        raise ValueError(f"index has shape {tuple(index.shape)}; pass [B, M] rollout positions, "
                         f"one row per prompt of the batch (B = {batch.num_prompts}).")
    n = batch.rollouts_per_prompt
    if index.numel() and not 0 <= int(index.min()) <= int(index.max()) < n:
        raise ValueError(f"rollout positions must be in 0..{n - 1} (N = {n}), got "
                         f"{int(index.min())}..{int(index.max())}.")
    rows = rollout_rows(index, n)
    return _take_rows(batch, rows, list(range(batch.num_prompts)), index.shape[1])


def _pad_to(x: Tensor, width: int, value: float) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def concat(pieces: Sequence[ScoredGroups]) -> ScoredGroups:
    """One `ScoredGroups` from several (same N), groups in the order given."""
    if not pieces:
        raise ValueError("concat needs at least one piece; check that some group was kept.")
    ns = {p.batch.rollouts_per_prompt for p in pieces}
    if len(ns) != 1:
        raise ValueError(f"pieces have different rollouts per prompt {sorted(ns)}; N must be equal.")
    n, pad = ns.pop(), pieces[0].batch.pad_id
    width = max(p.batch.response_ids.shape[1] for p in pieces)
    num_prompts = sum(p.num_groups for p in pieces)
    batch = RolloutBatch(
        prompt_index=torch.arange(num_prompts).repeat_interleave(n),
        prompt_ids=tuple(ids for p in pieces for ids in p.batch.prompt_ids),
        response_ids=torch.cat([_pad_to(p.batch.response_ids, width, pad) for p in pieces]),
        response_lengths=torch.cat([p.batch.response_lengths for p in pieces]),
        logprobs=torch.cat([_pad_to(p.batch.logprobs, width, 0.0) for p in pieces]),
        texts=tuple(t for p in pieces for t in p.batch.texts),
        finish_reasons=tuple(f for p in pieces for f in p.batch.finish_reasons),
        rollouts_per_prompt=n,
        pad_id=pad,
    )
    padded = any(p.valid is not None for p in pieces)
    return ScoredGroups(
        problems=tuple(q for p in pieces for q in p.problems),
        batch=batch,
        rewards=torch.cat([p.rewards for p in pieces]),
        reasons=tuple(r for p in pieces for r in p.reasons),
        valid=torch.cat([p.valid_mask() for p in pieces]) if padded else None,
    )


def merge_rounds(first: ScoredGroups, second: ScoredGroups | None, extra: Tensor,
                 width: int) -> ScoredGroups:
    """Padded groups of `width` slots from two rounds: `first` holds b groups of n0 rollouts,
    `second` (None when `extra` is all 0) the extra rollouts, one per row (N = 1), prompt-major:
    `extra[i]` rows of prompt i, in prompt order. Group i holds its n0 first-round rollouts, then
    its extra ones, then empty rows (`valid` False, reward 0, no response tokens)."""
    b, n0 = first.rewards.shape
    extra = extra.to(torch.long)
    taken = 0 if second is None else second.batch.num_rollouts
    if extra.shape != (b,) or int(extra.sum()) != taken:
        raise ValueError(f"extra {extra.tolist()} must give one count per group of the first round "
                         f"({b}) and sum to the second round's {taken} rollouts.")
    if second is not None and second.batch.rollouts_per_prompt != 1:
        raise ValueError("the second round must hold one rollout per row (N = 1).")
    sizes = n0 + extra
    if int(sizes.max()) > width:
        raise ValueError(f"a group of {int(sizes.max())} rollouts does not fit in {width} slots.")
    rounds = [first.batch] + ([second.batch] if second is not None else [])
    wide = max(r.response_ids.shape[1] for r in rounds)
    rows = b * width
    pad = first.batch.pad_id
    response_ids = torch.full((rows, wide), pad, dtype=first.batch.response_ids.dtype)
    logprobs = torch.zeros(rows, wide, dtype=first.batch.logprobs.dtype)
    lengths = torch.zeros(rows, dtype=first.batch.response_lengths.dtype)
    rewards = torch.zeros(b, width, dtype=first.rewards.dtype)
    texts, finish, reasons = [""] * rows, ["stop"] * rows, [""] * rows
    valid = torch.arange(width)[None, :] < sizes[:, None]
    # slot of every real rollout: first round at 0..n0-1, the extras after them
    first_slots = (torch.arange(b)[:, None] * width + torch.arange(n0)[None, :]).reshape(-1)
    starts = torch.cumsum(extra, 0) - extra  # row of prompt i's first extra in `second`
    owner = torch.arange(b).repeat_interleave(extra)
    rank = torch.arange(taken) - starts[owner]
    second_slots = owner * width + n0 + rank
    for batch, groups, slots in ((first.batch, first, first_slots),
                                 *(((second.batch, second, second_slots),) if second else ())):
        t = batch.response_ids.shape[1]
        response_ids[slots, :t] = batch.response_ids
        logprobs[slots, :t] = batch.logprobs
        lengths[slots] = batch.response_lengths
        rewards.view(-1)[slots] = groups.rewards.reshape(-1).to(rewards.dtype)
        for slot, text, reason, why in zip(slots.tolist(), batch.texts, batch.finish_reasons,
                                           groups.reasons):
            texts[slot], finish[slot], reasons[slot] = text, reason, why
    batch = RolloutBatch(
        prompt_index=torch.arange(b).repeat_interleave(width), prompt_ids=first.batch.prompt_ids,
        response_ids=response_ids, response_lengths=lengths, logprobs=logprobs,
        texts=tuple(texts), finish_reasons=tuple(finish), rollouts_per_prompt=width, pad_id=pad)
    return ScoredGroups(first.problems, batch, rewards, tuple(reasons), valid)


def response_mask(batch: RolloutBatch) -> Tensor:
    """bool `[B*N, T]`: True on each rollout's response tokens (EOS included), False on padding."""
    t = batch.response_ids.shape[1]
    return torch.arange(t)[None, :] < batch.response_lengths[:, None]


def groups_table(groups: ScoredGroups) -> dict[str, list]:
    """One row per rollout: problem, rollout index, response text and tokens, log-probs, reward."""
    batch, n = groups.batch, groups.batch.rollouts_per_prompt
    lengths = batch.response_lengths.tolist()
    return {
        "problem_id": [p.id for p in groups.problems for _ in range(n)],
        "family": [p.family for p in groups.problems for _ in range(n)],
        "task": [p.task for p in groups.problems for _ in range(n)],
        "rollout": [i for _ in groups.problems for i in range(n)],
        "response": list(batch.texts),
        "response_ids": [batch.response_ids[r, :k].tolist() for r, k in enumerate(lengths)],
        "logprobs": [batch.logprobs[r, :k].tolist() for r, k in enumerate(lengths)],
        "finish_reason": list(batch.finish_reasons),
        "reward": groups.rewards.reshape(-1).tolist(),
        "reason": list(groups.reasons),
    }


def save_groups(groups: ScoredGroups, path: str | Path) -> Path:
    """Write `groups_table(groups)` as Parquet at `path` (a temporary sibling, then a rename)."""
    from datasets import Dataset

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    Dataset.from_dict(groups_table(groups)).to_parquet(str(tmp))
    os.replace(tmp, path)
    return path
