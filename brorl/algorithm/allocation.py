"""Adaptive rollouts per prompt: how a step's remaining rollout budget is spread over its prompts.

After a first round of n0 rollouts per prompt, each prompt's pass rate is estimated (the
Beta(1, 1) posterior mean, (c + 1) / (n + 2) for c correct of n, so 0/n0 and n0/n0 are never
certain), and the rest of the budget goes to the prompts where it buys most learning signal,
each prompt capped at `cap` rollouts in all. The value of a group of n rollouts at pass rate p is
Knapsack RL's (arXiv 2509.25849): the probability that the group carries a
gradient at all, P(0 < #correct < n) = 1 - p^n - (1 - p)^n (the dynamic-sampling keep rule),
times the information a rollout carries, p (1 - p):

    value(n, p) = p (1 - p) (1 - p^n - (1 - p)^n).

value is concave in n, so handing out the budget one rollout at a time to the largest marginal
gain is the knapsack's optimum; `allocate` takes the top-`budget` marginal gains of all prompts at
once, which is the same choice. The budget goes where a group's chance of carrying a gradient is
still low and more rollouts raise it most: prompts that look hard (0 of n0) or nearly solved
(n0 of n0) get the most, a prompt whose first round is already mixed (its group is kept anyway)
the least. This is Knapsack RL's finding too (most rollouts on hard prompts) and BroRL's case
for large N (BroRL §2, §4.1: unsampled correct paths are the ones that shrink).

Deliberately ignored: carrying pass-rate estimates across steps (GRESO, prime-rl's difficulty
pool); the allocation is made from this step's first round only.
"""

from __future__ import annotations

import torch
from torch import Tensor


def pass_rate_estimate(correct: Tensor, seen: Tensor) -> Tensor:
    """Beta(1, 1) posterior mean of each prompt's pass rate: (c + 1) / (n + 2), float64 `[b]`."""
    return (correct.double() + 1.0) / (seen.double() + 2.0)


def group_value(n: Tensor, p: Tensor) -> Tensor:
    """p (1 - p) (1 - p^n - (1 - p)^n): the learning signal of a group of n at pass rate p."""
    n, p = n.double(), p.double()
    return p * (1 - p) * (1 - p**n - (1 - p) ** n)


def allocate(correct: Tensor, seen: Tensor, budget: int, cap: int) -> Tensor:
    """Extra rollouts `[b]` long per prompt, summing to min(budget, room): `correct` and `seen`
    are each prompt's first-round counts `[b]`, `cap` the most rollouts a prompt gets in all.
    Ties go to the earlier prompt (a stable order), so the allocation is deterministic."""
    if correct.shape != seen.shape or correct.dim() != 1:
        raise ValueError(f"correct {tuple(correct.shape)} and seen {tuple(seen.shape)} must both "
                         "be [b]: one count per prompt of the first round.")
    if budget < 0 or cap < 1:
        raise ValueError(f"budget ({budget}) must be >= 0 and cap ({cap}) >= 1.")
    if bool((correct < 0).any() | (correct > seen).any() | (seen > cap).any()):
        raise ValueError("each prompt needs 0 <= correct <= seen <= cap; got correct "
                         f"{correct.tolist()}, seen {seen.tolist()}, cap {cap}.")
    b = correct.shape[0]
    room = cap - seen  # [b]
    if b == 0 or budget == 0 or int(room.max()) == 0:
        return torch.zeros(b, dtype=torch.long)
    p = pass_rate_estimate(correct, seen)
    k = torch.arange(1, int(room.max()) + 1, dtype=torch.float64)  # the k-th extra rollout
    totals = seen.double()[:, None] + k[None, :]  # [b, K]
    gains = group_value(totals, p[:, None]) - group_value(totals - 1, p[:, None])
    gains = torch.where(k[None, :] <= room.double()[:, None], gains,
                        torch.full_like(gains, -torch.inf))
    take = min(budget, int(room.sum()))
    # prompt-major flat order: a stable sort keeps the earlier prompt (and its earlier rollout)
    # first among equal gains
    order = torch.sort(-gains.reshape(-1), stable=True).indices[:take]
    return torch.bincount(order // gains.shape[1], minlength=b)
