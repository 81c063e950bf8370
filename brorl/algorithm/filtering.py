"""Dynamic sampling (DAPO; BroRL §3.1, NeMo-RL's ProRLv2 example config): keep only informative
groups, refill on a budget.

Two keep rules (`filter.keep_rule`):
- `binary` (the paper's, the default): keep a group iff 0 < #correct < N, a rollout being correct
  when its reward is >= `correct_reward` (BroRL §3.1: 0 < sum_i 1(M_i = M_correct) < N). A code
  or reasoning group with partial credit but no fully correct rollout is dropped.
- `any_difference`: keep a group whose rewards are not all equal, tested exactly (max != min), so
  partial credit counts. Unlike a filter on the mean score (OpenRLHF#1270) it drops a uniform
  group of 0.3s; unlike a leave-one-out std (NeMo-RL#3469) it never splits a group.

`collect_informative` draws prompts' groups through a callback until it holds the target number
of kept groups, the draw budget is spent, or the rollout cap (`max_groups` groups, the run's
remaining rollout budget) is reached. It then returns what it kept, flagged, rather than raising
(verl#953) or looping forever (verl's `max_num_gen_batches=0`). Its stats hold both rules' pass
rates whatever rule is active: rollouts of generated groups that pass / rollouts generated (the
paper's Table 2 quantity, 41% for ProRL vs 62% for BroRL, BroRL §4.2.4).

Groups of different sizes (adaptive allocation) arrive padded to one width with a `valid` mask
`[B, N]` (an optional `valid` attribute of the draw, None when every slot is real): both rules
and every count then see only the real rollouts.

Deliberately ignored: soft band-pass filters (verl#2791) and per-rollout validity (a failed rollout
should carry the reward the verifier gives it, e.g. 0 for truncation, as in NeMo-RL's ProRLv2
example config).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, Self, TypeVar

import torch
from torch import Tensor

if TYPE_CHECKING:
    from brorl.params.rl import KeepRule


class GroupBatch(Protocol):
    """What a draw returns: rewards `[b, N]` for b prompts, and a way to keep some of them."""

    @property
    def rewards(self) -> Tensor: ...

    def select(self, index: Tensor) -> Self:
        """The sub-batch of the groups at `index` (`[k]` long, ascending)."""
        ...


G = TypeVar("G", bound=GroupBatch)


def _check(rewards: Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, N], got shape {tuple(rewards.shape)}.")
    if not torch.isfinite(rewards).all():
        raise ValueError(
            f"rewards hold non-finite values ({rewards[~torch.isfinite(rewards)][:3].tolist()}); "
            "NaN would make a uniform group look informative: give failed rollouts a finite reward."
        )


def informative_groups(rewards: Tensor, valid: Tensor | None = None) -> Tensor:
    """bool `[B]` from rewards `[B, N]`: True where a group's rewards (its `valid` ones) are not
    all equal (exactly)."""
    _check(rewards)
    if valid is None:
        return rewards.amax(dim=1) != rewards.amin(dim=1)
    high = torch.where(valid, rewards, -torch.inf).amax(dim=1)
    low = torch.where(valid, rewards, torch.inf).amin(dim=1)
    return high != low


def mixed_outcome_groups(rewards: Tensor, correct_reward: float = 1.0,
                         valid: Tensor | None = None) -> Tensor:
    """bool `[B]` from rewards `[B, N]`: True where 0 < #(reward >= correct_reward) < the
    group's size (N, or its `valid` count)."""
    _check(rewards)
    hits = rewards >= correct_reward
    if valid is None:
        correct, size = hits.sum(dim=1), rewards.shape[1]
    else:
        correct, size = (hits & valid).sum(dim=1), valid.sum(dim=1)
    return (correct > 0) & (correct < size)


