"""The rollout-engine seam and the in-process hf engine on tiny Qwen2, Llama and GPT-2 models
(CPU, offline): equality with transformers' `generate` and with teacher forcing, the fixed op count
of shared-prefix decoding, chunk hand-over, the plain-attention fallback, CUDA chunk sizing."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
import torch

from brorl.engines import build_engine
from brorl.engines.base import (
    EngineConfig,
    SamplingConfig,
    _nucleus_among_top,
    _nucleus_by_sort,
    counter_uniform,
    sample_tokens,
    sampling_logprobs,
    score_rollouts,
)
from brorl.engines.hf import HfEngine, decode_row_bytes, fitting_rows
from brorl.params import ExperimentParams
from brorl.policy import build_policy, build_tokenizer
from brorl.types import RolloutBatch
from tests.devices import DEVICES
from tests.tiny_models import ARCHITECTURES, tiny_model

PROMPTS = ["1+2=", "spell cat backwards:", "x", "count the bits of 13"]
"""Prompts of different lengths (1 to 20 tokens), so chunks mix left-padded prefixes."""


@pytest.fixture(scope="module", params=DEVICES)
def policy(request):
    tokenizer = build_tokenizer()
    model = build_policy(
        vocab_size=len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
        intermediate_size=128, max_position_embeddings=128, seed=0,
    )
    return model.to(request.param), tokenizer


SAMPLING = SamplingConfig(temperature=1.2, top_p=0.9, max_response_tokens=16, seed=7)


def test_counter_uniform_depends_only_on_seed_rollout_and_step():
    ids = torch.arange(1000)
    full = counter_uniform(3, ids, 5)
    assert torch.equal(counter_uniform(3, ids[700:710], 5), full[700:710])
    assert not torch.equal(counter_uniform(4, ids, 5), full)
    assert not torch.equal(counter_uniform(3, ids, 6), full)
    assert float(full.min()) >= 0.0 and float(full.max()) < 1.0


def test_counter_uniform_is_close_to_uniform():
    u = counter_uniform(0, torch.arange(20_000), 0)
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    # chi-square with 9 dof: the 99.9% quantile is 27.9; expected 2000 per bin.
    chi2 = float(((counts - 2000) ** 2 / 2000).sum())
    assert chi2 < 27.9, counts


def test_sample_tokens_inverts_the_cdf_and_skips_zero_probability_tokens():
    logp = torch.tensor([[0.2, 0.0, 0.5, 0.3]]).log().expand(4, 4)
    # cdf = [0.2, 0.2, 0.7, 1.0]: u < 0.2 -> 0; 0.2 <= u < 0.7 -> 2 (token 1 has p = 0); else 3.
    u = torch.tensor([0.1, 0.2, 0.69, 0.71], dtype=torch.float64)
    assert sample_tokens(logp, u).tolist() == [0, 2, 2, 3]


def test_sampling_logprobs_applies_temperature_then_top_p():
    # temperature 2 on logits [0, ln 4]: p ∝ [1, 4^(1/2)] = [1/3, 2/3].
    got = sampling_logprobs(torch.tensor([0.0, math.log(4.0)]), 2.0, 1.0).exp()
    assert torch.allclose(got, torch.tensor([1 / 3, 2 / 3]))
    # p = [0.5, 0.3, 0.15, 0.05], top_p 0.7: mass before each = [0, .5, .8, .95] -> keep the first
    # two and renormalise: [0.5, 0.3] / 0.8 = [0.625, 0.375].
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    got = sampling_logprobs(logits, 1.0, 0.7).exp()
    assert torch.allclose(got, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_the_nucleus_among_the_top_tokens_is_the_full_sorts_nucleus():
    """The eager top-p's partial sort keeps exactly the tokens a sort of the whole vocabulary
    keeps (fast against slow), and hands over to the sort when a row's nucleus reaches beyond
    its candidates."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 5000, generator=gen) * 2
    logits[:, :20] += torch.linspace(2, 14, 64)[:, None]  # from flat-ish rows to peaked ones
    for temperature, top_p in ((0.6, 0.95), (1.0, 0.9), (1.2, 0.5)):
        logp = torch.log_softmax(logits / temperature, dim=-1)
        peaked = logp[32:]  # their nucleus lies among the 256 most probable tokens
        fast = _nucleus_among_top(peaked, top_p)
        assert fast is not None and torch.equal(fast, _nucleus_by_sort(peaked, top_p))
        assert _nucleus_among_top(logp, top_p) is None  # the flat rows' nucleus is wider
        # either way sampling_logprobs gives the full sort's distribution, bit for bit
        slow = torch.log_softmax(logp.masked_fill(_nucleus_by_sort(logp, top_p), -math.inf), -1)
        assert torch.equal(sampling_logprobs(logits, temperature, top_p), slow)
        assert torch.equal(sampling_logprobs(logits[32:], temperature, top_p), slow[32:])


