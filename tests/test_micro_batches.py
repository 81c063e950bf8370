"""Micro-batches by token budget (`brorl.train.micro`), scoring across prompt groups, the sync-free
micro-batch loop and the step's `perf/*` figures, on tiny Qwen2 and GPT-2 models (CPU, offline).

The batch has rows of very different lengths (1 to 60 tokens) over prompts of different lengths,
so the row-padded layout computes mostly padding and the token budget must cut it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from brorl.algorithm.losses import LossConfig
from brorl.engines.base import assemble_batch
from brorl.params import UpdateParams
from brorl.train.micro import PREFILL_SHARE, cost, plan
from brorl.train.perf import TRAIN_FACTOR, ModelShape, forward_flops, perf_metrics, plan_totals
from brorl.train.ppo import accumulate_mini_batch, micro_batches, score_batch
from brorl.train.rollouts import response_mask
from tests.tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[1]
LOSS = replace(LossConfig.from_params(UpdateParams()), kl_coef=0.1, tis_cap=1.05)
LENGTHS = [1, 60, 3, 2, 41, 7, 60, 1, 5, 33, 2, 9, 58, 4, 1, 17, 3, 60, 6, 2, 12, 1, 49, 8]
"""Response lengths of 6 prompts x 4 rollouts."""


def _batch(vocab: int):
    gen = torch.Generator().manual_seed(0)
    prompts = [tuple(torch.randint(3, vocab, (k,), generator=gen).tolist())
               for k in (5, 23, 9, 31, 14, 2)]
    lengths = torch.tensor(LENGTHS)
    tokens = torch.randint(3, vocab, (len(LENGTHS), 60), generator=gen)
    tokens[torch.arange(60)[None, :] >= lengths[:, None]] = 0
    logprobs = -torch.rand(len(LENGTHS), 60, generator=gen) * (tokens != 0)
    return assemble_batch(prompts, 4, tokens, logprobs, lengths, [""] * len(LENGTHS),
                          [True] * len(LENGTHS), pad_id=0)


@pytest.fixture(scope="module", params=["qwen2", "gpt2"])  # shared prefix, plain attention
def setup(request):
    model = tiny_model(request.param, 200)
    for module in model.modules():  # GPT-2's dropout would make training-mode passes differ
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model, _batch(200)


@pytest.mark.parametrize("budget", [64, 200, 1000])
def test_every_row_is_in_one_micro_batch_within_the_budget(setup, budget):
    model, batch = setup
    rows = torch.randperm(24, generator=torch.Generator().manual_seed(1))
    parts = micro_batches(model, batch, rows, 16, budget)
    assert sorted(torch.cat([m.rows for m in parts]).tolist()) == sorted(rows.tolist())
    for m in parts:
        assert len(m.rows) <= 16
        alone = int((batch.response_lengths[m.rows] > 1).sum()) == 1  # one row needs a forward
        assert m.computed <= budget or alone, (m.computed, len(m.rows))
        assert m.t == int(batch.response_lengths[m.rows].max())
        assert [m.prompts[s] for s in m.slot.tolist()] == batch.prompt_index[m.rows].tolist()


def test_the_budget_cuts_padding_by_the_computed_amount(setup):
    """Row-padded (8 rows by prompt) against 200 positions: the computed positions of each plan
    are what `cost` gives for its micro-batches, and the budget's padding share is below half
    of the row-padded one's on these lengths."""
    model, batch = setup
    shared = model.config.model_type == "qwen2"
    rows = torch.arange(24)
    padded = micro_batches(model, batch, rows, 8, None)
    budget = micro_batches(model, batch, rows, 8, 200)

    def share(parts) -> float:
        computed = sum(m.computed for m in parts)
        return (computed - sum(m.valid for m in parts)) / computed

    for parts in (padded, budget):
        for m in parts:
            groups = batch.prompt_index[m.rows].tolist()
            prompts = [len(batch.prompt_ids[b]) for b in (sorted(set(groups)) if shared
                                                          else groups)]
            if m.lanes is None:
                assert m.computed == cost(prompts, batch.response_lengths[m.rows].tolist(),
                                          shared)
            else:  # packed: the prompts' prefill, then lanes x width
                assert m.computed == len(prompts) * max(prompts) + len(m.lanes.slot) * m.lanes.width
    assert share(budget) < share(padded) / 2, (share(budget), share(padded))


