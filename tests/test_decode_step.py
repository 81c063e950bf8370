"""The hf engine's fixed-shape decode step (`brorl.engines.decode`) on tiny Qwen2 and Llama models
(and GPT-2's plain attention for tracing; CPU, offline): it traces whole (`fullgraph=True`) and
compiles once per bucket, never reads a value back to the host, dispatches the same ops whatever
the rows and prompts, and its compiled form decodes the tokens and log-probs of the eager one.

Extra stop ids make rows stop within a few tokens, so chunks hold stopped rows (and, with half
the vocabulary stopping, compact to smaller buckets). Tracing is checked with dynamo's `eager`
backend (no code generation); equality through AOTAutograd, and through inductor (the engine's
backend) for one graph.
On a GPU (`pytest -m gpu`) the compiled step must also run as CUDA graphs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.cudagraph_trees import get_manager
from torch.utils._python_dispatch import TorchDispatchMode

from brorl.engines.base import SamplingConfig
from brorl.engines.decode import Decoder, buckets, decode_chunk, prompt_width
from brorl.engines.hf import HfEngine
from brorl.policy import build_tokenizer
from tests.tiny_models import ARCHITECTURES, tiny_model

PROMPTS = ["1+2=", "spell cat backwards:", "x", "count the bits of 13", "ab"]
SAMPLING = SamplingConfig(temperature=1.2, top_p=0.9, max_response_tokens=12, seed=7)
GREEDY = SamplingConfig(temperature=0, top_p=1.0, max_response_tokens=12, seed=0)
READS = ("aten._local_scalar_dense.default", "aten.item.default")
"""Ops that read a tensor's value back to the host (`.item()`, `int()`, `bool()`, `.tolist()`)."""
SYNCS = {*READS, "aten.nonzero.default", "aten.masked_select.default",
         "aten.unique_consecutive.default", "aten._unique2.default"}
"""Host reads and ops whose output shape depends on tensor values."""


def _engine(model, tokenizer, rows: int, compile: str = "off", every: int = 2,
            stops: int = 50) -> HfEngine:
    """An engine whose rows stop on EOS or on any of the `stops` ids from 40 (50: about half the
    draws)."""
    engine = HfEngine(model, tokenizer, max_concurrent_rollouts=rows, compile=compile,
                      stop_check_tokens=every)
    engine.stop_ids = torch.cat([engine.stop_ids, torch.arange(40, 40 + stops)])
    return engine


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def layout(request):
    """(model, tokenizer) of the two shared-prefix layouts."""
    tokenizer = build_tokenizer()
    return tiny_model(request.param, len(tokenizer)), tokenizer


def test_buckets_halve_down_to_a_sixteenth_and_prompts_pad_to_powers_of_two():
    assert buckets(512) == [512, 256, 128, 64, 32]
    assert buckets(5) == [5, 3, 2, 1]
    assert buckets(1) == [1]
    assert [prompt_width(k) for k in (1, 32, 33, 100)] == [32, 32, 64, 128]


@pytest.mark.parametrize("architecture", ARCHITECTURES)  # gpt2: the plain-attention layout
def test_the_decode_step_traces_whole_and_compiles_once_per_bucket(architecture):
    """Three chunks of 8 rows over groups of 6 (chunks cut groups), compacted as rows stop:
    one graph per bucket the step ran at, none more in a second call with another seed (a
    training step's), no graph break."""
    tokenizer = build_tokenizer()
    model = tiny_model(architecture, len(tokenizer))
    torch._dynamo.reset()
    counters.clear()
    engine = _engine(model, tokenizer, rows=8, compile="on")
    engine.compile_backend = "eager"  # dynamo's tracing only: what fullgraph checks
    first = engine.generate(PROMPTS[:4], 6, SAMPLING)
    assert engine.last_decoder is not None
    ran = engine.last_decoder.buckets_run
    assert len(ran) >= 2 and "stop" in first.finish_reasons  # chunks compacted
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == len(ran)
    other = replace(SAMPLING, seed=8)
    again = engine.generate(PROMPTS[:4], 6, other)
    assert counters["stats"]["unique_graphs"] == len(ran | engine.last_decoder.buckets_run)
    reference = _engine(model, tokenizer, rows=8)
    for batch, sampling in ((first, SAMPLING), (again, other)):
        eager = reference.generate(PROMPTS[:4], 6, sampling)
        assert torch.equal(batch.response_ids, eager.response_ids)
        assert batch.finish_reasons == eager.finish_reasons
        torch.testing.assert_close(batch.logprobs, eager.logprobs, atol=1e-5, rtol=0)
    torch._dynamo.reset()


