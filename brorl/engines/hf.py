"""In-process engine (transformers): prefill each prompt once, decode in bounded chunks.

Rows are the B x N rollouts in prompt-major order. They are decoded in chunks of at most
`max_concurrent_rollouts` consecutive rows, so peak memory depends on that knob, not on N or B: a
chunk may hold several small groups (N below the knob) or a slice of one large group (N above it).
Each prompt is prefilled exactly once (`brorl.policy.prefix`, shared with the trainer's
scoring); its key/value cache `[1, H, P, D]` per layer is kept only while a chunk still needs it,
once per chunk, and attended by all of the chunk's rows of that prompt (shared-prefix attention);
the rows' own cache holds their responses only. Finished rows (EOS) are dropped from it. Token
choice is inverse-CDF sampling with one counter-based uniform per (seed, row, step), so every
rollout is the same whether it is decoded alone, in a chunk, or with all others.

Deliberately ignored: continuous batching across chunks (a chunk runs until its rows finish),
paged attention, speculative decoding; the vLLM engine covers the fast path.
Paper: BroRL §4.2.4 / spec §6 (one shared prefix per prompt, many concurrent rollouts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from brorl.engines.base import SamplingConfig, counter_uniform, sample_tokens, sampling_logprobs
from brorl.policy.prefix import (
    SHARED_PREFIX, Prefix, attention, group_prefixes, prefill,
)
from brorl.policy.tokens import decode_responses, encode_prompts, model_stop_ids, pad_id
from brorl.types import FinishReason, RolloutBatch

@dataclass
class _Outputs:
    """Per-row buffers filled chunk by chunk: tokens and log-probs `[R, T_max]`, lengths `[R]`."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    stopped: torch.Tensor
    peak_rows: int = 0
    prefills: list[int] = field(default_factory=list)


class HfEngine:
    """A `RolloutEngine` running the policy model itself (shared with the trainer, or a copy)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_concurrent_rollouts: int,
    ) -> None:
        if max_concurrent_rollouts < 1:
            raise ValueError(
                f"max_concurrent_rollouts {max_concurrent_rollouts} must be >= 1; it bounds how "
                "many rollouts decode at once (and so the KV-cache memory)."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.stop_ids = torch.tensor(model_stop_ids(model, tokenizer))
        """Token ids that end a rollout (`brorl.policy.tokens.stop_ids`)."""
        self.pad_id = pad_id(tokenizer)
        self.last_peak_rows = 0
        """Most rows decoded at once in the last `generate` call (for the memory-bound test)."""
        self.last_prefills: list[int] = []
        """Prompt indices prefilled by the last `generate` call, in order (each once)."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy `model`'s parameters and buffers into the engine's model (no-op if the same)."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())

    @torch.inference_mode()
    def _generate(self, prompts: Sequence[str], n: int, sampling: SamplingConfig) -> RolloutBatch:
        if n < 1 or not prompts:
            raise ValueError(
                f"need at least one prompt and n >= 1, got {len(prompts)} prompts, n={n}."
            )
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        device = next(self.model.parameters()).device
        rows = len(prompts) * n
        t_max = sampling.max_response_tokens
        out = _Outputs(
            tokens=torch.full((rows, t_max), self.pad_id, dtype=torch.long, device=device),
            logprobs=torch.zeros((rows, t_max), dtype=torch.float32, device=device),
            lengths=torch.zeros(rows, dtype=torch.long, device=device),
            stopped=torch.zeros(rows, dtype=torch.bool, device=device),
        )
        prefixes: dict[int, Prefix] = {}
        for start in range(0, rows, self.max_concurrent_rollouts):
            stop = min(start + self.max_concurrent_rollouts, rows)
            new = [b for b in range(start // n, (stop - 1) // n + 1) if b not in prefixes]
            if new:
                prefixes.update(zip(new, prefill(self.model, [prompt_ids[b] for b in new], device)))
                out.prefills.extend(new)
            self._decode_chunk(torch.arange(start, stop, device=device), n, prefixes, sampling, out)
            for b in [b for b in prefixes if (b + 1) * n <= stop]:
                del prefixes[b]  # its last row is done: free its prompt cache
        self.last_peak_rows, self.last_prefills = out.peak_rows, out.prefills
        return self._batch(prompt_ids, n, out)

    def generate(self, prompts: Sequence[str], n: int, sampling: SamplingConfig) -> RolloutBatch:
        """B prompts x `n` rollouts -> `RolloutBatch`, prompt-major (run in eval mode)."""
        training = self.model.training
        self.model.eval()
        try:
            return self._generate(prompts, n, sampling)
        finally:
            self.model.train(training)

    def _decode_chunk(
        self,
        rows: torch.Tensor,
        n: int,
        prefixes: dict[int, Prefix],
        sampling: SamplingConfig,
        out: _Outputs,
    ) -> None:
        """Decode rows `[C]` (global row ids) until each stops or reaches `max_response_tokens`.

        The rows' cache holds their responses only; each prompt's cache is kept once and
        attended by all of its rows (`shared_prefix_attention`)."""
        shared, positions, logits = group_prefixes(prefixes, rows // n)
        stop_ids = self.stop_ids.to(rows.device)
        cache = DynamicCache()
        logits = logits.float()
        active = rows
        with attention(self.model, SHARED_PREFIX):
            for step in range(sampling.max_response_tokens):
                out.peak_rows = max(out.peak_rows, int(active.numel()))
                logp = sampling_logprobs(logits, sampling.temperature, sampling.top_p)
                if sampling.temperature == 0:
                    tokens = logp.argmax(dim=-1)
                else:
                    tokens = sample_tokens(logp, counter_uniform(sampling.seed, active, step))
                out.tokens[active, step] = tokens
                out.logprobs[active, step] = logp.gather(-1, tokens[:, None]).squeeze(-1)
                out.lengths[active] = step + 1
                done = torch.isin(tokens, stop_ids)
                out.stopped[active[done]] = True
                keep = (~done).nonzero().squeeze(-1)
                if keep.numel() == 0 or step + 1 == sampling.max_response_tokens:
                    return
                if keep.numel() < active.numel():
                    cache.batch_select_indices(keep)
                    active, tokens, positions = active[keep], tokens[keep], positions[keep]
                    shared.keep(keep)
                result = self.model(
                    input_ids=tokens[:, None],
                    position_ids=(positions + step)[:, None],
                    past_key_values=cache,
                    use_cache=True,
                    shared_prefix=shared,
                )
                logits = result.logits[:, -1].float()

    def _batch(self, prompt_ids: list[tuple[int, ...]], n: int, out: _Outputs) -> RolloutBatch:
        t = max(int(out.lengths.max()), 1)
        tokens, lengths = out.tokens[:, :t].cpu(), out.lengths.cpu()
        texts = decode_responses(
            self.tokenizer, [row[:k].tolist() for row, k in zip(tokens, lengths.tolist())])
        reasons: tuple[FinishReason, ...] = tuple(
            "stop" if s else "length" for s in out.stopped.tolist()
        )
        return RolloutBatch(
            prompt_index=torch.arange(len(prompt_ids)).repeat_interleave(n),
            prompt_ids=tuple(prompt_ids),
            response_ids=tokens,
            response_lengths=lengths,
            logprobs=out.logprobs[:, :t].cpu(),
            texts=tuple(texts),
            finish_reasons=reasons,
            rollouts_per_prompt=n,
            pad_id=self.pad_id,
        )