def test_chunked_generation_equals_unchunked_for_a_seed(policy):
    model, tokenizer = policy
    unchunked = HfEngine(model, tokenizer, max_concurrent_rollouts=10_000)
    whole = unchunked.generate(PROMPTS, 6, SAMPLING)
    for chunk in (1, 4, 7):
        engine = HfEngine(model, tokenizer, max_concurrent_rollouts=chunk)
        part = engine.generate(PROMPTS, 6, SAMPLING)
        assert torch.equal(part.response_ids, whole.response_ids), chunk
        assert torch.equal(part.response_lengths, whole.response_lengths)
        assert part.finish_reasons == whole.finish_reasons
        torch.testing.assert_close(part.logprobs, whole.logprobs, atol=1e-5, rtol=0)


def test_generation_is_deterministic_for_a_seed_and_varies_across_seeds(policy):
    model, tokenizer = policy
    engine = HfEngine(model, tokenizer, max_concurrent_rollouts=8)
    a = engine.generate(PROMPTS, 4, SAMPLING)
    b = engine.generate(PROMPTS, 4, SAMPLING)
    other = SamplingConfig(temperature=1.2, top_p=0.9, max_response_tokens=16, seed=8)
    c = engine.generate(PROMPTS, 4, other)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)
    # rollouts of one prompt differ from each other (distinct noise per rollout)
    assert len({tuple(r.tolist()) for r in a.response_ids[:4]}) == 4


@pytest.fixture(scope="module", params=ARCHITECTURES)
def each_architecture(request):
    """(architecture, model, tokenizer) for Qwen2, Llama (shared prefix) and GPT-2 (plain)."""
    tokenizer = build_tokenizer()
    return request.param, tiny_model(request.param, len(tokenizer)), tokenizer


def test_greedy_rollouts_equal_transformers_generate(each_architecture):
    """Chunks of 5 rows cut the groups of 3 (a prompt's rows span two chunks); every row's
    greedy response is the one `generate` gives its prompt alone, EOS and length alike."""
    _, model, tokenizer = each_architecture
    greedy = SamplingConfig(temperature=0, top_p=1.0, max_response_tokens=16, seed=0)
    batch = HfEngine(model, tokenizer, max_concurrent_rollouts=5).generate(PROMPTS, 3, greedy)
    for b, prompt in enumerate(PROMPTS):
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        expected = model.generate(ids, do_sample=False, max_new_tokens=16, pad_token_id=0,
                                  eos_token_id=2)[0, ids.shape[1]:].tolist()
        for row in range(b * 3, b * 3 + 3):
            assert batch.response_ids[row, : batch.response_lengths[row]].tolist() == expected


def test_logprobs_equal_a_teacher_forced_recomputation(each_architecture):
    """Chunks of 7 rows hold two groups of 8 (or parts of them), and some rows stop early:
    every sampled token's log-prob equals one forward pass over the row's prompt + response."""
    _, model, tokenizer = each_architecture
    batch = HfEngine(model, tokenizer, max_concurrent_rollouts=7).generate(PROMPTS, 8, SAMPLING)
    assert "stop" in batch.finish_reasons  # rows left their chunk before its end
    with torch.no_grad():
        rescored = score_rollouts(model, batch, SAMPLING.temperature, SAMPLING.top_p)
    torch.testing.assert_close(batch.logprobs, rescored, atol=1e-5, rtol=0)
    assert bool((batch.logprobs <= 0).all()) and bool((batch.logprobs[:, 0] < 0).all())