@pytest.mark.parametrize("architecture", ["qwen2", "gpt2"])  # shared prefix, plain attention
def test_a_bucket_decodes_in_the_same_buffers_in_every_chunk_and_call(architecture):
    """What a CUDA graph needs to be replayed rather than recorded again: three chunks of 8 rows
    per call, compacted as rows stop, two calls with other seeds, buffers kept between calls (as
    with CUDA graphs); every tensor the step is bound to keeps its address per bucket across all
    of them. Reused buffers leak nothing: the second call decodes what a fresh engine decodes. A
    call with longer prompts replaces the buffers rather than adding to them. Without CUDA graphs
    (here) the engine frees its buffers after each call by default."""
    tokenizer = build_tokenizer()
    model = tiny_model(architecture, len(tokenizer))
    default = _engine(model, tokenizer, rows=8)
    default.generate(PROMPTS[:4], 6, SAMPLING)
    assert default.buffers.nbytes() == 0
    engine = _engine(model, tokenizer, rows=8)
    engine.keep_buffers = True
    addresses: dict[int, set[tuple[int, ...]]] = {}
    for seed in (7, 8):
        engine.generate(PROMPTS[:4], 6, replace(SAMPLING, seed=seed))
        assert engine.last_decoder is not None
        for rows, seen in engine.last_decoder.addresses.items():
            addresses.setdefault(rows, set()).update(seen)
    assert len(addresses) >= 3  # the chunks were compacted (eager: to their live rows)
    assert {rows: len(seen) for rows, seen in addresses.items()} == dict.fromkeys(addresses, 1)
    again = engine.generate(PROMPTS[:4], 6, replace(SAMPLING, seed=8))
    fresh = _engine(model, tokenizer, rows=8).generate(PROMPTS[:4], 6, replace(SAMPLING, seed=8))
    assert torch.equal(again.response_ids, fresh.response_ids)
    assert again.finish_reasons == fresh.finish_reasons
    assert torch.equal(again.logprobs, fresh.logprobs)
    long = [prompt * 3 for prompt in PROMPTS[:4]]  # prompt width 64 instead of 32
    engine.generate(long, 6, SAMPLING)
    alone = _engine(model, tokenizer, rows=8)
    alone.keep_buffers = True
    alone.generate(long, 6, SAMPLING)
    assert engine.buffers.nbytes() == alone.buffers.nbytes()