def test_packed_lanes_hold_each_row_once_within_their_width():
    """Shared prefix: each row's tokens 0..k-2 sit in one lane of its own prompt, no two rows
    overlap, every lane fits its width; the rows of many lengths leave less padding packed than
    bucketed (the same plan without `pack`). Plain attention buckets rows, it does not pack."""
    model, batch = tiny_model("qwen2", 200), _batch(200)
    assert all(m.lanes is None for m in micro_batches(tiny_model("gpt2", 200), batch,
                                                      torch.arange(24), 8, 200))
    rows = torch.arange(24)
    packed = micro_batches(model, batch, rows, 8, 200)
    bucketed = plan(batch.prompt_ids, batch.prompt_index, batch.response_lengths, rows,
                    max_rows=8, max_tokens=200, shared=True)
    for m in packed:
        lanes = m.lanes
        assert lanes is not None and len(lanes.lane) == len(m.rows)
        taken: set[tuple[int, int]] = set()
        for row, slot, lane, start in zip(m.rows.tolist(), m.slot.tolist(),
                                          lanes.lane.tolist(), lanes.offset.tolist()):
            k = int(batch.response_lengths[row])
            if k < 2:
                continue
            assert lanes.slot[lane] == slot  # the lane continues the row's own prompt
            cells = {(lane, start + j) for j in range(k - 1)}
            assert start + k - 1 <= lanes.width and not cells & taken
            taken |= cells
        assert len(taken) == m.valid - sum(len(batch.prompt_ids[b]) for b in m.prompts)

    def share(parts) -> float:
        computed = sum(m.computed for m in parts)
        return (computed - sum(m.valid for m in parts)) / computed

    assert share(packed) < share(bucketed), (share(packed), share(bucketed))


def test_prompt_windows_keep_prefills_a_small_share():
    """Shared prefix: the prompts of a micro-batch fill at most 1/PREFILL_SHARE of the budget
    (unless one prompt alone is longer)."""
    prompts = [tuple(range(k)) for k in (40, 10, 30, 20, 50)]
    index = torch.arange(5).repeat_interleave(3)
    lengths = torch.tensor([4, 9, 2] * 5)
    parts = plan(prompts, index, lengths, torch.arange(15), max_rows=64, max_tokens=200,
                 shared=True)
    for m in parts:
        window = sum(len(prompts[b]) for b in m.prompts)
        assert window <= 200 // PREFILL_SHARE or len(m.prompts) == 1
    # scoring prefills each prompt once, for the first micro-batch that needs it
    once, again = (plan(prompts, index, lengths, torch.arange(15), max_rows=2, max_tokens=200,
                        shared=True, prefill_once=scoring) for scoring in (True, False))
    responses = sum(int(k) - 1 for k in lengths)
    assert sum(m.valid for m in once) == sum(map(len, prompts)) + responses
    assert sum(m.valid for m in again) > sum(m.valid for m in once)  # the update prefills again


def _grads(model, batch, budget, micro=8):
    model.zero_grad(set_to_none=True)
    mask = response_mask(batch)
    adv = torch.linspace(-1, 1, 24)[:, None] * mask
    with torch.no_grad():
        old = score_batch(model, batch, 1.0, 64) - 0.05 * mask  # ratios != 1: clipping is live
    rows = torch.tensor([0, 1, 4, 5, 6, 9, 11, 12, 15, 17, 18, 22, 23])
    metrics = accumulate_mini_batch(
        model, lambda loss: loss.backward(), batch, rows, advantages=adv, old_logp=old,
        engine_logp=old + 0.1 * mask, ref_logp=old, temperature=1.0, micro_batch_rollouts=micro,
        normaliser=float(mask[rows].sum()), max_tokens=budget, loss=LOSS)
    return [p.grad.clone() for p in model.parameters()], metrics


def test_token_budget_loss_and_gradients_equal_the_row_padded_ones(setup):
    model, batch = setup
    model.train()
    padded, padded_metrics = _grads(model, batch, None)
    assert sum(float(g.abs().sum()) for g in padded) > 0
    for budget in (64, 300):
        grads, metrics = _grads(model, batch, budget)
        for a, b in zip(padded, grads):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
        assert metrics.keys() == padded_metrics.keys()
        for key, value in padded_metrics.items():
            assert metrics[key] == pytest.approx(value, abs=1e-6), key
    model.zero_grad(set_to_none=True)
    model.eval()


def test_scoring_across_groups_gives_the_per_group_log_probs(setup):
    model, batch = setup
    model.eval()
    across = score_batch(model, batch, 0.8, 16, max_tokens=150)
    for b in range(6):
        rows = torch.arange(4 * b, 4 * b + 4)
        alone = score_batch(model, batch, 0.8, 4, rows=rows, max_tokens=None)
        torch.testing.assert_close(across[rows], alone[rows], atol=1e-5, rtol=0)