def test_finish_reasons_match_eos_and_length(policy):
    model, tokenizer = policy
    sampling = SamplingConfig(temperature=1.5, top_p=1.0, max_response_tokens=24, seed=1)
    batch = HfEngine(model, tokenizer, max_concurrent_rollouts=64).generate(PROMPTS, 32, sampling)
    eos = tokenizer.eos_token_id
    assert {"stop", "length"} == set(batch.finish_reasons)  # 128 rollouts x 24 tokens, V=100
    for row, k, reason in zip(batch.response_ids, batch.response_lengths, batch.finish_reasons):
        body = row[:k].tolist()
        assert eos not in body[:-1]
        assert all(t == batch.pad_id for t in row[k:].tolist())
        if reason == "stop":
            assert body[-1] == eos
        else:
            assert k == sampling.max_response_tokens and body[-1] != eos


def test_concurrent_rollouts_never_exceed_the_knob_and_prompts_prefill_once(policy):
    model, tokenizer = policy
    calls: list[tuple[int, bool]] = []  # (rows in the forward, is it a prefill)

    def record(_module, _args, kwargs):
        calls.append((kwargs["input_ids"].shape[0], kwargs.get("past_key_values") is None))

    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        engine = HfEngine(model, tokenizer, max_concurrent_rollouts=8)
        batch = engine.generate(PROMPTS, 20, SAMPLING)
    finally:
        hook.remove()
    assert batch.num_rollouts == 80
    assert max(rows for rows, _ in calls) == 8 == engine.last_peak_rows
    # 4 prompts x 20 rollouts in chunks of 8: each prompt spans 3-4 chunks, yet is prefilled once
    assert sum(prefill for _, prefill in calls) == 4
    assert engine.last_prefills == [0, 1, 2, 3]


def test_rollout_batch_is_prompt_major(policy):
    model, tokenizer = policy
    batch = HfEngine(model, tokenizer, max_concurrent_rollouts=3).generate(PROMPTS, 3, SAMPLING)
    assert batch.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert batch.prompt_ids[0] == tuple(tokenizer("1+2=")["input_ids"])
    assert batch.texts[0] == tokenizer.decode(
        batch.response_ids[0, : batch.response_lengths[0]].tolist(), skip_special_tokens=True
    )


def test_rollout_batch_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="B\\*N"):
        RolloutBatch(
            prompt_index=torch.zeros(2, dtype=torch.long), prompt_ids=((1,),),
            response_ids=torch.zeros(3, 2, dtype=torch.long),
            response_lengths=torch.ones(3, dtype=torch.long), logprobs=torch.zeros(3, 2),
            texts=("a", "b", "c"), finish_reasons=("stop",) * 3, rollouts_per_prompt=3,
        )


def test_invalid_settings_fail_with_a_fix(policy):
    model, tokenizer = policy
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(temperature=1.0, top_p=0.0, max_response_tokens=16, seed=0)
    with pytest.raises(ValueError, match="max_concurrent_rollouts"):
        HfEngine(model, tokenizer, max_concurrent_rollouts=0)
    with pytest.raises(ValueError, match="prompts \\[1\\] tokenize to no tokens"):
        HfEngine(model, tokenizer, max_concurrent_rollouts=2).generate(["a", ""], 2, SAMPLING)
    with pytest.raises(ValueError, match="prompt_keys replace first_prompt"):
        replace(SAMPLING, first_prompt=1, prompt_keys=(0,))
    with pytest.raises(ValueError, match="prompt_keys must lie in"):
        replace(SAMPLING, prompt_keys=(2 ** 40,))
    with pytest.raises(ValueError, match="one key per prompt"):
        HfEngine(model, tokenizer, max_concurrent_rollouts=2).generate(
            ["a", "b"], 2, replace(SAMPLING, prompt_keys=(5,)))


