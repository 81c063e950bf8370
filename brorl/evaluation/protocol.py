"""A run's evaluations: the protocol (which instances, how they are sampled), the eval record (one
row per (step, split)), and its metrics.

`EvalProtocol` is how a policy is evaluated, built once from the params (`from_params`): each
family's `per_family` instances drawn by `seed` (`sample_per_family`: the same instances at every
evaluation, and in every run with that seed), `samples` samples of each at `temperature` and
`top_p`, at most `max_response_tokens` tokens, sampled under `seed` by the run's rollout engine
(`generate.engine`; an instance's samples are keyed by its id, `brorl.evaluation.scoring.instance_key`). The
run's evaluations (`brorl.train.Run`, through its trainer's engine) and the `evaluate` stage
(`tasks/evaluate.py`, through `policy_engine`) score through `score`.

`RunState.evals` holds these rows (`eval_record`): {"step", "split" ("test" | "validation" |
"holdout"), "samples" (k),
"seconds" (training seconds so far, evaluation and checkpoints excluded), "rollouts" (generated
so far), "scores" (`brorl.evaluation.scoring.score_rewards` with k_values 1, 2, 4, ... up to k, k = samples
per instance: a split's `split_samples`, else `samples`), "problem_ids", "families", "pass_at_1" (per instance: the share of its k samples
that are correct, avg@k), "score" (per instance: the family's headline quantity,
`ProblemFamily.headline`, ProRL (arXiv 2505.24864) §3.4)}. Rows without "split" count as test rows
(`brorl.runs.legacy.eval_split`). `<run_dir>/evals.jsonl` holds them without "seconds" (`evals_jsonl`:
a DVC output holds no wall-clock figure); `read_run` puts the seconds back from
`<run_dir>.timings.json` (`brorl.runs.timings`), NaN where that file is missing.

`eval_metrics` names a row's figures: test rows `eval/<q>_<family>` (q: pass_at_1, pass_at_<k>,
reward_mean, score), `eval/score_mean` (the mean over families of the family score) and
`eval/pass_at_1_mean`; validation rows the same names under `val/`, hold-out rows under
`holdout/`. Model selection and the
plateau rule read `val/score_mean` only, never a test figure (issue: selection bias).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from brorl.evaluation.scoring import evaluate_policy, instance_scores
from brorl.runs.legacy import eval_split
from brorl.runs.timings import merge_run_timings, read_timings, split_timings
from brorl.types import Problem
from brorl.verifiers import VerifyConfig

if TYPE_CHECKING:
    from brorl.engines import RolloutEngine
    from brorl.params import ExperimentParams

PREFIX = {"test": "eval", "validation": "val", "holdout": "holdout"}
"""Metric prefix of each evaluated split."""
SELECTION_METRIC = "val/score_mean"
"""The one figure the plateau rule and the best evaluation follow."""


def row_split(row: dict[str, Any]) -> str:
    """The split of an eval row ("test" or "validation")."""
    return eval_split(row)


def rows_by_step(rows: Sequence[dict[str, Any]], split: str = "test") -> list[dict[str, Any]]:
    """The rows of `split`, the last one of each step winning (an older file may repeat a
    step), ordered by step."""
    last = {r["step"]: r for r in rows if row_split(r) == split}
    return [last[step] for step in sorted(last)]


def read_evals(path: str | Path, split: str = "test") -> list[dict[str, Any]]:
    """`rows_by_step` of an `evals.jsonl` file."""
    lines = Path(path).read_text().splitlines()
    return rows_by_step([json.loads(line) for line in lines if line.strip()], split)


def read_run(folder: str | Path, missing: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A finished run folder's `summary.json` and its test rows by step (`read_evals`), with the
    wall-clock figures of `<folder>.timings.json` put back (`brorl.runs.timings`): the summary's
    `train_seconds`, `eval_seconds` and `checkpoint_seconds` (NaN without that file), each
    step's timing metrics, each row's `seconds`.

    `missing` ends the error when a file is absent (how to produce it); a folder without test
    rows is refused (its run must evaluate the test split)."""
    folder = Path(folder)
    for name in ("summary.json", "evals.jsonl"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} is missing: {missing}")
    rows = read_evals(folder / "evals.jsonl", "test")
    if not rows:
        raise ValueError(f"{folder / 'evals.jsonl'} has no test rows: the run must evaluate the "
                         'test split (train.eval_splits must include "test").')
    summary = json.loads((folder / "summary.json").read_text())
    timings = read_timings(folder)
    for name in ("train_seconds", "eval_seconds", "checkpoint_seconds"):
        summary.setdefault(name, float(timings.get(name, math.nan)))
    merge_run_timings(summary.get("history", []), rows, timings)
    return summary, rows


