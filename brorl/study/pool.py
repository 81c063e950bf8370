"""The study's RL prompt pool: train prompts chosen by the start policy's estimated pass rate.

The paper's BroRL continues a model whose dynamic-sampling pass rate under ProRL is 41% (BroRL
§4.2.4, Table 2): most of its groups are uniform, and some prompts it solves in fewer than 1 of 16
tries are what 512 rollouts reach. A pool of prompts the start policy mostly solves leaves no
such headroom (a pass rate near 90%), so the study picks its own pool from the train split
(never from validation or test):

1. `estimate`: the start policy's rollouts at the training temperature, `pool.samples` per train
   prompt, then `pool.rare_samples` more for each prompt solved at most `pool.rare_below` times
   (a pass rate below about 1/16 needs hundreds of tries to tell from 0); a rollout is correct
   at `filter.correct_reward` (the binary keep rule's threshold).
2. `choose`: the prompts solved at least `pool.min_solves` times, hardest first (lowest estimate,
   ties by id), up to the longest prefix whose predicted ProRL pass rate (the mean of
   1 - p^N - (1-p)^N at the baseline arm's N, `keep_rate`) stays at or below the centre of
   `pool.target`; refused outside the band or below `pool.min_prompts`.
3. `write_pool`: the pool as a data folder (train = the pool; validation and test copied
   unchanged, so every evaluation scores the pipeline's own held-out instances) and `pool.json`
   (each prompt's counts, the histogram of the start's pass rates, the predicted pass rates at
   N = 16 and 512, the share of groups BroRL's N rescues).

Deliberately ignored: re-estimating during the runs (the pool is fixed before any run), per-family
quotas (the pool follows the start's difficulty wherever it lies).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from brorl.files import atomic_write_text
from brorl.study.plan import pool_data, pool_dir, warmup_dir
from brorl.types import Problem

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.verifiers import VerifyConfig

POOL_FILE = "pool.json"
EDGES = (0.0, 1 / 512, 1 / 64, 1 / 16, 0.25, 0.5, 0.75, 15 / 16, 1.0)
"""Histogram bins of the estimated pass rates: exactly 0 and exactly 1 apart, the rest in
(EDGES[i], EDGES[i + 1]]; 1/16 and 1/512 are where N = 16 and N = 512 expect one solve."""


def keep_rate(p: np.ndarray, n: int) -> np.ndarray:
    """The binary keep rule's chance that a group of n rollouts is mixed: 1 - p^n - (1-p)^n."""
    p = np.asarray(p, dtype=float)
    return 1.0 - p ** n - (1.0 - p) ** n


def rescued(p: np.ndarray, small: int, large: int) -> np.ndarray:
    """Chance that a prompt's group is all-wrong at `small` rollouts but not at `large`:
    (1-p)^small - (1-p)^large (what broadening N adds to the pool's usable groups)."""
    q = 1.0 - np.asarray(p, dtype=float)
    return q ** small - q ** large


def histogram(p: np.ndarray) -> list[dict[str, Any]]:
    """Counts of pass rates per `EDGES` bin (0 and 1 as bins of their own)."""
    p = np.asarray(p, dtype=float)
    rows = [{"bin": "0", "count": int((p == 0).sum())}]
    for low, high in zip(EDGES[:-1], EDGES[1:]):
        inside = (p > low) & (p <= high) & (p < 1)
        rows.append({"bin": f"({low:.4g}, {high:.4g}]", "count": int(inside.sum())})
    rows.append({"bin": "1", "count": int((p == 1).sum())})
    return rows