def test_importing_the_engines_does_not_import_vllm():
    code = "import sys, brorl.engines, brorl.engines.hf; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_generate_restores_the_trainers_mode(policy):
    model, tokenizer = policy
    model.train()
    try:
        HfEngine(model, tokenizer, max_concurrent_rollouts=4).generate(PROMPTS[:1], 2, SAMPLING)
        assert model.training
    finally:
        model.eval()


def test_build_engine_maps_the_choice_and_explains_bad_ones(policy):
    model, tokenizer = policy
    hf = replace(EngineConfig.from_params(ExperimentParams()), kind="hf", max_concurrent_rollouts=4)
    engine = build_engine(hf, model=model, tokenizer=tokenizer, model_path=None, max_model_len=64)
    assert isinstance(engine, HfEngine) and engine.max_concurrent_rollouts == 4
    with pytest.raises(ValueError, match="model_path"):
        build_engine(replace(hf, kind="vllm"), model=model, tokenizer=tokenizer, model_path=None,
                     max_model_len=64)
    with pytest.raises(ValueError, match="'hf' or 'vllm'"):
        kind: Any = "sglang"
        build_engine(replace(hf, kind=kind), model=model, tokenizer=tokenizer, model_path=None,
                     max_model_len=64)


@pytest.mark.parametrize("length", [1, 3])  # one decode token; several new tokens (causal)
def test_shared_prefix_attention_equals_sdpa_over_each_rows_full_cache(length):
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from brorl.policy.prefix import SharedPrefix, shared_prefix_attention

    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, seen = 4, 2, 8, 5
    prompt_lengths = [7, 3, 5]  # left-padded to 7 in the shared cache
    groups = torch.tensor([0, 0, 1, 2, 2, 2])  # rows of a group are contiguous
    rows, p_max = len(groups), max(prompt_lengths)
    prefix_k, prefix_v = (torch.randn(3, kv_heads, p_max, dim, generator=gen) for _ in range(2))
    mask = torch.arange(p_max)[None, :] >= (p_max - torch.tensor(prompt_lengths))[:, None]
    query = torch.randn(rows, heads, length, dim, generator=gen)
    key, value = (torch.randn(rows, kv_heads, seen, dim, generator=gen) for _ in range(2))
    shared = SharedPrefix(kv=[(prefix_k, prefix_v)], mask=mask, group=groups)
    module = SimpleNamespace(layer_idx=0, num_key_value_groups=heads // kv_heads, training=False)
    out, _ = shared_prefix_attention(module, query, key, value, None, scaling=dim ** -0.5,
                                     shared_prefix=shared)
    # Reference: each row's prompt cache copied in front of its own, padding masked, causal tail.
    full_k = torch.cat([prefix_k[groups], key], dim=2)
    full_v = torch.cat([prefix_v[groups], value], dim=2)
    visible = torch.cat([mask[groups][:, None, :].expand(rows, length, p_max),
                         torch.ones(length, seen, dtype=torch.bool).tril(seen - length)
                         .expand(rows, length, seen)], dim=-1)
    expected, _ = sdpa_attention_forward(module, query, full_k, full_v, visible[:, None],
                                         scaling=dim ** -0.5)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_decoding_keeps_no_per_row_copy_of_the_prompt_and_restores_the_attention(
        policy, monkeypatch):
    """The rows' cache (`FixedCache`, allocated once per chunk) holds the response positions
    only, never prompt + response: attention sees the positions written so far."""
    from brorl.engines.decode import FixedCache

    model, tokenizer = policy
    before = model.config._attn_implementation
    seen = []
    real = FixedCache.update

    def update(cache, keys, values, layer_idx, *args, **kwargs):
        result = real(cache, keys, values, layer_idx, *args, **kwargs)
        seen.append(result[0].shape[2])  # cached positions per row: responses only
        return result

    monkeypatch.setattr(FixedCache, "update", update)
    batch = HfEngine(model, tokenizer, max_concurrent_rollouts=8).generate(PROMPTS, 4, SAMPLING)
    assert seen and max(seen) <= SAMPLING.max_response_tokens  # never prompt + response
    assert model.config._attn_implementation == before
    assert int(batch.response_lengths.max()) > 1


def test_an_uncovered_architecture_falls_back_to_plain_attention_and_says_so_once(caplog):
    """GPT-2 is not among the shared-prefix architectures: rows decode with their own prompt
    copies (no shared prefill), the result equals teacher forcing, and one warning names it."""
    from brorl.policy import prefix
    from brorl.train.ppo import score_batch

    tokenizer = build_tokenizer()
    model = tiny_model("gpt2", len(tokenizer))
    prefix._warn_plain.cache_clear()  # a warning from an earlier test would hide this one
    engine = HfEngine(model, tokenizer, max_concurrent_rollouts=5)
    # top_p 1: the engine samples from the distribution the trainer scores
    sampling = SamplingConfig(temperature=1.2, top_p=1.0, max_response_tokens=16, seed=7)
    with caplog.at_level("WARNING", logger="brorl.policy.prefix"):
        first = engine.generate(PROMPTS, 3, sampling)
        again = engine.generate(PROMPTS, 3, sampling)
        scored = score_batch(model, first, sampling.temperature, micro_batch_rollouts=4)
    warnings = [r for r in caplog.records if r.name == "brorl.policy.prefix"]
    assert len(warnings) == 1 and "gpt2" in warnings[0].getMessage()
    assert engine.last_prefills == []  # no shared prefill: each row ran its prompt
    assert torch.equal(first.response_ids, again.response_ids)
    torch.testing.assert_close(scored, first.logprobs, atol=1e-5, rtol=0)


def _count_decode_ops(model, prompts: list[list[int]], rows: int) -> int:
    """Aten ops dispatched by one decode step (forward with shared-prefix attention, sampling)
    of `rows` rows spread evenly over `prompts`, after 3 tokens are already in their cache."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import DynamicCache

    from brorl.policy.prefix import SHARED_PREFIX, attention, group_prefixes, prefill

    class Counter(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.ops += 1
            return func(*args, **(kwargs or {}))

    active = torch.arange(rows)
    with torch.inference_mode(), attention(model, SHARED_PREFIX):
        prefixes = dict(enumerate(prefill(model, prompts, torch.device("cpu"))))
        shared, positions, logits = group_prefixes(prefixes, active * len(prompts) // rows)
        cache = DynamicCache()
        for step in range(4):
            with Counter() if step == 3 else torch.inference_mode():
                logp = sampling_logprobs(logits, 1.2, 1.0)
                tokens = sample_tokens(logp, counter_uniform(0, active, step))
                logits = model(input_ids=tokens[:, None], position_ids=(positions + step)[:, None],
                               past_key_values=cache, use_cache=True,
                               shared_prefix=shared).logits[:, -1].float()
    return Counter.ops


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_one_decode_step_dispatches_the_same_ops_for_one_prompt_as_for_32(architecture):
    """A 512-row chunk of 1 prompt (N = 512) and of 32 prompts of different lengths (N = 16):
    the step's op count must not grow with the prompts (one kernel launch per op on a GPU)."""
    tokenizer = build_tokenizer()
    model = tiny_model(architecture, len(tokenizer))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, len(tokenizer), (int(k),), generator=gen).tolist()
               for k in torch.randint(20, 40, (32,), generator=gen)]
    one, many = (_count_decode_ops(model, p, 512) for p in (prompts[:1], prompts))
    assert abs(many - one) <= 0.02 * one, (one, many)