@dataclass
class FilterStats:
    """Counters of one `collect_informative` call (groups = prompts, rollouts = their real rollouts:
    groups x N, or the `valid` count of padded groups).

    `groups_informative` counts groups passing the active rule; `rollouts_binary` and
    `rollouts_any_difference` count rollouts of groups passing each rule, active or not.
    """

    rounds: int = 0
    groups_generated: int = 0
    rollouts_generated: int = 0
    groups_informative: int = 0
    rollouts_binary: int = 0
    rollouts_any_difference: int = 0
    groups_kept: int = 0
    rollouts_kept: int = 0
    groups_all_correct: int = 0
    groups_all_wrong: int = 0
    groups_uniform_other: int = 0
    groups_none_correct: int = 0
    groups_surplus: int = 0
    budget_exhausted: bool = False
    source_exhausted: bool = False
    rollout_cap_reached: bool = False
    keep_rule: KeepRule = "binary"

    def _rate(self, rollouts: int) -> float:
        return rollouts / self.rollouts_generated if self.rollouts_generated else 0.0

    @property
    def pass_rate_binary(self) -> float:
        """Rollouts of groups with 0 < #correct < N / rollouts generated; 0 before any draw."""
        return self._rate(self.rollouts_binary)

    @property
    def pass_rate_any_difference(self) -> float:
        """Rollouts of groups whose rewards are not all equal / rollouts generated."""
        return self._rate(self.rollouts_any_difference)

    @property
    def pass_rate(self) -> float:
        """The active rule's pass rate: the paper's dynamic-sampling pass rate (BroRL Table 2)."""
        return self.pass_rate_binary if self.keep_rule == "binary" \
            else self.pass_rate_any_difference

    @property
    def kept_rate(self) -> float:
        """Rollouts kept for the update / rollouts generated: below `pass_rate` by the dropped
        surplus, above it when the filter is off (every group kept)."""
        return self._rate(self.rollouts_kept)

    def as_metrics(self) -> dict[str, float]:
        """Metrics named `filter/<quantity>` (see docs/metrics.md)."""
        names = (
            "rounds groups_generated rollouts_generated groups_informative groups_kept "
            "rollouts_kept groups_all_correct groups_all_wrong groups_uniform_other "
            "groups_none_correct groups_surplus"
        ).split()
        metrics = {f"filter/{n}": float(getattr(self, n)) for n in names}
        metrics["filter/rollouts_wasted"] = float(self.rollouts_generated - self.rollouts_kept)
        metrics.update({f"filter/{n}": getattr(self, n) for n in (
            "pass_rate", "pass_rate_binary", "pass_rate_any_difference", "kept_rate")})
        for flag in ("budget_exhausted", "source_exhausted", "rollout_cap_reached"):
            metrics[f"filter/{flag}"] = float(getattr(self, flag))
        return metrics


@dataclass
class KeptGroups(Generic[G]):
    """The informative groups kept, in draw order, one piece per round, and the stats."""

    pieces: list[G] = field(default_factory=list)
    stats: FilterStats = field(default_factory=FilterStats)

    @property
    def num_groups(self) -> int:
        return self.stats.groups_kept

    def rewards(self) -> Tensor:
        """Rewards `[K, N]` of the kept groups (K = groups_kept); `[0, 0]` when none was kept."""
        if not self.pieces:
            return torch.zeros(0, 0)
        return torch.cat([p.rewards for p in self.pieces], dim=0)


