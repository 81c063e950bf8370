"""Training on a subset of each group: PODS' max-variance down-sampling (Xu et al. 2025).

"Not All Rollouts are Useful: Down-Sampling Rollouts in LLM Reinforcement Learning" (PODS)
generates N rollouts per prompt and trains on M < N of them, chosen for the learning signal: the
M whose rewards have the largest variance. Its rule, exact for any rewards (the paper proves the
best subset is always some k highest plus M - k lowest; the tests check it against brute force):
sort the group's rewards, for k = 0..M take the k highest and the M - k lowest, keep the k with
the largest variance, the first k on ties. Generation then grows with N while the update's cost
is fixed by M (`update.train_subset`, `Trainer.update`).

Deterministic: the sort is stable, so among equal rewards the lowest picks are the earliest
rollouts and the highest picks the latest; "ties" are variances within 1e-9 x the group's squared
reward range (float rounding of the prefix sums), so equal variances never depend on summation
order. Deliberately ignored: PODS' other rule (max reward) and random down-sampling.
"""

from __future__ import annotations

import torch
from torch import Tensor

TIE_TOLERANCE = 1e-9
"""Variances within this fraction of the group's squared reward range count as equal."""


def max_variance_subset(rewards: Tensor, m: int) -> Tensor:
    """Rollout indices `[B, m]` (long, ascending in each row) of the max-variance m of each
    group of rewards `[B, N]` (PODS' rule, see the module docstring); 1 <= m <= N."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, N], got shape {tuple(rewards.shape)}.")
    b, n = rewards.shape
    if not 1 <= m <= n:
        raise ValueError(f"subset size m = {m} must be in 1..N = {n}: the rollouts kept per group.")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards hold non-finite values; the verifier must return finite rewards.")
    r = rewards.to(torch.float64)
    order = torch.argsort(r, dim=1, stable=True)  # ascending; equal rewards keep rollout order
    s = r.gather(1, order)
    s = s - s.mean(dim=1, keepdim=True)  # centred, so the sums below lose nothing to an offset
    zero = torch.zeros(b, 1, dtype=torch.float64)
    low, low_sq = (torch.cat([zero, x.cumsum(1)], 1) for x in (s, s * s))  # j lowest: [:, j]
    high, high_sq = (torch.cat([zero, x.flip(1).cumsum(1)], 1) for x in (s, s * s))
    k = torch.arange(m + 1)  # k highest plus m - k lowest
    mean = (low[:, m - k] + high[:, k]) / m
    var = (low_sq[:, m - k] + high_sq[:, k]) / m - mean**2  # [B, m + 1]
    slack = TIE_TOLERANCE * (s[:, -1] - s[:, 0]) ** 2
    near_best = var >= (var.amax(dim=1) - slack)[:, None]
    best = near_best.int().argmax(dim=1)  # the first k within rounding of the largest variance
    j = torch.arange(m)[None, :]
    position = torch.where(j < (m - best)[:, None], j, n - m + j)  # in the sorted order
    return order.gather(1, position).sort(dim=1).values