def test_decode_chunks_are_sized_from_free_memory_on_cuda():
    """The CUDA chunk rule's arithmetic with a made-up free-memory figure (CPU)."""
    tokenizer = build_tokenizer()
    model = tiny_model("qwen2", len(tokenizer))  # 2 layers, 1 kv head of 32, float32
    # KV per token 2 (K, V) x 1 head x 32 x 4 bytes = 256; 10 tokens in 2 + 1 layers: 7,680;
    # the sampling buffers 100 logits x 64 bytes = 6,400: 14,080 bytes a row
    assert decode_row_bytes(model.config, 4, 10) == 14_080
    # 0.9 x 1,000,000 bytes hold 63 such rows (63 x 14,080 = 887,040; 64 rows need 901,120)
    assert fitting_rows(1_000_000, 14_080, rows=512) == 63
    assert fitting_rows(1_000_000, 14_080, rows=40) == 40  # never more than the call has
    assert fitting_rows(1_000, 14_080, rows=40) == 1  # at least one row
    auto = HfEngine(model, tokenizer, max_concurrent_rollouts="auto")
    assert auto.chunk_rows(512, 10, free_bytes=1_000_000) == 63  # auto on CUDA: what fits
    assert auto.chunk_rows(512, 10, free_bytes=None) == 256  # auto off CUDA: AUTO_ROWS
    engine = HfEngine(model, tokenizer, max_concurrent_rollouts=8)
    assert engine.chunk_rows(512, 10, free_bytes=1_000_000) == 8  # the knob caps on CUDA too
    assert engine.chunk_rows(512, 10, free_bytes=None) == 8  # no CUDA: the knob
    assert HfEngine(model, tokenizer, max_concurrent_rollouts=100).chunk_rows(
        512, 10, free_bytes=1_000_000) == 63  # ... and the free memory caps the knob