def eval_record(step: int, split: str, seconds: float, rollouts: int,
                problems: Sequence[Problem], scores: dict[str, Any],
                rewards: np.ndarray) -> dict[str, Any]:
    """One eval row (see the module docstring) from `evaluate_policy`'s scores and rewards."""
    per = instance_scores(problems, rewards)
    return {"step": step, "split": split, "seconds": seconds, "rollouts": rollouts,
            "samples": int(rewards.shape[1]), "scores": scores, "problem_ids": [p.id for p in problems],
            "families": [p.family for p in problems], "pass_at_1": per["pass_at_1"],
            "score": per["score"]}


def sample_per_family(problems: Sequence[Problem], per_family: int, seed: int) -> list[Problem]:
    """Up to `per_family` problems of each family, drawn by `seed`, in id order."""
    groups: dict[str, list[Problem]] = {}
    for p in sorted(problems, key=lambda p: p.id):
        groups.setdefault(p.family, []).append(p)
    gen = torch.Generator().manual_seed(seed)
    out: list[Problem] = []
    for family in sorted(groups):
        order = torch.randperm(len(groups[family]), generator=gen)[:per_family].tolist()
        out += [groups[family][i] for i in sorted(order)]
    return out


@dataclass(frozen=True)
class EvalProtocol:
    """How a policy is evaluated (see the module docstring); no defaults: the schema has them
    (`train.eval_*`, `generate.max_response_tokens`)."""

    per_family: int
    samples: int
    temperature: float
    top_p: float
    max_response_tokens: int
    seed: int
    verify: VerifyConfig
    """How the samples are judged: the run's `verify` section, as its rewards are."""
    split_samples: tuple[tuple[str, int], ...]
    """(split, samples) where a split takes other than `samples` (`train.eval_split_samples`)."""

    @classmethod
    def from_params(cls, params: ExperimentParams) -> EvalProtocol:
        """`train.eval_*`, the rollouts' `generate.max_response_tokens` and the `verify`
        section."""
        return cls(**{name: getattr(params.train, f"eval_{name}")
                      for name in ("per_family", "samples", "temperature", "top_p", "seed")},
                   max_response_tokens=params.generate.max_response_tokens,
                   verify=VerifyConfig.from_params(params.verify),
                   split_samples=tuple(sorted(params.train.eval_split_samples.items())))

    def samples_of(self, split: str) -> int:
        """Samples per instance of `split`."""
        return dict(self.split_samples).get(split, self.samples)

    def instances(self, problems: Sequence[Problem]) -> list[Problem]:
        """The instances of a split that are scored: `per_family` of each family, by `seed`."""
        return sample_per_family(problems, self.per_family, self.seed)

    def sampling(self) -> dict[str, Any]:
        """What the scores depend on besides the policy and the instances."""
        out = {"samples": self.samples, "temperature": self.temperature, "top_p": self.top_p,
               "max_response_tokens": self.max_response_tokens, "seed": self.seed}
        if self.split_samples:
            out["split_samples"] = dict(self.split_samples)
        return out

    def score(self, engine: RolloutEngine, tokenizer, problems: Sequence[Problem], *, split: str,
              step: int = 0, seconds: float = 0.0, rollouts: int = 0,
              replicate: int = 0) -> dict[str, Any]:
        """The eval row of the policy `engine` samples from (the run's rollout engine) on
        `problems`: `samples_of(split)` samples of each instance (avg@k, pass@k for k = 1, 2, 4,
        ... up to them) under one seed: `seed`, or for `replicate` r > 0 (another draw of the
        same evaluation, e.g. a study's start scored several times) `seed + r *
        REPLICATE_STRIDE` on the same instances. An instance's samples depend on that seed, its
        id and the policy only (`brorl.evaluation.scoring.sample_responses`): not on the step, the split or
        the other instances, so every evaluation of a run, and every run of a study, draws an
        instance's samples from the same random numbers (differences between checkpoints are
        not differences between draws)."""
        n = self.samples_of(split)
        k_values = sorted({1, n, *(2 ** i for i in range(n.bit_length()) if 2 ** i <= n)})
        scores, rewards = evaluate_policy(
            engine, tokenizer, problems, n=n, k_values=k_values,
            max_new_tokens=self.max_response_tokens, temperature=self.temperature,
            top_p=self.top_p, seed=self.seed + replicate * REPLICATE_STRIDE, verify=self.verify)
        return eval_record(step, split, seconds, rollouts, problems, scores, rewards)