class _Reads(TorchDispatchMode):
    """Counts host reads (`.item()`, `int()`, `bool()` of a tensor) dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default):
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_the_micro_batch_loop_reads_nothing_back(setup, monkeypatch):
    """Inside every micro-batch (forward, loss, backward) no value is read back to the host;
    the metrics are read once, after the loop."""
    import brorl.train.ppo as ppo

    model, batch = setup
    model.train()
    counts = []

    def counted(fn):
        def run(*args, **kwargs):
            with _Reads() as mode:
                out = fn(*args, **kwargs)
            counts.append(mode.reads)
            return out
        return run

    monkeypatch.setattr(ppo, "micro_logprobs", counted(ppo.micro_logprobs))
    monkeypatch.setattr(ppo, "policy_loss", counted(ppo.policy_loss))
    mask = response_mask(batch)
    zeros = torch.zeros(batch.response_ids.shape)
    accumulate_mini_batch(
        model, counted(lambda loss: loss.backward()), batch, torch.arange(24),
        advantages=mask.float(), old_logp=zeros, engine_logp=zeros, ref_logp=zeros,
        temperature=1.0, micro_batch_rollouts=8, normaliser=float(mask.sum()), max_tokens=200,
        loss=LOSS)
    model.zero_grad(set_to_none=True)
    model.eval()
    assert len(counts) >= 9 and not any(counts), counts


def test_throughput_figures_equal_a_hand_computation(setup):
    """`perf/*` from the plans and a fake clock: tokens per second, the padding share and the
    MFU from 2 FLOPs per body weight per real position, 2 per head weight per predicted token,
    4 x layers x width per attended key, 3x for training."""
    model, batch = setup
    shape = ModelShape.of(model)
    config = model.config
    width = config.num_attention_heads * (config.hidden_size // config.num_attention_heads)
    assert shape.layers == config.num_hidden_layers and shape.attention_width == width
    assert shape.head_params == config.vocab_size * config.hidden_size
    update = micro_batches(model, batch, torch.arange(24), 8, 200)
    scoring = micro_batches(model, batch, torch.arange(12), 8, 100)
    by_hand = 0.0
    for m in update:
        prompts = [len(batch.prompt_ids[b]) for b in batch.prompt_index[m.rows].tolist()]
        shared = model.config.model_type == "qwen2"
        prefilled = [len(batch.prompt_ids[b]) for b in m.prompts] if shared else prompts
        own = batch.response_lengths[m.rows].tolist()
        positions = sum(prefilled) + sum(k - 1 for k in own)
        keys = sum(p * (p + 1) // 2 for p in prefilled) + sum(
            (k - 1) * p + (k - 1) * k // 2 for p, k in zip(prompts, own))
        by_hand += 2 * shape.body_params * positions + 2 * shape.head_params * sum(own) \
            + 4 * shape.layers * width * keys
    assert forward_flops(shape, update) == pytest.approx(by_hand)
    computed = sum(m.computed for m in update + scoring)
    valid = sum(m.valid for m in update + scoring)
    totals = plan_totals(shape, update, scoring)
    out = perf_metrics(totals, update_s=2.0, scoring_s=0.5, trained_tokens=400.0, peak=1e12)
    assert out["perf/tokens_per_s"] == 200.0
    assert out["perf/padding_share"] == pytest.approx((computed - valid) / computed)
    assert out["perf/mfu"] == pytest.approx(TRAIN_FACTOR * by_hand / 2e12)
    assert out["perf/score_mfu"] == pytest.approx(forward_flops(shape, scoring) / 0.5e12)
    assert "perf/mfu" not in perf_metrics(totals, 2.0, 0.5, 400.0, peak=None)
    two = {key: 2 * value for key, value in totals.items()}  # two ranks' sums, two devices
    assert perf_metrics(two, 2.0, 0.5, 400.0, peak=1e12, devices=2) == out


def test_the_budget_setting_reads_auto_a_number_or_null():
    """`auto` is the device's default (CPU here), a number is taken as is, null is the row-padded
    layout (not `off`, which YAML reads as false)."""
    from brorl.params import load_params
    from brorl.train.config import AUTO_MICRO_TOKENS, TrainerConfig

    def resolved(value: str) -> int | None:
        params = load_params(ROOT / "params" / "rl.yaml",
                             [f"update.max_tokens_per_micro_batch={value}"])
        return TrainerConfig.from_params(params).max_tokens_per_micro_batch

    assert resolved("auto") == AUTO_MICRO_TOKENS["cpu"]
    assert resolved("512") == 512 and resolved("null") is None
    with pytest.raises(Exception, match="max_tokens_per_micro_batch"):
        resolved("off")