def test_chunks_are_handed_over_in_row_order_and_join_into_the_batch(policy):
    model, tokenizer = policy
    seen: list[tuple[int, int, list[str]]] = []
    engine = HfEngine(model, tokenizer, max_concurrent_rollouts=7)
    batch = engine.generate(PROMPTS, 5, SAMPLING, on_chunk=lambda a, b, t: seen.append((a, b, t)))
    assert [(a, b) for a, b, _ in seen] == [(0, 7), (7, 14), (14, 20)]
    assert tuple(t for _, _, texts in seen for t in texts) == batch.texts
    plain = engine.generate(PROMPTS, 5, SAMPLING)
    assert plain.texts == batch.texts and torch.equal(plain.response_ids, batch.response_ids)


def test_a_slice_of_a_draw_samples_the_rollouts_the_whole_draw_gives_it(policy):
    """A rank generating prompts 1..3 of a draw (`first_prompt=1`) gets the very rollouts one
    process generating all four gives those prompts."""
    from dataclasses import replace

    model, tokenizer = policy
    engine = HfEngine(model, tokenizer, max_concurrent_rollouts=6)
    whole = engine.generate(PROMPTS, 4, SAMPLING)
    part = engine.generate(PROMPTS[1:], 4, replace(SAMPLING, first_prompt=1))
    t = part.response_ids.shape[1]
    assert torch.equal(part.response_ids, whole.response_ids[4:, :t])
    assert part.texts == whole.texts[4:]
    shifted = engine.generate(PROMPTS[1:], 4, SAMPLING)  # counted from 0: other rollouts
    assert not torch.equal(shifted.response_ids[:, :t], part.response_ids)


def test_a_keyed_prompt_samples_the_same_rollouts_whatever_shares_its_call(policy):
    """With `prompt_keys`, a prompt's rollouts are those of its key: the same alone, among
    others, in another order and in other chunks; keys 1..3 give what `first_prompt=1` gives
    (the draw's own keys), another key other rollouts."""
    model, tokenizer = policy
    engine = HfEngine(model, tokenizer, max_concurrent_rollouts=5)
    keys = (11, 2 ** 40 - 1, 7, 123456789)
    whole = engine.generate(PROMPTS, 3, replace(SAMPLING, prompt_keys=keys))
    for order in ([2], [3, 1], [1, 0, 3, 2]):
        part = engine.generate([PROMPTS[i] for i in order], 3,
                               replace(SAMPLING, prompt_keys=tuple(keys[i] for i in order)))
        assert part.texts == tuple(whole.texts[3 * i + k] for i in order for k in range(3))
    slice_ = engine.generate(PROMPTS[1:], 3, replace(SAMPLING, first_prompt=1))
    keyed = engine.generate(PROMPTS[1:], 3, replace(SAMPLING, prompt_keys=(1, 2, 3)))
    assert keyed.texts == slice_.texts and torch.equal(keyed.response_ids, slice_.response_ids)
    other = engine.generate(PROMPTS[1:], 3, replace(SAMPLING, prompt_keys=(4, 5, 6)))
    assert other.texts != keyed.texts
