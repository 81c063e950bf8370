"""In-process engine (transformers): prefill each prompt once, decode in bounded chunks.

Rows are the B x N rollouts in prompt-major order. They are decoded in chunks of consecutive
rows, so peak memory depends on the chunk, not on N or B: a chunk may hold several small groups
(N below it) or a slice of one large group (N above it). A chunk holds at most
`max_concurrent_rollouts` rows on every device, and on CUDA no more than the free memory holds
(`fitting_rows`); `auto` takes what fits on CUDA and `AUTO_ROWS` elsewhere. Each prompt is
prefilled exactly once (`brorl.policy.prefix`, shared with the trainer's scoring); its key/value
cache `[1, H, P, D]` per layer is kept only while a chunk still needs it, once per chunk, and
attended by all of the chunk's rows of that prompt (shared-prefix attention, a fixed number of
ops per layer whatever the number of prompts); the rows' own cache holds their responses only.
Each chunk decodes with fixed shapes (`brorl.engines.decode`): its cache is allocated once
(in buffers kept across the call's chunks, and across calls where CUDA graphs replay on them),
sampling and the stop test run on the device, the host checks for stopped rows every
`stop_check_tokens` steps and then compacts the chunk (compiled: to a smaller bucket once half
its rows have stopped; eager: to its live rows), and the step can be compiled and, on CUDA,
captured as CUDA graphs (`compile`). Each finished chunk is handed over (`on_chunk`), so its
verification can run while the next chunk decodes. Architectures outside
`brorl.policy.prefix.SHARED_PREFIX_MODELS` decode with plain attention, each row with its own
copy of its prompt. Token choice is inverse-CDF sampling with one counter-based uniform per
(seed, rollout, step), so every rollout is the same whether it is decoded alone, in a chunk, with
all others, compiled or not, or on another rank (`SamplingConfig.first_prompt`), and a keyed
prompt's whatever other prompts share the call (`SamplingConfig.prompt_keys`).

Deliberately ignored: continuous batching across chunks (a chunk runs until its rows finish),
paged attention, speculative decoding; the vLLM engine covers the fast path.
Paper: BroRL §4.2.4 (one shared prefix per prompt, many concurrent rollouts).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Literal, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from brorl.engines.base import (
    AUTO_ROWS,
    ChunkCallback,
    SamplingConfig,
    assemble_batch,
    check_call,
)
from brorl.engines.decode import (
    Buffers,
    Chunk,
    Decoder,
    Results,
    buckets,
    decode_chunk,
    fit_bucket,
    plain_chunk,
    prompt_width,
    shared_chunk,
    use_compile,
)
from brorl.policy.prefix import SHARED_PREFIX, Prefix, attention, prefill, shares_prefix
from brorl.policy.tokens import decode_responses, encode_prompts, model_stop_ids, pad_id
from brorl.types import RolloutBatch

if TYPE_CHECKING:
    from brorl.params.rl import CompileSetting

STOP_CHECK_TOKENS = 8
"""Default decode steps between the host's stop checks (`generate.stop_check_tokens`)."""

CUDA_MEMORY_SHARE = 0.9
"""Share of the free CUDA memory a decode chunk may fill; the rest absorbs what the estimate of
`decode_row_bytes` leaves out (the allocator's fragmentation, the MLP's activations)."""

SAMPLING_BYTES_PER_LOGIT = 64
"""Bytes per vocabulary entry a decoding row holds at once for its next token: the logits in
the model's dtype and in float32, the sampling log-probs, top-p's sort and mask, and
`sample_tokens`' float64 probabilities and CDF (an upper estimate)."""


