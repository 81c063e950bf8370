"""Verification overlapped with generation (`brorl.train.verification`): the chunks the hf engine
hands over are verified on a background thread while the next chunk decodes, with the rewards,
order and seeds of verifying after generation."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from brorl.engines.hf import HfEngine
from brorl.evaluation.protocol import EvalProtocol
from brorl.params import load_params
from brorl.policy import build_tokenizer
from brorl.train import Run, RunConfig, Trainer, TrainerConfig
from brorl.train.diagnostics import DiagnosticsConfig
from brorl.train.verification import ChunkVerifier
from brorl.types import Problem
from brorl.verifiers import Verdict, VerifyConfig
from tests.stand_ins import TrainerCollection
from tests.tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = [Problem(id=f"p{i}", family="math", task="t", prompt=f"{i}+{i}=", answer=str(2 * i))
            for i in range(3)]


def _by_length(problems, responses) -> list[Verdict]:
    """A deterministic reward of each response alone (its length's parity)."""
    return [Verdict(float(len(r) % 2), f"length {len(r)}") for r in responses]


class EngineTrainer(TrainerCollection):
    """The real `Trainer`'s generation and verification methods (and its collection methods)
    over a tiny policy and the hf engine, without DeepSpeed (nothing here updates weights)."""

    generate_rollouts = Trainer.generate_rollouts
    verify = Trainer.verify

    def __init__(self, reward_fn) -> None:
        config = TrainerConfig.from_params(load_params(ROOT / "params" / "tiny_ci.yaml"))
        self.config = replace(config, prompts_per_step=3, rollouts_per_prompt=4,
                              max_response_tokens=12,
                              engine=replace(config.engine, kind="hf", max_concurrent_rollouts=5))
        self.rank, self.world, self.step_count, self.step_offset = 0, 1, 0, 0
        self.resumed_state: dict = {}
        self.tokenizer = build_tokenizer()
        self.model = tiny_model("qwen2", len(self.tokenizer))
        self.rollout_engine = HfEngine(self.model, self.tokenizer, max_concurrent_rollouts=5)
        self.reward_fn = reward_fn


def _run(trainer: EngineTrainer, tmp_path: Path) -> Run:
    config = RunConfig(
        name="t", run_dir=str(tmp_path), root=str(tmp_path), data_path="-", steps=1,
        max_rollouts=None, min_steps=None, max_seconds=None, plateau_patience=None, eval_every=1,
        eval_steps=(), checkpoint_every=1, save_rollouts=False, eval_splits=("test",),
        eval_protocol=EvalProtocol(
            per_family=1, samples=1, temperature=1.0, top_p=1.0, max_response_tokens=8, seed=0,
            verify=VerifyConfig(workers=1), split_samples=()),
        diagnostics=DiagnosticsConfig(enabled=False, probes_per_family=1, step_probes=0,
                                      decompose=False, seed=0))
    return Run(trainer, config, {})


def test_each_chunk_is_verified_while_the_next_decodes_with_the_rewards_of_no_overlap(
        tmp_path, monkeypatch):
    """3 prompts x 4 rollouts in chunks of 5: the decoding of chunks 2 and 3 waits (up to 30 s)
    until the verification of the chunk before it has begun, so the run completes only if
    verification overlaps generation. The rewards, reasons and texts equal those of verifying
    the whole batch after generation, from the same seeds."""
    calls: list[tuple[str, int]] = []  # (thread, rows) per reward call
    begun = [threading.Event() for _ in range(3)]

    def reward(problems, responses):
        calls.append((threading.current_thread().name, len(responses)))
        begun[len(calls) - 1].set()
        return _by_length(problems, responses)

    decode, chunks = HfEngine._decode_chunk, []

    def waiting_decode(self, state, rows, *args):
        if chunks:  # chunk k waits for the verification of chunk k - 1 to begin
            assert begun[len(chunks) - 1].wait(timeout=30), "no verification during generation"
        chunks.append(len(rows))
        return decode(self, state, rows, *args)

    monkeypatch.setattr(HfEngine, "_decode_chunk", waiting_decode)
    trainer = EngineTrainer(reward)
    run = _run(trainer, tmp_path)
    collection = trainer.start_collection()
    share = run.generate_rollouts(PROBLEMS, collection).value
    groups = run.verify(PROBLEMS, share, collection).value
    assert chunks == [5, 5, 2]
    assert [rows for _, rows in calls] == [5, 5, 2]
    assert all(name.startswith("brorl-verify") for name, _ in calls)
    assert share.verifier.work_seconds > 0

    monkeypatch.setattr(HfEngine, "_decode_chunk", decode)
    plain = EngineTrainer(_by_length)  # the same weights (seeded), no overlap
    batch = plain.generate_rollouts(PROBLEMS, collection.rounds, 4)
    reference = plain.verify(PROBLEMS, batch)
    assert groups.batch.texts == reference.batch.texts
    assert torch.equal(groups.rewards, reference.rewards)
    assert groups.reasons == reference.reasons and groups.problems == reference.problems
    assert 0 < float(groups.rewards.mean()) < 1  # the parity reward is not constant here


def test_a_chunk_whose_background_verification_failed_is_verified_again_when_waited_for():
    problems = [PROBLEMS[0]] * 4
    texts = ["a", "bb", "ccc", "dddd"]
    failures = iter([RuntimeError("verifier crashed")])

    def flaky(problems, responses):
        error = next(failures, None)
        if error is not None:
            raise error
        return _by_length(problems, responses)

    verifier = ChunkVerifier(flaky, problems, n=1)
    verifier(0, 2, texts[:2])
    verifier(2, 4, texts[2:])
    assert verifier.result() == _by_length(problems, texts)

    def broken(problems, responses):
        raise RuntimeError("verifier down")

    verifier = ChunkVerifier(broken, problems, n=1)
    verifier(0, 4, texts)
    with pytest.raises(RuntimeError, match="verifier down"):
        verifier.result()