class InformativeCollector(Generic[G]):
    """The refill loop of `collect_informative` one draw at a time, for callers that own the loop
    (a pipeline running generation and verification as separate tasks):

        collector = InformativeCollector(target_groups, max_draws)
        while not collector.done:
            collector.add(draw(collector.request()))
        kept = collector.result()
    """

    def __init__(self, target_groups: int, max_draws: int, oversample: float = 1.0,
                 correct_reward: float = 1.0, wrong_reward: float = 0.0,
                 keep_uniform: bool = False, keep_rule: KeepRule = "binary",
                 max_groups: int | None = None) -> None:
        if target_groups < 1:
            raise ValueError(
                f"target_groups must be >= 1, got {target_groups}; it is prompts per step.")
        if max_draws < 1:
            raise ValueError(f"max_draws must be >= 1, got {max_draws}; it bounds the refill rounds.")
        if not oversample >= 1.0:
            raise ValueError(
                f"oversample must be >= 1, got {oversample}; 1 asks for exactly the missing groups."
            )
        if max_groups is not None and max_groups < 1:
            raise ValueError(
                f"max_groups must be >= 1 or None, got {max_groups}: a step that cannot afford one "
                "group of N rollouts must not start (the run stops first).")
        self.target_groups, self.max_draws, self.oversample = target_groups, max_draws, oversample
        self.correct_reward, self.wrong_reward = correct_reward, wrong_reward
        self.keep_uniform, self.max_groups = keep_uniform, max_groups
        self.out: KeptGroups[G] = KeptGroups(stats=FilterStats(keep_rule=keep_rule))

    @property
    def stats(self) -> FilterStats:
        return self.out.stats

    @property
    def done(self) -> bool:
        """True once the target is met, the draw budget is spent, the source ran dry or the
        rollout cap is reached."""
        s = self.out.stats
        return (s.groups_kept >= self.target_groups or s.rounds >= self.max_draws
                or s.source_exhausted or s.rollout_cap_reached)

    def request(self) -> int:
        """How many prompts' groups the next draw should bring: ceil(missing * oversample),
        at most what the rollout cap leaves."""
        s = self.out.stats
        wanted = math.ceil((self.target_groups - s.groups_kept) * self.oversample)
        if self.max_groups is None:
            return wanted
        return min(wanted, self.max_groups - s.groups_generated)

    def add(self, batch: G) -> None:
        """Count one draw's groups and keep those the rule passes, up to the target."""
        if self.done:
            raise RuntimeError("the collector is done; call result() instead of drawing again.")
        stats = self.out.stats
        stats.rounds += 1
        rewards = batch.rewards
        if rewards.shape[0] == 0:
            stats.source_exhausted = True
            return
        valid = getattr(batch, "valid", None)
        real = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid
        sizes = real.sum(dim=1)  # [b]; slot 0 of every group is real
        binary = mixed_outcome_groups(rewards, self.correct_reward, valid)
        different = informative_groups(rewards, valid)
        passing = binary if stats.keep_rule == "binary" else different
        uniform = rewards[~different, 0]
        stats.groups_all_correct += int((uniform >= self.correct_reward).sum())
        stats.groups_all_wrong += int((uniform <= self.wrong_reward).sum())
        stats.groups_uniform_other += int(
            ((uniform > self.wrong_reward) & (uniform < self.correct_reward)).sum())
        stats.groups_none_correct += int(
            (((rewards >= self.correct_reward) & real).sum(1) == 0).sum())
        stats.groups_generated += rewards.shape[0]
        stats.rollouts_generated += int(sizes.sum())
        stats.groups_informative += int(passing.sum())
        stats.rollouts_binary += int(sizes[binary].sum())
        stats.rollouts_any_difference += int(sizes[different].sum())
        keep = torch.ones_like(passing) if self.keep_uniform else passing
        index = keep.nonzero().flatten()
        room = self.target_groups - stats.groups_kept
        stats.groups_surplus += max(index.numel() - room, 0)
        index = index[:room]
        if index.numel():
            self.out.pieces.append(batch.select(index))
            stats.groups_kept += index.numel()
            stats.rollouts_kept += int(sizes[index].sum())
        if self.max_groups is not None and stats.groups_generated >= self.max_groups:
            stats.rollout_cap_reached = True

    def result(self) -> KeptGroups[G]:
        """The kept groups and stats (`budget_exhausted` set when the draw budget ran out
        before the target; not when the source or the rollout cap ended the loop)."""
        stats = self.out.stats
        stats.budget_exhausted = (stats.groups_kept < self.target_groups
                                  and not stats.source_exhausted and not stats.rollout_cap_reached)
        return self.out


def collect_informative(
    draw: Callable[[int], G],
    target_groups: int,
    max_draws: int,
    oversample: float = 1.0,
    correct_reward: float = 1.0,
    wrong_reward: float = 0.0,
    keep_uniform: bool = False,
    keep_rule: KeepRule = "binary",
    max_groups: int | None = None,
) -> KeptGroups[G]:
    """Draw groups until `target_groups` pass `keep_rule`, `max_draws` draws are made, or
    `max_groups` groups were generated.

    Each round asks `draw(n)` for n = min(ceil(missing * oversample), max_groups - generated)
    new prompts' groups, with rewards `[b, N]` (b may differ from n; b = 0 means the prompt
    source is empty and ends the loop). Passing groups are kept up to the target; the excess of
    the last round is counted as surplus. Uniform groups are counted as all-correct (value >=
    `correct_reward`), all-wrong (value <= `wrong_reward`) or other; groups without one correct
    rollout as none-correct. `keep_uniform=True` (dynamic sampling off) keeps every group, so
    one draw normally suffices, with the same stats. Never raises for lack of groups: check
    `stats.budget_exhausted` (and `source_exhausted`, `rollout_cap_reached`).
    """
    collector: InformativeCollector[G] = InformativeCollector(
        target_groups, max_draws, oversample, correct_reward, wrong_reward, keep_uniform,
        keep_rule, max_groups)
    while not collector.done:
        collector.add(draw(collector.request()))
    return collector.result()
