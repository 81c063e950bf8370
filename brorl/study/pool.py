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
2. `choose`: the difficulty band, then the hold-out, then the pool. The band is the prompts
   solved at least `pool.min_solves` times, hardest first (lowest estimate, ties by id), up to
   the longest prefix whose predicted ProRL pass rate (the mean of 1 - p^N - (1-p)^N at the
   baseline arm's N, `keep_rate`) stays at or below the centre of `pool.target`. Before any
   prompt of the band goes to the pool, `pool.holdout_fraction` of each family's band prompts
   (drawn by `pool.seed`) become the hold-out split: the study's test split, from the same
   difficulty band as the prompts the arms train on. The pool is the rest of the band; refused
   when its predicted pass rate leaves `pool.target`, below `pool.min_prompts`, or when a family
   has fewer than `pool.holdout_min_per_family` hold-out prompts.
3. `write_pool`: the pool as a data folder (train = the pool; holdout = the hold-out; validation
   and test copied unchanged: the full test split is the study's secondary no-harm check) and
   `pool.json` (each prompt's counts, the band, the hold-out's ids, the histogram of the start's
   pass rates over the train split, the pool and the hold-out, the predicted pass rates at
   N = 16 and 512, the share of groups BroRL's N rescues).

Deliberately ignored: re-estimating during the runs (the pool is fixed before any run), per-family
quotas (the pool follows the start's difficulty wherever it lies).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from brorl.runs.files import atomic_write_text
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
    from brorl.families import verify_batch
    from brorl.families.prompts import render_prompt

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


def solve_counter(params: ExperimentParams, policy: Path) -> Callable[..., np.ndarray]:
    """`count(problems, n, seed)`: `count_solves` for the policy at `policy` on the hf engine, at
    the training sampling (`generate`), judged by the `verify` section, correct at
    `filter.correct_reward`."""
    from brorl.engines import EngineConfig, build_engine
    from brorl.policy import load_policy
    from brorl.verifiers import VerifyConfig

    g = params.generate
    model, tokenizer = load_policy(policy)
    config = dataclasses.replace(EngineConfig.from_params(params), kind="hf")
    engine = build_engine(config, model=model, tokenizer=tokenizer, model_path=policy,
                          max_model_len=0)
    settings = dict(temperature=g.temperature, top_p=g.top_p,
                    max_response_tokens=g.max_response_tokens,
                    correct_reward=params.filter.correct_reward,
                    verify=VerifyConfig.from_params(params.verify))

    def count(problems: Sequence[Problem], n: int, seed: int) -> np.ndarray:
        return count_solves(engine, tokenizer, problems, n, seed=seed, **settings)

    return count


def estimate(params: ExperimentParams, policy: Path, problems: Sequence[Problem]) -> dict[str, Any]:
    """Per train prompt, correct rollouts and tries of the policy at `policy` (module docstring,
    step 1): `{"ids", "families", "tasks", "solves", "tries"}`, in `problems` order."""
    pool = params.study.pool
    count = solve_counter(params, policy)
    solves = count(problems, pool.samples, pool.seed * 1_000_003)
    tries = np.full(len(problems), pool.samples)
    rare = np.flatnonzero(solves <= pool.rare_below)
    if len(rare):
        solves[rare] += count([problems[i] for i in rare], pool.rare_samples,
                              pool.seed * 1_000_003 + 500_000)
        tries[rare] += pool.rare_samples
    return {"ids": [p.id for p in problems], "families": [p.family for p in problems],
            "tasks": [f"{p.family}/{p.task}" for p in problems],
            "solves": solves.tolist(), "tries": tries.tolist()}


def band(estimates: dict[str, Any], params: ExperimentParams) -> tuple[list[int], float]:
    """The difficulty band (module docstring, step 2): indices into the estimates, hardest
    first, and the band's predicted ProRL pass rate (NaN when empty)."""
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
    return order[:size], float(running[size - 1]) if size else float("nan")


def hold_out(indices: Sequence[int], families: Sequence[str], fraction: float,
             seed: int) -> tuple[list[int], list[int]]:
    """(hold-out, rest) of `indices`: per family (in sorted order), ceil(fraction x its count)
    drawn by `np.random.default_rng(seed)`; both lists keep the order of `indices`."""
    rng = np.random.default_rng(seed)
    held: set[int] = set()
    for family in sorted({families[i] for i in indices}):
        members = [i for i in indices if families[i] == family]
        take = math.ceil(fraction * len(members) - 1e-9)
        held.update(members[j] for j in rng.permutation(len(members))[:take])
    return [i for i in indices if i in held], [i for i in indices if i not in held]


def choose(estimates: dict[str, Any], params: ExperimentParams) -> dict[str, Any]:
    """The band, the hold-out drawn from it, and the pool (module docstring, step 2):
    `{"ids", "holdout_ids", "band", "predicted_pass_rate", "excluded_unsolved"}`, ids hardest
    first. A ValueError naming the fix when the pool or the hold-out falls short."""
    pool, study = params.study.pool, params.study
    n = study.arms[study.baseline].update["rollouts_per_prompt"]
    solves, tries = np.asarray(estimates["solves"]), np.asarray(estimates["tries"])
    p = solves / tries
    inside, band_rate = band(estimates, params)
    held, rest = hold_out(inside, estimates["families"], pool.holdout_fraction, pool.seed)
    rate = float(keep_rate(p[rest], n).mean()) if rest else float("nan")
    low, high = pool.target
    if len(rest) < pool.min_prompts or not low <= rate <= high:
        raise ValueError(
            f"no prompt pool of at least {pool.min_prompts} train prompts has a predicted ProRL "
            f"pass rate (N = {n}) in {list(pool.target)}: the band holds the hardest "
            f"{len(inside)} (predicted {band_rate:.3f}), the pool after the hold-out "
            f"{len(rest)} (predicted {rate:.3f}; {int((solves >= pool.min_solves).sum())} "
            f"solved at least {pool.min_solves} times). Use harder or more train data (data "
            "section), widen study.pool.target or lower study.pool.holdout_fraction.")
    per_family = Counter(estimates["families"][i] for i in held)
    short = {f: per_family.get(f, 0) for f in sorted({estimates["families"][i] for i in inside})
             if per_family.get(f, 0) < pool.holdout_min_per_family}
    if short:
        raise ValueError(
            f"the hold-out split holds too few prompts of {short} (study.pool."
            f"holdout_min_per_family = {pool.holdout_min_per_family}): use more train data of "
            "those families (data section) or raise study.pool.holdout_fraction.")
    ids = estimates["ids"]
    return {"ids": [ids[i] for i in rest], "holdout_ids": [ids[i] for i in held],
            "band": [float(p[inside].min()), float(p[inside].max())],
            "band_prompts": len(inside), "predicted_pass_rate": rate,
            "excluded_unsolved": int((solves < pool.min_solves).sum())}


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
    `pool.json`'s content. A frozen pool (`brorl.study.frozen`) is read back as it is."""
    from brorl.data import load_split, save_splits
    from brorl.study.frozen import check

    root = Path(root)
    if check(params, root, "pool"):  # a frozen pool is reused, never redrawn
        return json.loads((root / pool_dir(params) / POOL_FILE).read_text())
    study = params.study
    data = root / params.data.path
    train = load_split(data, "train")
    estimates = estimate(params, root / warmup_dir(params) / "policy", train)
    chosen = choose(estimates, params)
    keep, held = set(chosen["ids"]), set(chosen["holdout_ids"])
    save_splits({"train": [p for p in train if p.id in keep],
                 "holdout": [p for p in train if p.id in held],
                 "validation": load_split(data, "validation"), "test": load_split(data, "test")},
                root / pool_data(params))
    ns = sorted({a.update["rollouts_per_prompt"] for a in study.arms.values()})
    small, large = ns[0], ns[-1]
    record = {"predicted_pass_rate": chosen["predicted_pass_rate"],
              "excluded_unsolved": chosen["excluded_unsolved"], "target": list(study.pool.target),
              "band": chosen["band"], "band_prompts": chosen["band_prompts"],
              "holdout_fraction": study.pool.holdout_fraction,
              "n_small": small, "n_large": large,
              "train": summary(estimates, estimates["ids"], small, large),
              "pool": summary(estimates, chosen["ids"], small, large),
              "holdout": summary(estimates, chosen["holdout_ids"], small, large),
              "pool_ids": chosen["ids"], "holdout_ids": chosen["holdout_ids"],
              "estimates": estimates}
    atomic_write_text(root / pool_dir(params) / POOL_FILE, json.dumps(record, indent=1) + "\n")
    return record