class _Ops(TorchDispatchMode):
    """Counts the aten ops dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        # the eager step slices the cache to its written positions; at the last token that is
        # the whole buffer, which torch dispatches as an alias: the same op for this count
        self.ops["aten.slice.Tensor" if name == "aten.alias.default" else name] += 1
        return func(*args, **(kwargs or {}))


def _step_ops(model, tokenizer, prompts: list[str], n: int, monkeypatch
              ) -> tuple[list[Counter[str]], Counter[str], int]:
    """Decode `prompts` x `n` rows in one chunk through the engine's own `Decoder.step` and
    `decode_chunk`: each step's op counts, those of the whole chunk outside the steps, and the
    number of host stop checks the chunk made."""
    steps: list[Counter[str]] = []
    outside = _Ops()
    real_step, real_decode = Decoder.step, decode_chunk

    def step(self, chunk) -> None:
        with _Ops() as mode:
            real_step(self, chunk)
        steps.append(mode.ops)

    def decode(*args, **kwargs) -> None:
        with outside:
            real_decode(*args, **kwargs)

    monkeypatch.setattr(Decoder, "step", step)
    monkeypatch.setattr("brorl.engines.hf.decode_chunk", decode)
    sampling = SamplingConfig(temperature=1.2, top_p=0.9, max_response_tokens=6, seed=3)
    engine = HfEngine(model, tokenizer, max_concurrent_rollouts=len(prompts) * n,
                      stop_check_tokens=2)
    engine.generate(prompts, n, sampling)
    monkeypatch.undo()
    checks = (sampling.max_response_tokens - 1) // 2
    return steps, outside.ops - sum(steps, Counter()), checks


def test_the_decode_step_never_syncs_and_its_ops_do_not_grow_with_rows_or_prompts(
        layout, monkeypatch):
    """1 prompt x 512 rows, 1 x 64 and 32 prompts of different lengths x 16: every step
    dispatches the same ops (a per-row or per-prompt loop would not), none of them a host read
    or a data-dependent shape; the host reads one count per stop check outside the steps."""
    model, tokenizer = layout
    gen = torch.Generator().manual_seed(0)
    prompts = ["".join(chr(97 + int(c)) for c in torch.randint(0, 26, (int(k),), generator=gen))
               for k in torch.randint(20, 40, (32,), generator=gen)]
    runs = {(1, 512): _step_ops(model, tokenizer, prompts[:1], 512, monkeypatch),
            (1, 64): _step_ops(model, tokenizer, prompts[:1], 64, monkeypatch),
            (32, 16): _step_ops(model, tokenizer, prompts, 16, monkeypatch)}
    reference = runs[1, 512][0][0]
    assert sum(reference.values()) > 50  # the forward's ops were seen
    for key, (steps, outside, checks) in runs.items():
        assert steps and all(ops == reference for ops in steps), key
        assert not SYNCS & set(reference), key
        assert 1 <= sum(outside[op] for op in READS) <= checks, (key, outside)


@pytest.mark.parametrize(("architecture", "sampling", "backend"), [
    ("qwen2", GREEDY, "aot_eager"), ("llama", GREEDY, "aot_eager"),
    ("llama", SAMPLING, "inductor"),
], ids=["qwen2-greedy", "llama-greedy", "llama-sampled-inductor"])
def test_compiled_decoding_gives_the_eager_tokens_and_logprobs(architecture, sampling, backend):
    """The compiled step against the eager one: chunks of 5 rows over groups of 3 (a chunk cuts
    a group), rows stopping early (kept in the chunk, masked); the same tokens, finish reasons and
    log-probs (float32 rounding; at temperature 0 the raw model's), and the same rollouts again
    in a second call. One graph: the stop check comes after the last token, so no chunk compacts.
    Greedy through AOTAutograd (the in-place cache and state writes functionalised); sampling
    through inductor, the engine's backend (its generated code for the forward, the int64
    counter, the float64 CDF and its search): one inductor graph, 10-30 s on a busy 2-core CPU."""
    tokenizer = build_tokenizer()
    model = tiny_model(architecture, len(tokenizer))
    every = sampling.max_response_tokens
    eager = _engine(model, tokenizer, rows=5, every=every, stops=4).generate(PROMPTS, 3, sampling)
    assert "stop" in eager.finish_reasons and "length" in eager.finish_reasons
    torch._dynamo.reset()
    engine = _engine(model, tokenizer, rows=5, compile="on", every=every, stops=4)
    engine.compile_backend = backend
    for _ in range(2):  # run after run: exact resume regenerates the same rollouts
        compiled = engine.generate(PROMPTS, 3, sampling)
        assert torch.equal(compiled.response_ids, eager.response_ids)
        assert compiled.finish_reasons == eager.finish_reasons
        torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=2e-5, rtol=0)
    torch._dynamo.reset()


@pytest.mark.gpu
def test_the_cuda_step_is_captured_and_decodes_the_eager_rollouts():
    """CUDA (`pytest -m gpu`): the compiled step runs as CUDA graphs (inductor skips none) over
    compacting chunks, each graph recorded once for all chunks and both calls (none recorded
    again for moved inputs), and gives the eager step's tokens, finish reasons and log-probs."""
    tokenizer = build_tokenizer()
    model = tiny_model("qwen2", len(tokenizer)).to("cuda")
    eager = _engine(model, tokenizer, rows=8).generate(PROMPTS[:4], 6, SAMPLING)
    torch._dynamo.reset()
    counters.clear()
    engine = _engine(model, tokenizer, rows=8, compile="auto")  # auto: compiled on CUDA
    for _ in range(2):
        compiled = engine.generate(PROMPTS[:4], 6, SAMPLING)
        assert torch.equal(compiled.response_ids, eager.response_ids)
        assert compiled.finish_reasons == eager.finish_reasons
        torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=1e-4, rtol=0)
    assert engine.last_decoder is not None and engine.last_decoder.graphs
    assert not counters["inductor"]["cudagraph_skips"] and not counters["graph_break"]
    manager = get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    assert manager is not None
    assert not any(sum(by_function.values()) for by_function in manager.num_rerecord.values())
    torch._dynamo.reset()
