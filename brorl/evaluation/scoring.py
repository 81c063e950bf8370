"""Scoring a policy: unbiased pass@k, per-task and per-family scores, per-instance scores.

The primitives every evaluation uses (the run's, the `evaluate` stage's, the base stage's); how a
run evaluates (which instances, how many samples, the sampling) and the row it records are
`brorl.evaluation.protocol`'.

- `pass_at_k(n, c, k)`: the unbiased estimator of Chen et al. (2021, Codex) from n samples with c
  correct, 1 - C(n-c, k) / C(n, k), computed as a stable product (no huge binomials).
- `score_rewards`: from rewards `[B, n]` (n rollouts per problem), each problem's mean reward and
  pass@k (a rollout counts as correct when its reward is >= `success_threshold`, 1.0: binary as the
  paper's pass@1), then means per task, per family and overall. A family's score averages its tasks
  (the paper's "Avg" columns average benchmarks, BroRL Tables 3-5); the headline score is the
  family's `headline` (`brorl.families`): pass@1 for math and code, the mean continuous reward for
  reasoning (ProRL (arXiv 2505.24864) §3.4 protocol).
- `instance_scores`: the same per instance (avg@k pass@1 and the headline score), the unit of the
  paired tests and of the bootstrap over instances.
  Paired tests over them live in `brorl.evaluation.stats.paired_test`.
- `evaluate_policy`: render with `brorl.families.prompts`, sample through the run's rollout engine (the
  rollouts' sampler, `brorl.engines`: each prompt prefilled once for its k samples, each
  instance's samples keyed by its id, `instance_key`), score with
  `brorl.families.verify_batch` (the same code as the RL reward).

Deliberately ignored: per-benchmark context limits, RG's unknown "Avg" weighting (BroRL Table 5 does
not say how it is formed).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from brorl.families import family, verify_batch
from brorl.families.prompts import render_prompt
from brorl.types import Problem
from brorl.verifiers import VerifyConfig

if TYPE_CHECKING:
    from brorl.engines import RolloutEngine



def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples, c of them correct: 1 - prod_{i=n-c+1..n} (1 - k/i)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}; "
                         "draw at least k samples per problem.")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def problem_scores(rewards: np.ndarray, k_values: Sequence[int],
                   success_threshold: float = 1.0) -> dict[str, np.ndarray]:
    """Per-problem scores from rewards `[B, n]`: `reward_mean` and `pass_at_{k}`, each `[B]`."""
    rewards = np.asarray(rewards, dtype=float)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [B, n], got shape {rewards.shape}.")
    n = rewards.shape[1]
    correct = (rewards >= success_threshold).sum(axis=1)
    out = {"reward_mean": rewards.mean(axis=1)}
    for k in k_values:
        out[f"pass_at_{k}"] = np.array([pass_at_k(n, int(c), k) for c in correct])
    return out


def _mean_of_groups(values: dict[str, np.ndarray], keys: list[str]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        groups[key].append(i)
    return {key: {name: float(v[idx].mean()) for name, v in values.items()}
            for key, idx in sorted(groups.items())}


def score_rewards(problems: Sequence[Problem], rewards: np.ndarray,
                  k_values: Sequence[int] = (1,), success_threshold: float = 1.0) -> dict:
    """Scores per task ("family/task"), per family (mean of its tasks) and overall.

    Returns {"task": {...}, "family": {fam: {..., "score": headline}}, "overall": {...}}, where
    each leaf maps `reward_mean` / `pass_at_{k}` to a float and `overall` averages the families.
    """
    if len(problems) != len(rewards):
        raise ValueError(f"{len(problems)} problems but {len(rewards)} reward rows; one row each.")
    per_problem = problem_scores(rewards, k_values, success_threshold)
    tasks = _mean_of_groups(per_problem, [f"{p.family}/{p.task}" for p in problems])
    families: dict[str, dict[str, float]] = {}
    for fam in sorted({p.family for p in problems}):
        rows = [v for key, v in tasks.items() if key.split("/")[0] == fam]
        families[fam] = {name: float(np.mean([r[name] for r in rows])) for name in per_problem}
        families[fam]["score"] = families[fam][family(fam).headline]
    overall = {name: float(np.mean([f[name] for f in families.values()]))
               for name in (*per_problem, "score")}
    return {"task": tasks, "family": families, "overall": overall}


def instance_scores(problems: Sequence[Problem], rewards: np.ndarray,
                    success_threshold: float = 1.0) -> dict[str, list[float]]:
    """Per instance, in order: `pass_at_1` (the share of its k samples that are correct: avg@k)
    and `score` (its family's headline quantity, `ProblemFamily.headline`: pass@1 for math and
    code, the mean continuous reward for reasoning). What a paired test over instances compares."""
    if len(problems) != len(rewards):
        raise ValueError(f"{len(problems)} problems but {len(rewards)} reward rows; one row each.")
    per = problem_scores(rewards, (1,), success_threshold)
    return {"pass_at_1": per["pass_at_1"].tolist(),
            "score": [float(per[family(p.family).headline][i]) for i, p in enumerate(problems)]}


INSTANCE_KEY_BITS = 40
"""Bits of an instance's sampling key (`instance_key`): the engines' bound on prompt keys
(`brorl.engines.base.PROMPT_KEYS`)."""


def instance_key(problem_id: str) -> int:
    """An evaluation instance's sampling key: the first 40 bits of the SHA-256 of its id. Its k
    samples are rollouts 0..k-1 of this key (`SamplingConfig.prompt_keys`), so they depend on the
    instance, the seed and the policy only, not on the other instances of the evaluation."""
    digest = hashlib.sha256(problem_id.encode()).digest()
    return int.from_bytes(digest, "big") >> (256 - INSTANCE_KEY_BITS)


def sample_responses(engine: RolloutEngine, tokenizer, problems: Sequence[Problem], *, n: int,
                     max_new_tokens: int, temperature: float, top_p: float, seed: int
                     ) -> list[list[str]]:
    """n responses per problem `[B][n]` from one call of the rollout engine (each prompt
    prefilled once and shared by its n samples); temperature 0 is greedy.

    Counter-based: sample j of a problem is rollout j of its `instance_key` under `seed`, so the
    same problem gets the same responses whatever else is sampled with it, in whatever order
    and however the engine chunks the call."""
    from brorl.engines import SamplingConfig  # transformers loads with the engine, not here

    sampling = SamplingConfig(temperature=temperature, top_p=top_p,
                              max_response_tokens=max_new_tokens, seed=seed,
                              prompt_keys=tuple(instance_key(p.id) for p in problems))
    batch = engine.generate([render_prompt(p, tokenizer) for p in problems], n, sampling)
    return [list(batch.texts[i * n:(i + 1) * n]) for i in range(len(problems))]


def evaluate_policy(engine: RolloutEngine, tokenizer, problems: Sequence[Problem], *, n: int,
                    max_new_tokens: int, temperature: float, top_p: float, seed: int,
                    k_values: Sequence[int] = (1,), verify: VerifyConfig = VerifyConfig()
                    ) -> tuple[dict, np.ndarray]:
    """Sample n responses per problem through `engine` (`sample_responses`: at most
    `max_new_tokens` tokens, `temperature` 0 greedy, nucleus `top_p`, `seed`), judge them under
    `verify`, score them: (scores, rewards `[B, n]`)."""
    responses = sample_responses(engine, tokenizer, problems, n=n, max_new_tokens=max_new_tokens,
                                 temperature=temperature, top_p=top_p, seed=seed)
    flat_problems = [p for p in problems for _ in range(n)]
    verdicts = verify_batch(flat_problems, [r for rs in responses for r in rs], verify)
    rewards = np.array([v.reward for v in verdicts], dtype=float).reshape(len(problems), n)
    return score_rewards(problems, rewards, k_values), rewards
