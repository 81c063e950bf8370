"""One step's dynamic sampling, a draw at a time: the filter, the adaptive allocation's two rounds,
and the generation figures of a step (`Collection`, whose `finish` gives a `Collected`).

`brorl.train.trainer.Trainer.start_collection` opens one per step; `brorl.train.run.Run` feeds
it each engine call's verified groups until the filter is done (BroRL §3.1: dynamic sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from brorl.algorithm.allocation import allocate
from brorl.algorithm.filtering import FilterStats, InformativeCollector, mixed_outcome_groups
from brorl.train.rollouts import ScoredGroups, concat, merge_rounds
from brorl.types import Problem


@dataclass
class Collected:
    """What `Collection.finish` returns: the kept groups (None if none), filter stats, figures."""

    groups: ScoredGroups | None
    stats: FilterStats
    metrics: dict[str, float]
    drawn: tuple[tuple[Problem, bool], ...] = ()
    """Every drawn prompt, kept or not, with whether some rollout of it was correct (reward >=
    the filter's `correct_reward`): the shrinkage diagnostics' sampled / unsampled split."""


class Collection:
    """One step's dynamic sampling, a draw at a time: the filter plus generation figures.

    With an `allocation` (`update.allocation: adaptive`) a draw of m prompts takes two engine
    calls: a first round of n0 rollouts each, then the rest of its m x N rollouts spread by
    `brorl.algorithm.allocation.allocate` (one rollout per row, each prompt repeated by its
    share); the two rounds are merged into padded groups (`merge_rounds`) before the filter.
    `rollouts_per_prompt` and `second_round_problems` tell the run what the next call is."""

    def __init__(self, collector: InformativeCollector, rollouts_per_prompt: int,
                 allocation: tuple[int, int] | None) -> None:
        self.collector = collector
        self.n = rollouts_per_prompt
        self.allocation = allocation
        """(n0, cap) of the adaptive allocation; None: N per prompt in one call."""
        self.totals = {"generate": 0.0, "verify": 0.0, "verify_work": 0.0, "tokens": 0.0,
                       "reward_sum": 0.0, "truncated": 0.0}
        self.drawn: list[tuple[Problem, bool]] = []
        self.calls = 0
        self.pending: ScoredGroups | None = None
        """The first round of an adaptive draw, waiting for its extra rollouts."""
        self.extra: torch.Tensor | None = None
        self.sizes: list[int] = []
        self.alloc = {"extra": 0.0, "extra_uniform": 0.0, "first_mixed": 0.0, "rescued": 0.0,
                      "first_uniform": 0.0}

    @property
    def done(self) -> bool:
        return self.pending is None and self.collector.done

    @property
    def rounds(self) -> int:
        """Engine calls so far: the draw index of the next call's seed (one per filter round
        with fixed N, two per round with the adaptive allocation)."""
        return self.calls

    @property
    def rollouts_per_prompt(self) -> int:
        """Rollouts per listed prompt of the next engine call: N, n0, or 1 (second round)."""
        if self.allocation is None:
            return self.n
        return 1 if self.pending is not None else self.allocation[0]

    def request(self) -> int:
        """Prompts to draw next."""
        return self.collector.request()

    def second_round_problems(self) -> list[Problem]:
        """The pending first round's problems, each repeated by its extra rollouts."""
        if self.pending is None or self.extra is None:
            raise RuntimeError("no first round is waiting for its extra rollouts.")
        return [p for p, k in zip(self.pending.problems, self.extra.tolist()) for _ in range(k)]

    def add(self, groups: ScoredGroups, seconds: dict[str, float] | None = None) -> None:
        """Count one engine call's verified rollouts (`seconds`: its generate / verify times,
        and `verify_work`, the reward function's own seconds, most of them during generation);
        filter its groups, or with the adaptive allocation allocate after a first round and
        filter the merged groups after the second."""
        for key, value in (seconds or {}).items():
            self.totals[key] += value
        self.calls += 1
        self.totals["tokens"] += float(groups.batch.response_lengths.sum())
        self.totals["reward_sum"] += float(groups.rewards.sum())
        self.totals["truncated"] += sum(r == "length" for r in groups.batch.finish_reasons)
        if self.allocation is not None and groups.num_groups:
            if self.pending is None:
                groups = self._first_round(groups)
                if groups is None:
                    return
            else:
                groups = self._second_round(groups)
        valid = groups.valid_mask()
        solved = ((groups.rewards >= self.collector.correct_reward) & valid).any(dim=1).tolist()
        self.drawn += list(zip(groups.problems, solved))
        self.sizes += valid.sum(dim=1).tolist()
        self.collector.add(groups)

    def _first_round(self, first: ScoredGroups) -> ScoredGroups | None:
        """Allocate the draw's remaining rollouts; the merged groups if none is left to spend."""
        n0, cap = self.allocation
        correct = (first.rewards >= self.collector.correct_reward).sum(dim=1)
        seen = torch.full_like(correct, n0)
        budget = first.num_groups * (self.n - n0)
        self.extra = allocate(correct, seen, budget, cap)
        mixed = mixed_outcome_groups(first.rewards, self.collector.correct_reward)
        self.alloc["first_mixed"] += float(mixed.sum())
        self.alloc["first_uniform"] += float((~mixed).sum())
        self.alloc["extra"] += float(self.extra.sum())
        self.alloc["extra_uniform"] += float(self.extra[~mixed].sum())
        self.pending = first
        if int(self.extra.sum()) == 0:
            return self._second_round(None)
        return None

    def _second_round(self, second: ScoredGroups | None) -> ScoredGroups:
        first, extra = self.pending, self.extra
        self.pending = self.extra = None
        merged = merge_rounds(first, second, extra, self.allocation[1])
        c = self.collector.correct_reward
        was_mixed = mixed_outcome_groups(first.rewards, c)
        now_mixed = mixed_outcome_groups(merged.rewards, c, merged.valid)
        self.alloc["rescued"] += float((now_mixed & ~was_mixed).sum())
        return merged

    def finish(self) -> Collected:
        kept = self.collector.result()
        stats, totals = kept.stats, self.totals
        rollouts, gen_s = max(stats.rollouts_generated, 1), totals["generate"]
        metrics = {
            "generate/rollouts": float(stats.rollouts_generated),
            "generate/seconds": gen_s,
            "generate/rollouts_per_s": stats.rollouts_generated / gen_s if gen_s else 0.0,
            "generate/tokens_per_s": totals["tokens"] / gen_s if gen_s else 0.0,
            "generate/response_length_mean": totals["tokens"] / rollouts,
            "generate/truncated_frac": totals["truncated"] / rollouts,
            "verify/reward_mean": totals["reward_sum"] / rollouts,
            "verify/seconds": totals["verify"],
            "verify/work_seconds": totals["verify_work"],
            **stats.as_metrics(),
        }
        if self.allocation is not None and self.sizes:
            a = self.alloc
            metrics.update({
                "alloc/group_size_min": float(min(self.sizes)),
                "alloc/group_size_max": float(max(self.sizes)),
                "alloc/group_size_mean": sum(self.sizes) / len(self.sizes),
                "alloc/extra_rollouts": a["extra"],
                "alloc/extra_to_uniform_frac": a["extra_uniform"] / a["extra"] if a["extra"] else 0.0,
                "alloc/first_round_mixed": a["first_mixed"],
                "alloc/first_round_uniform": a["first_uniform"],
                "alloc/groups_rescued": a["rescued"],
            })
        return Collected(concat(kept.pieces) if kept.pieces else None, stats, metrics,
                         tuple(self.drawn))
