"""Evaluation primitives: pass@k against brute force, scores by hand; what judges an evaluation;
what samples it (the rollout engine, one call, counter-based seeds keyed by instance)."""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from brorl.base import BaseConfig
from brorl.data import make_problem
from brorl.engines import HfEngine
from brorl.evaluation.protocol import REPLICATE_STRIDE, EvalProtocol
from brorl.evaluation.scoring import (
    instance_key,
    instance_scores,
    pass_at_k,
    problem_scores,
    sample_responses,
    score_rewards,
)
from brorl.families.math import generate_math
from brorl.params import load_params
from brorl.policy import build_policy, build_tokenizer
from brorl.train import TrainerConfig
from brorl.verifiers import Verdict, VerifyConfig
from brorl.verifiers.sandbox import SandboxLimits

ROOT = Path(__file__).resolve().parents[1]


def _brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """Share of all k-subsets of the n samples that hold at least one correct sample."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_brute_force_over_all_k_subsets(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_hand_values_and_stability():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # c / n
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0  # n - c < k
    # n = 1000 would overflow a float binomial; the product form stays exact.
    expected = 1 - math.comb(990, 100) / math.comb(1000, 100)
    assert pass_at_k(1000, 10, 100) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="at least k samples"):
        pass_at_k(3, 1, 4)


def test_problem_scores_count_only_full_rewards_as_correct():
    rewards = np.array([[1.0, 0.5, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    out = problem_scores(rewards, k_values=(1, 2))
    assert out["reward_mean"].tolist() == [0.625, 0.0]  # (1 + .5 + 0 + 1) / 4
    assert out["pass_at_1"].tolist() == [0.5, 0.0]  # 2 of 4 reach 1.0
    assert out["pass_at_2"][0] == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)


def test_family_score_is_mean_of_its_tasks_and_headline_follows_the_paper():
    problems = [
        make_problem("math", "a", "Compute 1 + 1.", answer="2"),
        make_problem("math", "a", "Compute 1 + 2.", answer="3"),
        make_problem("math", "b", "Compute 1 + 3.", answer="4"),
        make_problem("reasoning", "r", "Spell cat backward.", answer="tac"),
    ]
    rewards = np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.5, 1.0]])
    scores = score_rewards(problems, rewards)
    assert scores["task"]["math/a"]["pass_at_1"] == 0.5  # (1 + 0) / 2 problems
    assert scores["task"]["math/b"]["pass_at_1"] == 0.5  # 1 of 2 samples
    # math: mean of tasks a (0.5) and b (0.5), not of problems; its headline is pass@1
    assert scores["family"]["math"]["score"] == 0.5
    # reasoning's headline is the mean continuous reward (0.5 + 1) / 2, its pass@1 is 0.5
    assert scores["family"]["reasoning"]["score"] == 0.75
    assert scores["family"]["reasoning"]["pass_at_1"] == 0.5
    assert scores["overall"]["score"] == pytest.approx((0.5 + 0.75) / 2)


def test_instance_scores_give_avg_at_k_and_each_familys_headline():
    problems = [make_problem("math", "a", "Compute 2 + 2.", answer="4"),
                make_problem("code", "c", "Write f.", tests=("assert f() == 1",)),
                make_problem("reasoning", "r", "Spell dog backward.", answer="god")]
    rewards = np.array([[1.0, 0.0, 1.0, 1.0],    # math: 3 of 4 correct
                        [0.5, 1.0, 0.0, 0.25],   # code: partial credit, 1 of 4 fully correct
                        [0.5, 1.0, 0.0, 0.25]])  # reasoning: the same rewards
    out = instance_scores(problems, rewards)
    assert out["pass_at_1"] == [0.75, 0.25, 0.25]
    # math and code score pass@1; reasoning the mean reward (.5 + 1 + 0 + .25) / 4 = 0.4375
    assert out["score"] == [0.75, 0.25, 0.4375]
    with pytest.raises(ValueError, match="one row each"):
        instance_scores(problems[:2], rewards)


def _engine(max_concurrent_rollouts: int | str = "auto") -> HfEngine:
    """An hf rollout engine over a tiny random policy (its samples are varied text)."""
    tokenizer = build_tokenizer()
    model = build_policy(vocab_size=len(tokenizer), hidden_size=16, num_layers=1, num_heads=2,
                         num_kv_heads=1, intermediate_size=32, max_position_embeddings=256)
    return HfEngine(model, tokenizer, max_concurrent_rollouts=max_concurrent_rollouts)


def test_every_evaluation_judges_under_the_runs_verify_section(monkeypatch):
    """The run's evaluations and the base stage's checks judge with the `verify` section's
    workers, time limit and sandbox limits, as the rewards do (not the schema's defaults)."""
    import brorl.evaluation.scoring

    params = load_params(ROOT / "params/tiny_ci.yaml",
                         ["verify.workers=1", "verify.timeout_s=7", "verify.cpu_s=3"])
    expected = VerifyConfig(workers=1, timeout_s=7.0, limits=SandboxLimits(cpu_s=3))
    assert BaseConfig.from_params(params).verify == expected
    assert TrainerConfig.from_params(params).verify == expected
    seen = []

    def judge(problems, responses, config):
        seen.append(config)
        return [Verdict(0.0, "wrong")] * len(problems)

    monkeypatch.setattr(brorl.evaluation.scoring, "verify_batch", judge)
    protocol = replace(EvalProtocol.from_params(params), samples=1, max_response_tokens=4)
    engine = _engine()
    problems = generate_math(2, seed=0)
    row = protocol.score(engine, engine.tokenizer, problems, split="test")
    assert seen == [expected] and row["problem_ids"] == [p.id for p in problems]


def test_an_evaluation_samples_all_its_instances_in_one_engine_call():
    """The protocol samples through the engine it is given: one call for every instance, k
    rollouts each (one prefill per prompt), at the protocol's sampling, each prompt keyed by
    its instance's id."""
    params = load_params(ROOT / "params/tiny_ci.yaml", ["train.eval_samples=3"])
    protocol = replace(EvalProtocol.from_params(params), max_response_tokens=5)
    engine, calls = _engine(), []
    real = engine.generate
    engine.generate = lambda prompts, n, sampling, **kw: calls.append(
        (len(prompts), n, sampling)) or real(prompts, n, sampling, **kw)
    problems = generate_math(2, seed=0)  # 2 per math task
    row = protocol.score(engine, engine.tokenizer, problems, split="test")
    assert row["samples"] == 3 and len(calls) == 1
    count, n, sampling = calls[0]
    assert (count, n) == (len(problems), 3)
    assert sorted(engine.last_prefills) == list(range(len(problems)))  # each prompt once
    assert (sampling.temperature, sampling.top_p, sampling.max_response_tokens, sampling.seed) \
        == (protocol.temperature, protocol.top_p, 5, protocol.seed)
    assert sampling.prompt_keys == tuple(instance_key(p.id) for p in problems)


def test_instance_key_is_the_first_40_bits_of_the_ids_sha256():
    # sha256(b"math/add/0") starts with the hex digits computed here; 10 hex digits = 40 bits
    expected = int(hashlib.sha256(b"math/add/0").hexdigest()[:10], 16)
    assert instance_key("math/add/0") == expected < 2 ** 40
    assert instance_key("math/add/1") != expected


def test_an_instances_samples_do_not_depend_on_what_else_is_evaluated_with_it():
    """Counter-based evaluation seeds: an instance's k samples are the same alone, in a larger
    batch, in another order and in smaller engine chunks; another seed draws other samples."""
    problems = generate_math(1, seed=1)  # one per math task
    settings = dict(n=4, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=3)
    engine = _engine()
    whole = sample_responses(engine, engine.tokenizer, problems, **settings)
    assert len({r for rs in whole for r in rs}) > 10  # varied samples, not one repeated text
    alone = sample_responses(engine, engine.tokenizer, problems[2:3], **settings)
    shuffled = sample_responses(engine, engine.tokenizer, problems[::-1], **settings)
    chunked = _engine(max_concurrent_rollouts=3)
    small = sample_responses(chunked, chunked.tokenizer, problems[1:4], **settings)
    assert alone == whole[2:3] and shuffled == whole[::-1] and small == whole[1:4]
    other = sample_responses(engine, engine.tokenizer, problems, **{**settings, "seed": 4})
    assert other != whole


def test_a_split_takes_its_own_samples_and_a_replicate_its_own_sampling_seed():
    """`train.eval_split_samples` sets k per split (pass@k up to it); a replicate draws the same
    instances under another sampling seed, the same replicate the same samples."""
    params = load_params(ROOT / "params/tiny_ci.yaml", ["train.eval_samples=2",
                                                        "train.eval_split_samples.holdout=4"])
    protocol = replace(EvalProtocol.from_params(params), max_response_tokens=4)
    assert (protocol.samples_of("holdout"), protocol.samples_of("test")) == (4, 2)
    assert protocol.sampling()["split_samples"] == {"holdout": 4}
    engine, seeds = _engine(), []
    real = engine.generate
    engine.generate = lambda prompts, n, sampling, **kw: seeds.append(sampling.seed) or real(
        prompts, n, sampling, **kw)
    problems = generate_math(2, seed=0)
    row = protocol.score(engine, engine.tokenizer, problems, split="holdout")
    assert row["samples"] == 4 and {"pass_at_1", "pass_at_2", "pass_at_4"} <= set(
        row["scores"]["overall"])
    again = protocol.score(engine, engine.tokenizer, problems, split="holdout", replicate=1)
    same = protocol.score(engine, engine.tokenizer, problems, split="holdout", replicate=1)
    assert seeds == [protocol.seed, protocol.seed + REPLICATE_STRIDE,
                     protocol.seed + REPLICATE_STRIDE]
    assert again["problem_ids"] == row["problem_ids"] and same == again
    assert protocol.score(engine, engine.tokenizer, problems, split="test")["samples"] == 2