def policy_engine(params: ExperimentParams, path: str | Path) -> tuple[RolloutEngine, Any]:
    """(the rollout engine of `params`' `generate` section over the policy saved at `path`, its
    tokenizer): what a stage that evaluates a saved policy (`tasks/evaluate.py`) samples with,
    the engine its run trained with."""
    from brorl.engines import build_engine
    from brorl.engines.base import EngineConfig
    from brorl.policy import load_policy

    model, tokenizer = load_policy(path)
    engine = build_engine(EngineConfig.from_params(params), model=model, tokenizer=tokenizer,
                          model_path=path, max_model_len=model.config.max_position_embeddings)
    return engine, tokenizer


REPLICATE_STRIDE = 1_000_003
"""Sampling-seed distance between replicates of one evaluation (`EvalProtocol.score`)."""


def read_start(path: str | Path) -> dict[str, Any]:
    """A start evaluation scored once for several runs from one policy: `{"protocol":
    Run.eval_protocol(), "rows": [eval rows of step 0]}` and, optionally, `"replicates"` (the
    rows of further draws, `brorl.study.start`; `Run.train(start=)` reads `rows`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: score the start first (the study's "
                                "study_start stage, brorl study --start).")
    start = json.loads(path.read_text())
    if not {"protocol", "rows"} <= set(start) <= {"protocol", "rows", "replicates"} or any(
            r["step"] != 0 for r in start["rows"]):
        raise ValueError(f"{path}: not a start evaluation (protocol and step-0 rows); score it "
                         "again (brorl study --start).")
    return start


def eval_metrics(row: dict[str, Any]) -> dict[str, float]:
    """`<prefix>/<q>_<family>`, `<prefix>/score_mean` and `<prefix>/pass_at_1_mean` of a row."""
    prefix = PREFIX[row_split(row)]
    families = row["scores"]["family"]
    metrics = {f"{prefix}/{q}_{fam}": v for fam, fam_row in families.items()
               for q, v in fam_row.items()
               if q in ("reward_mean", "score") or q.startswith("pass_at_")}
    for q in ("score", "pass_at_1"):
        values = [fam_row[q] for fam_row in families.values()]
        metrics[f"{prefix}/{q}_mean"] = sum(values) / len(values) if values else math.nan
    return metrics


def evals_jsonl(rows: Sequence[dict[str, Any]]) -> str:
    """`evals.jsonl`'s text: one row per line, without its wall-clock `seconds`."""
    return "".join(json.dumps(split_timings(r)[0]) + "\n" for r in rows)