def decode_row_bytes(config: Any, dtype_bytes: int, tokens: int) -> int:
    """Bytes one decoding row needs with `tokens` positions of context: its key/value cache in
    every layer plus one layer's copy (a compaction copies the cache one layer at a time), and
    its logits and sampling buffers (`SAMPLING_BYTES_PER_LOGIT`)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_per_token = 2 * config.num_key_value_heads * head_dim * dtype_bytes
    return kv_per_token * tokens * (config.num_hidden_layers + 1) \
        + config.vocab_size * SAMPLING_BYTES_PER_LOGIT


def fitting_rows(free_bytes: int, row_bytes: int, rows: int) -> int:
    """Rows per chunk that `CUDA_MEMORY_SHARE` of `free_bytes` holds at `row_bytes` each: at
    least 1, at most the call's `rows`."""
    return max(1, min(rows, int(free_bytes * CUDA_MEMORY_SHARE) // row_bytes))


def cuda_free_bytes(device: torch.device) -> int:
    """Free memory of a CUDA device: the driver's free bytes plus what torch's caching allocator
    holds reserved but unused (it hands that out first)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


class HfEngine:
    """A `RolloutEngine` running the policy model itself (shared with the trainer, or a copy)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_concurrent_rollouts: int | Literal["auto"],
        compile: CompileSetting = "auto",
        stop_check_tokens: int = STOP_CHECK_TOKENS,
    ) -> None:
        if max_concurrent_rollouts != "auto" and (
                not isinstance(max_concurrent_rollouts, int) or max_concurrent_rollouts < 1):
            raise ValueError(
                f"max_concurrent_rollouts {max_concurrent_rollouts} must be >= 1 or 'auto'; it "
                "bounds how many rollouts decode at once (and so the KV-cache memory)."
            )
        if stop_check_tokens < 1:
            raise ValueError(f"stop_check_tokens {stop_check_tokens} must be >= 1.")
        self.model = model
        self.tokenizer = tokenizer
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.compile: CompileSetting = compile
        """`generate.compile`: whether the decode step is compiled (`use_compile`)."""
        self.stop_check_tokens = stop_check_tokens
        """`generate.stop_check_tokens`: decode steps between the host's stop checks."""
        self.stop_ids = torch.tensor(model_stop_ids(model, tokenizer))
        """Token ids that end a rollout (`brorl.policy.tokens.stop_ids`)."""
        self.pad_id = pad_id(tokenizer)
        self.last_peak_rows = 0
        """Most rows decoded at once in the last `generate` call (for the memory-bound test)."""
        self.last_prefills: list[int] = []
        """Prompt indices prefilled by the last `generate` call, in order (each once)."""
        self.compile_backend = "inductor"
        """`torch.compile` backend of the compiled step (tests trace with dynamo's `eager`)."""
        self.last_decoder: Decoder | None = None
        """The decode step of the last `generate` call (for the compile tests)."""
        self.buffers = Buffers()
        """The decode chunks' tensors, kept across a call's chunks (`brorl.engines.decode`)."""
        self.keep_buffers: bool | None = None
        """Whether `buffers` are kept between calls too: None keeps them when the decode step
        is captured as CUDA graphs (a graph replays on the addresses it was recorded on), and
        otherwise frees them at the end of each call so that the update has that memory."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy `model`'s parameters and buffers into the engine's model (no-op if the same)."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())

    def chunk_rows(self, rows: int, tokens: int, free_bytes: int | None) -> int:
        """Rows decoded at once for a call of `rows` rollouts with `tokens` positions of context
        each: at most `max_concurrent_rollouts` on every device (`auto`: `AUTO_ROWS` without
        `free_bytes`), and with `free_bytes` (a CUDA device's free memory) no more than fit it
        (`fitting_rows`); never more than the call's rows."""
        knob = self.max_concurrent_rollouts
        if free_bytes is None:
            return min(rows, AUTO_ROWS if knob == "auto" else knob)
        dtype_bytes = next(self.model.parameters()).element_size()
        fit = fitting_rows(free_bytes, decode_row_bytes(self.model.config, dtype_bytes, tokens),
                           rows)
        return fit if knob == "auto" else min(fit, knob)

    @torch.inference_mode()
    def _generate(self, prompts: Sequence[str], n: int, sampling: SamplingConfig,
                  on_chunk: ChunkCallback | None) -> RolloutBatch:
        check_call(len(prompts), n, sampling)
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        device = next(self.model.parameters()).device
        rows = len(prompts) * n
        t_max = sampling.max_response_tokens
        out = Results(
            tokens=torch.full((rows, t_max), self.pad_id, dtype=torch.long, device=device),
            logprobs=torch.zeros((rows, t_max), dtype=torch.float32, device=device),
            lengths=torch.zeros(rows, dtype=torch.long, device=device),
            stopped=torch.zeros(rows, dtype=torch.bool, device=device),
        )
        shared = shares_prefix(self.model)
        p_width = prompt_width(max(map(len, prompt_ids)))
        free = cuda_free_bytes(device) + self.buffers.nbytes() if device.type == "cuda" else None
        chunk = self.chunk_rows(rows, p_width + t_max, free)
        compiled = use_compile(self.compile, device)
        sizes = buckets(chunk, compiled)
        groups = min(len(prompts), (chunk + n - 2) // n + 1)  # most prompts a chunk spans
        decoder = Decoder(self.model, sampling, self.stop_ids.to(device), self.pad_id, compiled,
                          self.compile_backend)
        prefixes: dict[int, Prefix] = {}
        texts: list[str] = []
        peak, prefills = 0, []
        for start in range(0, rows, chunk):
            stop = min(start + chunk, rows)
            ids = torch.arange(start, stop, device=device)
            bucket = fit_bucket(sizes, stop - start)
            peak = max(peak, bucket)
            if shared:
                new = [b for b in range(start // n, (stop - 1) // n + 1) if b not in prefixes]
                if new:
                    prefixes.update(zip(new, prefill(self.model, [prompt_ids[b] for b in new],
                                                     device)))
                    prefills.extend(new)
                state = shared_chunk(prefixes, ids, n, bucket, groups, p_width, sampling,
                                     self.pad_id, self.buffers)
            else:
                state = plain_chunk(self.model, [prompt_ids[r // n] for r in range(start, stop)],
                                    ids, n, bucket, p_width, sampling, self.pad_id,
                                    self.buffers)
            with attention(self.model, SHARED_PREFIX) if shared else nullcontext():
                self._decode_chunk(state, ids, decoder, sizes, n, out)
            for b in [b for b in prefixes if (b + 1) * n <= stop]:
                del prefixes[b]  # its last row is done: free its prompt cache
            chunk_texts = self._texts(out, start, stop)
            texts.extend(chunk_texts)
            if on_chunk is not None:
                on_chunk(start, stop, chunk_texts)
        self.last_peak_rows, self.last_prefills, self.last_decoder = peak, prefills, decoder
        if not (decoder.graphs if self.keep_buffers is None else self.keep_buffers):
            self.buffers = Buffers()
        return assemble_batch(prompt_ids, n, out.tokens, out.logprobs, out.lengths, texts,
                              out.stopped.tolist(), self.pad_id)

    def generate(self, prompts: Sequence[str], n: int, sampling: SamplingConfig,
                 on_chunk: ChunkCallback | None = None) -> RolloutBatch:
        """B prompts x `n` rollouts -> `RolloutBatch`, prompt-major (run in eval mode);
        `on_chunk(start, stop, texts)` after each decoded chunk."""
        training = self.model.training
        self.model.eval()
        try:
            return self._generate(prompts, n, sampling, on_chunk)
        finally:
            self.model.train(training)

    def _decode_chunk(self, state: Chunk, rows: torch.Tensor, decoder: Decoder,
                      sizes: list[int], n: int, out: Results) -> None:
        """Decode the chunk of rows `rows [c]` (the call's row ids; `state` holds them and its
        fillers) until each stops or reaches `max_response_tokens`, into `out`
        (`brorl.engines.decode.decode_chunk`, compacting to `sizes`)."""
        decode_chunk(decoder, state, sizes, n, self.stop_check_tokens, out.tokens.shape[1], out,
                     self.buffers)

    def _texts(self, out: Results, start: int, stop: int) -> list[str]:
        """Response texts of rows `start..stop-1` (special tokens dropped)."""
        tokens, lengths = out.tokens[start:stop].cpu(), out.lengths[start:stop].tolist()
        return decode_responses(self.tokenizer,
                                [row[:k].tolist() for row, k in zip(tokens, lengths)])
