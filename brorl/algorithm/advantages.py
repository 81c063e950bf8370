"""Sequence-level advantages from group rewards: REINFORCE++-baseline (ProRLv2) and GRPO.

REINFORCE++-baseline (BroRL §3.1; the ProRLv2 blog post): A = R - mean_group(R), then A is
normalised by the mean and std over the whole global batch of valid rollouts; there is no per-group
std. GRPO (ProRL (arXiv 2505.24864) §2): A = (R - mean_group(R)) / (std_group(R) + eps).
Rewards may be continuous.

Group statistics are streamed over the N axis (`GroupStats.update`, Chan et al.'s parallel merge
of Welford's running mean and sum of squared deviations): a group of N = 512 or more rollouts
whose rewards arrive chunk by chunk (engines generate in memory-bounded chunks) is reduced as
the chunks come, with the same result as one pass.

Deliberately ignored: leave-one-out baselines (NeMo-RL's `use_leave_one_out_baseline: false`),
token-weighted whitening (verl's `masked_whiten` over tokens; BroRL §3.1 normalises over rollouts),
and reward shaping (length penalties belong to the verifier stage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from brorl.params.rl import AdvantageEstimator


@dataclass(frozen=True)
class GroupStats:
    """Running per-group count, mean and sum of squared deviations (M2), all `[B]` float64.

    `update` merges one chunk `[B, n]` of rewards (any n, chunks may differ in size) into the
    running statistics and returns the merged record; the result is independent of the split.
    """

    count: Tensor
    mean: Tensor
    m2: Tensor

    @staticmethod
    def empty(num_groups: int, device: torch.device | str = "cpu") -> GroupStats:
        """Statistics of B empty groups."""
        zeros = torch.zeros(num_groups, dtype=torch.float64, device=device)
        return GroupStats(count=zeros, mean=zeros.clone(), m2=zeros.clone())

    def update(self, rewards: Tensor, valid: Tensor | None = None) -> GroupStats:
        """Merge a chunk: rewards `[B, n]`, valid `[B, n]` bool (None: all valid)."""
        w = torch.ones_like(rewards, dtype=torch.float64)
        if valid is not None:
            w = valid.to(torch.float64)
        x = torch.where(w > 0, rewards.to(torch.float64), 0.0)  # invalid slots may hold NaN
        n_b = w.sum(dim=1)
        mean_b = (x * w).sum(dim=1) / n_b.clamp(min=1)
        m2_b = (((x - mean_b[:, None]) ** 2) * w).sum(dim=1)
        n = self.count + n_b
        safe_n = n.clamp(min=1)
        delta = mean_b - self.mean
        # Chan's merge; with n_b = 0 it leaves the stats unchanged, with count = 0 it takes chunk b.
        share = n_b / safe_n  # exactly 1 for the first chunk, so a uniform group's mean is exact
        mean = self.mean + delta * share
        m2 = self.m2 + m2_b + delta**2 * self.count * share
        return GroupStats(count=n, mean=mean, m2=m2)

    def std(self, unbiased: bool = True) -> Tensor:
        """Per-group std `[B]`; 0 for groups with fewer than two valid rollouts (unbiased)."""
        dof = self.count - 1 if unbiased else self.count
        var = torch.where(dof > 0, self.m2 / dof.clamp(min=1), torch.zeros_like(self.m2))
        return var.sqrt()


def group_stats(
    rewards: Tensor, valid: Tensor | None = None, chunk_size: int | None = None
) -> GroupStats:
    """Per-group stats of rewards `[B, N]`, reduced over N in chunks of `chunk_size` rollouts."""
    num_groups, n = rewards.shape
    step = n if chunk_size is None else chunk_size
    if step < 1:
        raise ValueError(f"chunk_size must be a positive number of rollouts, got {chunk_size}.")
    stats = GroupStats.empty(num_groups, rewards.device)
    for start in range(0, n, step):
        chunk_valid = None if valid is None else valid[:, start : start + step]
        stats = stats.update(rewards[:, start : start + step], chunk_valid)
    return stats


def _checked(rewards: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
    """(float64 rewards with invalid slots set to 0, bool mask), both `[B, N]`."""
    mask = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    if mask.shape != rewards.shape:
        raise ValueError(
            f"valid has shape {tuple(mask.shape)} but rewards has {tuple(rewards.shape)}; "
            "pass one bool per rollout, [B, N]."
        )
    bad = mask & ~torch.isfinite(rewards)
    if bad.any():
        where = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"reward {rewards[where].item()} at (prompt, rollout) {where} is not finite; "
            "the verifier must return finite rewards, or mark the rollout invalid."
        )
    return torch.where(mask, rewards.to(torch.float64), 0.0), mask


def reinforce_pp_baseline_advantages(
    rewards: Tensor, valid: Tensor | None = None, chunk_size: int | None = None, eps: float = 1e-8
) -> Tensor:
    """REINFORCE++-baseline: rewards `[B, N]` -> advantages `[B, N]` (0 where not valid).

    A = R - mean_group(R); then (A - mean_batch(A)) / sqrt(var_batch(A) + eps) with the batch mean
    and population variance over all valid rollouts of the global batch (the ProRLv2 blog post).
    mean_batch(A) is zero identically (each group's centred rewards sum to zero), so it is not
    subtracted: this keeps the advantage of a uniform group exactly 0 rather than about 1e-17.
    """
    r, mask = _checked(rewards, valid)
    stats = group_stats(r, mask, chunk_size)
    centred = torch.where(mask, r - stats.mean[:, None], 0.0)
    batch_var = (centred**2).sum() / mask.sum().clamp(min=1)
    out = centred * torch.rsqrt(batch_var + eps)
    return out.to(rewards.dtype)


def grpo_advantages(
    rewards: Tensor, valid: Tensor | None = None, chunk_size: int | None = None, eps: float = 1e-6
) -> Tensor:
    """GRPO: rewards `[B, N]` -> (R - mean_group) / (std_group + eps) `[B, N]`, 0 where not valid.

    std_group is the unbiased (N - 1) std, as in verl and TRL (ProRL (arXiv 2505.24864) §2 leaves
    it unstated).
    """
    r, mask = _checked(rewards, valid)
    stats = group_stats(r, mask, chunk_size)
    centred = torch.where(mask, r - stats.mean[:, None], 0.0)
    out = centred / (stats.std(unbiased=True)[:, None] + eps)
    return out.to(rewards.dtype)


def compute_advantages(
    rewards: Tensor,
    estimator: AdvantageEstimator,
    valid: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Advantages `[B, N]` from rewards `[B, N]` with the named estimator."""
    match estimator:
        case "reinforce_pp_baseline":
            return reinforce_pp_baseline_advantages(rewards, valid, chunk_size)
        case "grpo":
            return grpo_advantages(rewards, valid, chunk_size)
        case _:
            raise ValueError(
                f"unknown advantage estimator {estimator!r}; use 'reinforce_pp_baseline' or 'grpo'."
            )


def token_advantages(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """Broadcast sequence advantages `[B, N]` (or `[B*N]`) to tokens: `[B*N, T]`, 0 on padding.

    Rollout b*N + i of the token batch is rollout i of prompt b (row-major flattening).
    """
    flat = advantages.reshape(-1)
    if flat.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"{flat.shape[0]} advantages for {response_mask.shape[0]} response rows; "
            "response_mask must be [B*N, T] with rollouts in prompt-major order."
        )
    return flat[:, None] * response_mask.to(flat.dtype)