def count_solves(engine, tokenizer, problems: Sequence[Problem], n: int, *, temperature: float,
                 top_p: float, max_response_tokens: int, seed: int, correct_reward: float,
                 verify: VerifyConfig, chunk_rollouts: int = 4096) -> np.ndarray:
    """`[len(problems)]` correct rollouts of n each, sampled by `engine` in chunks of prompts
    (each chunk its own seed, seed + chunk index) and judged by the family verifiers."""
    from brorl.engines import SamplingConfig
    from brorl.prompts import render_prompt
    from brorl.verifiers import verify_batch

    per_chunk = max(1, chunk_rollouts // n)
    solves = np.zeros(len(problems), dtype=int)
    for k, start in enumerate(range(0, len(problems), per_chunk)):
        chunk = list(problems[start:start + per_chunk])
        batch = engine.generate([render_prompt(p, tokenizer) for p in chunk], n, SamplingConfig(
            temperature=temperature, top_p=top_p, max_response_tokens=max_response_tokens,
            seed=seed + k))
        verdicts = verify_batch([p for p in chunk for _ in range(n)], batch.texts, verify)
        rewards = np.array([v.reward for v in verdicts]).reshape(len(chunk), n)
        solves[start:start + len(chunk)] = (rewards >= correct_reward).sum(axis=1)
    return solves


def estimate(params: ExperimentParams, policy: Path, problems: Sequence[Problem]) -> dict[str, Any]:
    """Per train prompt, correct rollouts and tries of the policy at `policy` (module docstring,
    step 1): `{"ids", "families", "tasks", "solves", "tries"}`, in `problems` order."""
    from brorl.engines import build_engine
    from brorl.policy import load_policy
    from brorl.train.config import EngineConfig
    from brorl.verifiers import VerifyConfig

    pool, g = params.study.pool, params.generate
    model, tokenizer = load_policy(policy)
    config = dataclasses.replace(EngineConfig.from_params(params), kind="hf")
    engine = build_engine(config, model=model, tokenizer=tokenizer, model_path=policy,
                          max_model_len=0)
    count = dict(temperature=g.temperature, top_p=g.top_p,
                 max_response_tokens=g.max_response_tokens,
                 correct_reward=params.filter.correct_reward,
                 verify=VerifyConfig.from_params(params.verify))
    solves = count_solves(engine, tokenizer, problems, pool.samples, seed=pool.seed * 1_000_003,
                          **count)
    tries = np.full(len(problems), pool.samples)
    rare = np.flatnonzero(solves <= pool.rare_below)
    if len(rare):
        more = count_solves(engine, tokenizer, [problems[i] for i in rare], pool.rare_samples,
                            seed=pool.seed * 1_000_003 + 500_000, **count)
        solves[rare] += more
        tries[rare] += pool.rare_samples
    return {"ids": [p.id for p in problems], "families": [p.family for p in problems],
            "tasks": [f"{p.family}/{p.task}" for p in problems],
            "solves": solves.tolist(), "tries": tries.tolist()}


def choose(estimates: dict[str, Any], params: ExperimentParams) -> dict[str, Any]:
    """The pool from the estimates (module docstring, step 2): its ids, hardest first, and what
    it predicts: `{"ids", "predicted_pass_rate", "excluded_unsolved"}`. A ValueError when no pool
    in `pool.target` with at least `pool.min_prompts` prompts exists."""
    pool, study = params.study.pool, params.study
    n = study.arms[study.baseline].update["rollouts_per_prompt"]
    solves, tries = np.asarray(estimates["solves"]), np.asarray(estimates["tries"])
    p = solves / tries
    eligible = [i for i in range(len(p)) if solves[i] >= pool.min_solves]
    order = sorted(eligible, key=lambda i: (p[i], estimates["ids"][i]))
    running = np.cumsum(keep_rate(p[order], n)) / np.arange(1, len(order) + 1)
    low, high = pool.target
    below = np.flatnonzero(running <= (low + high) / 2)
    size = int(below[-1]) + 1 if len(below) else 0
    rate = float(running[size - 1]) if size else float("nan")
    if size < pool.min_prompts or not low <= rate <= high:
        raise ValueError(
            f"no prompt pool of at least {pool.min_prompts} train prompts has a predicted ProRL "
            f"pass rate (N = {n}) in {list(pool.target)}: the hardest {size} give {rate:.3f} "
            f"(of {len(eligible)} solved at least {pool.min_solves} times). Use harder or more "
            "train data (data section), or widen study.pool.target.")
    return {"ids": [estimates["ids"][i] for i in order[:size]], "predicted_pass_rate": rate,
            "excluded_unsolved": len(p) - len(eligible)}


def summary(estimates: dict[str, Any], ids: Sequence[str], n_small: int,
            n_large: int) -> dict[str, Any]:
    """What the report shows of the start's pass rates over `ids` (the train split or the pool):
    counts, the mean pass rate, the histogram, predicted keep rates at both N, the share of
    prompts under 1/n_small and of groups BroRL's N rescues, per family and task."""
    index = {i: k for k, i in enumerate(estimates["ids"])}
    rows = [index[i] for i in ids]
    p = np.array([estimates["solves"][k] / estimates["tries"][k] for k in rows])
    return {"prompts": len(rows), "mean_pass": float(p.mean()),
            "histogram": histogram(p),
            f"keep_rate_n{n_small}": float(keep_rate(p, n_small).mean()),
            f"keep_rate_n{n_large}": float(keep_rate(p, n_large).mean()),
            "share_below_one_in_n": float(((p > 0) & (p < 1 / n_small)).mean()),
            "share_rescued": float(rescued(p, n_small, n_large).mean()),
            "families": dict(Counter(estimates["families"][k] for k in rows)),
            "tasks": dict(Counter(estimates["tasks"][k] for k in rows))}


def write_pool(params: ExperimentParams, root: Path | str = ".") -> dict[str, Any]:
    """Estimate, choose and save the pool under `<out_dir>/pool/` (module docstring); returns
    `pool.json`'s content."""
    from brorl.data import load_split, save_splits

    root = Path(root)
    study = params.study
    data = root / params.data.path
    train = load_split(data, "train")
    estimates = estimate(params, root / warmup_dir(params) / "policy", train)
    chosen = choose(estimates, params)
    keep = set(chosen["ids"])
    save_splits({"train": [p for p in train if p.id in keep],
                 "validation": load_split(data, "validation"), "test": load_split(data, "test")},
                root / pool_data(params))
    ns = sorted({a.update["rollouts_per_prompt"] for a in study.arms.values()})
    small, large = ns[0], ns[-1]
    record = {"predicted_pass_rate": chosen["predicted_pass_rate"],
              "excluded_unsolved": chosen["excluded_unsolved"], "target": list(study.pool.target),
              "n_small": small, "n_large": large,
              "train": summary(estimates, estimates["ids"], small, large),
              "pool": summary(estimates, chosen["ids"], small, large),
              "pool_ids": chosen["ids"], "estimates": estimates}
    atomic_write_text(root / pool_dir(params) / POOL_FILE, json.dumps(record, indent=1) + "\n")
    return record
