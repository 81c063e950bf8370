"""The rollout-engine seam: the `RolloutEngine` Protocol, the engine's settings (`EngineConfig`,
from the `generate` section), sampling settings, shared sampling math.

An engine turns B prompts into B x N rollouts (a `RolloutBatch`, prompt-major) and accepts the
trainer's weights after each update. The math here is shared by the in-process engine, the tests
and the trainer: the sampling distribution (temperature, then top-p renormalisation) and its
log-probabilities, and a counter-based uniform generator that gives each (seed, rollout, step) its
own random number, so a rollout's tokens do not depend on how rollouts are chunked.

Deliberately ignored: top-k, repetition penalties, stop strings (only EOS stops a rollout).
Paper: BroRL §3.1 (N rollouts per prompt sampled from the current policy), ProRL v1
temperature 1.2 (ProRL (arXiv 2505.24864) §3.2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import torch

from brorl.system.devices import resolve_dtype
from brorl.types import RolloutBatch

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.params.rl import CompileSetting, EngineKind

_MASK64 = (1 << 64) - 1

PROMPT_KEYS = 1 << 40
"""Bound of `SamplingConfig.prompt_keys`: the vLLM engine spaces a prompt's request seed by
2^20 per key (`brorl.engines.vllm`), the hf engine's rollout ids `key * n + k` stay below 2^60."""

AUTO_ROWS = 256
"""Rollouts decoded at once with `generate.max_concurrent_rollouts: auto` where no memory
figure sizes them: the in-process engine off CUDA and vLLM's `max_num_seqs` (vLLM's own
default)."""


@dataclass(frozen=True)
class EngineConfig:
    """Arguments of `brorl.engines.build_engine` (and `VllmEngine`) that the params set: the
    `generate` section's engine settings and the run's seed (`train.seed`, vLLM's own seed)."""

    kind: EngineKind
    """generate.engine."""
    max_concurrent_rollouts: int | Literal["auto"]
    """generate.max_concurrent_rollouts: most rollouts decoded at once (`auto`: sized by the
    engine)."""
    compile: CompileSetting
    """generate.compile: the hf engine's compiled decode step."""
    stop_check_tokens: int
    """generate.stop_check_tokens: hf decode steps between host stop checks."""
    dtype: str
    """generate.dtype (`auto` resolved): the vLLM engine's dtype."""
    gpu_memory_utilization: float
    """generate.gpu_memory_utilization: vLLM's share of GPU memory."""
    cpu_kv_cache_gib: int
    """generate.cpu_kv_cache_gib: vLLM's KV cache on CPU (GiB)."""
    enforce_eager: bool
    """generate.enforce_eager: vLLM without graph capture."""
    seed: int
    """train.seed."""

    @classmethod
    def from_params(cls, params: ExperimentParams) -> EngineConfig:
        g = params.generate
        return cls(kind=g.engine, max_concurrent_rollouts=g.max_concurrent_rollouts,
                   compile=g.compile, stop_check_tokens=g.stop_check_tokens,
                   dtype=resolve_dtype(g.dtype), gpu_memory_utilization=g.gpu_memory_utilization,
                   cpu_kv_cache_gib=g.cpu_kv_cache_gib, enforce_eager=g.enforce_eager,
                   seed=params.train.seed)


@dataclass(frozen=True)
class SamplingConfig:
    """How one engine call samples: the `generate` section's temperature, top-p and longest
    response, and the call's seed. `temperature` 0 is greedy (argmax, raw-model log-probs)."""

    temperature: float
    top_p: float
    max_response_tokens: int
    seed: int
    first_prompt: int = 0
    """Index of the call's first prompt in its draw: rollout k of the call's prompt b is sampled
    as rollout k of prompt `first_prompt + b`, so a rank that generates a slice of a draw's
    prompts gets the rollouts one process generating the whole draw would."""
    prompt_keys: tuple[int, ...] | None = None
    """Each prompt's own key in [0, 2^40) instead of its place in the draw (then `first_prompt`
    stays 0): rollout k of the call's prompt b is sampled as rollout k of prompt
    `prompt_keys[b]`, so a prompt keyed by what it is (an evaluation's instance) gets the same
    rollouts whatever other prompts share the call and in whatever order."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature {self.temperature} is negative; use 0 (greedy) or > 0.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p} must be in (0, 1]; 1 turns nucleus sampling off.")
        if self.max_response_tokens < 1:
            raise ValueError(f"max_response_tokens {self.max_response_tokens} must be >= 1.")
        if self.first_prompt < 0:
            raise ValueError(f"first_prompt {self.first_prompt} must be >= 0 (a prompt index).")
        if self.prompt_keys is not None and self.first_prompt:
            raise ValueError(f"prompt_keys replace first_prompt ({self.first_prompt}); set one "
                             "of them, not both.")
        if self.prompt_keys is not None and not all(0 <= k < PROMPT_KEYS for k in self.prompt_keys):
            raise ValueError(f"prompt_keys must lie in [0, 2^40), got min "
                             f"{min(self.prompt_keys)}, max {max(self.prompt_keys)}; reduce "
                             "them modulo 2^40.")

    def prompt_key(self, b: int) -> int:
        """The key rollout k of the call's prompt b is sampled under (as rollout k of it)."""
        return self.first_prompt + b if self.prompt_keys is None else self.prompt_keys[b]

    def rollout_ids(self, rows: torch.Tensor, n: int) -> torch.Tensor:
        """`[R]` int64 ids in the draw of the call's rows `rows [R]` (prompt-major, `n` per
        prompt): row b * n + k is rollout `prompt_key(b) * n + k` (`counter_uniform`'s id;
        distinct for distinct keys, below 2^60 for n <= 2^20)."""
        if self.prompt_keys is None:
            return rows + n * self.first_prompt
        keys = torch.tensor(self.prompt_keys, dtype=torch.int64, device=rows.device)
        return keys[rows // n] * n + rows % n


def check_call(prompts: int, n: int, sampling: SamplingConfig) -> None:
    """Refuse an engine call without prompts, with n < 1, or whose `prompt_keys` do not key
    each of its `prompts` once."""
    if n < 1 or not prompts:
        raise ValueError(f"need at least one prompt and n >= 1, got {prompts} prompts, n={n}.")
    if sampling.prompt_keys is not None and len(sampling.prompt_keys) != prompts:
        raise ValueError(f"{len(sampling.prompt_keys)} prompt_keys for {prompts} prompts; give "
                         "one key per prompt.")


def assemble_batch(prompt_ids: Sequence[tuple[int, ...]], n: int, tokens: torch.Tensor,
                   logprobs: torch.Tensor, lengths: torch.Tensor, texts: Sequence[str],
                   stopped: Sequence[bool], pad_id: int) -> RolloutBatch:
    """An engine call's `RolloutBatch` (on the CPU) from its rows, prompt-major: B = len(prompt_ids)
    prompts x `n` rollouts; `tokens` and `logprobs` `[B*n, >= T]` cut to the longest response T
    (at least 1), `lengths` `[B*n]`, `stopped[r]` True where row r ended on a stop token (else it
    reached the length limit)."""
    t = max(int(lengths.max()), 1)
    return RolloutBatch(
        prompt_index=torch.arange(len(prompt_ids)).repeat_interleave(n),
        prompt_ids=tuple(prompt_ids),
        response_ids=tokens[:, :t].cpu(),
        response_lengths=lengths.cpu(),
        logprobs=logprobs[:, :t].cpu(),
        texts=tuple(texts),
        finish_reasons=tuple("stop" if s else "length" for s in stopped),
        rollouts_per_prompt=n,
        pad_id=pad_id,
    )


ChunkCallback = Callable[[int, int, Sequence[str]], None]
"""`on_chunk(start, stop, texts)`: rows `start..stop-1` of the call (prompt-major) are finished,
`texts` their responses. Engines call it in row order, each row once, before `generate` returns."""


class RolloutEngine(Protocol):
    """Generates rollouts from the current policy and takes the trainer's weights in place."""

    def generate(self, prompts: Sequence[str], n: int, sampling: SamplingConfig,
                 on_chunk: ChunkCallback | None = None) -> RolloutBatch:
        """B = len(prompts) prompts x `n` rollouts each, prompt-major; `on_chunk` hears of
        finished rows as the engine hands them over (the hf engine: chunk by chunk)."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load `model`'s current parameters into the engine (no restart)."""
        ...


NUCLEUS_CANDIDATES = 256
"""Most probable tokens among which the eager top-p looks for the nucleus first
(`sampling_logprobs`): a partial sort of 256 instead of a sort of the whole vocabulary. Measured
on this 2-core CPU (SmolLM2-135M, V = 49,152, 128 rows, temperature 0.6, top-p 0.95, one
thread): the full sort and its inverse permutation took 39 s of an 87 s evaluation."""

NUCLEUS_MARGIN = 1e-5
"""How far above `top_p` the candidates' mass must reach for the nucleus to lie among them: it
covers the float32 rounding of the full sort's running sums, so both ways keep the same tokens."""


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probabilities of the sampling distribution, `[..., V]` -> `[..., V]` float32.

    softmax(logits / temperature), then tokens outside the top-p nucleus get -inf and the rest are
    renormalised (the nucleus is the smallest prefix of tokens, by descending probability, whose
    mass reaches `top_p`; the token that crosses it is kept). Temperature 0 gives the raw model
    log-probabilities (greedy decoding scores its tokens under the unscaled model).

    Eager, the nucleus is first sought among the `NUCLEUS_CANDIDATES` most probable tokens
    (`_nucleus_among_top`) and the whole vocabulary is sorted only when it reaches beyond them
    (one host sync per call); compiled (no data-dependent branch), the vocabulary is sorted.
    Both keep the same tokens but where tokens of equal probability straddle the nucleus's edge
    (which of them a sort puts first is arbitrary either way).
    """
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    logp = torch.log_softmax(scaled, dim=-1)
    if top_p >= 1.0 or temperature == 0:
        return logp
    drop = None if torch.compiler.is_compiling() else _nucleus_among_top(logp, top_p)
    if drop is None:
        drop = _nucleus_by_sort(logp, top_p)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def _nucleus_by_sort(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """`[..., V]` bool, True outside the top-p nucleus, from a sort of the whole vocabulary."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()
    drop_sorted = mass_before >= top_p
    # back to vocabulary order through the inverse permutation (a gather), not a scatter:
    # inductor's AVX2 code for that scatter (torch 2.13, the pinned kernel path) reads past its
    # vectors and fails its own index check
    return drop_sorted.gather(-1, order.argsort(dim=-1))


def _nucleus_among_top(logp: torch.Tensor, top_p: float,
                       k: int = NUCLEUS_CANDIDATES) -> torch.Tensor | None:
    """`[..., V]` bool, True outside the top-p nucleus, found among each row's `k` most probable
    tokens (`topk`, sorted as the full sort's first k); None when a row's k most probable tokens
    hold less than `top_p + NUCLEUS_MARGIN` (its nucleus may reach beyond them). The running
    sums of the first k are those of the full sort, so the kept tokens are its kept tokens."""
    if k >= logp.shape[-1]:
        return None
    top, index = logp.topk(k, dim=-1)
    probs = top.exp()
    mass = probs.cumsum(dim=-1)
    if not bool((mass[..., -1] >= top_p + NUCLEUS_MARGIN).all()):
        return None
    keep = torch.zeros_like(logp, dtype=torch.bool).scatter_(-1, index, mass - probs < top_p)
    return ~keep


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 two's-complement torch stores."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's `>>` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _term(value: int | torch.Tensor, factor: int) -> int | torch.Tensor:
    """`value * factor` modulo 2^64, as int64 (a tensor's product wraps)."""
    if isinstance(value, torch.Tensor):
        return value.to(torch.int64) * _signed(factor)
    return _signed(value * factor)


def counter_uniform(seed: int | torch.Tensor, rollout_ids: torch.Tensor,
                    step: int | torch.Tensor) -> torch.Tensor:
    """One uniform in [0, 1) per rollout for decode `step`: `[R]` int64 ids -> `[R]` float64.

    A SplitMix64 finaliser over (seed, rollout id, step): stateless, so the number a rollout gets
    depends only on those three integers, never on the batch it is computed in. `seed` and
    `step` may be `[1]` int64 tensors on the ids' device (the fixed-shape decode step's, read
    without a host sync and without recompiling per seed); int64 arithmetic wraps, so the
    numbers equal those of the ints.
    """
    x = rollout_ids.to(torch.int64) * _signed(0x9E3779B97F4A7C15)
    x = x + _term(seed, 0xD1B54A32D192ED03) + _term(step, 0xABC98388FB8FAC03) \
        + _signed(0x8CB92BA72F3D8DD7)
    x = (x ^ _shift_right(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ _shift_right(x, 27)) * _signed(0x94D049BB133111EB)
    x = x ^ _shift_right(x, 31)
    return _shift_right(x, 11).to(torch.float64) * (2.0**-53)


def sample_tokens(logp: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: `[R, V]` log-probs and `[R]` uniforms -> `[R]` token ids.

    Token k is chosen when cdf(k-1) <= u < cdf(k), with the CDF in vocabulary order (float64, so
    the pick is exact up to the probabilities' own rounding); zero-probability tokens are never
    chosen.
    """
    cdf = logp.double().exp().cumsum(dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(-1)
    picks = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return picks.clamp_max(logp.shape[-1] - 1)


def score_rollouts(
    model: torch.nn.Module, batch: RolloutBatch, temperature: float, top_p: float
) -> torch.Tensor:
    """Teacher-forced log-probs of `batch`'s tokens under `model`'s sampling distribution.

    One forward over `[B*N, P_max + T]` (prompt then response, right-padded, so causal attention
    never sees the padding); returns `[B*N, T]` float32 with 0 at padding, the quantity engines
    return in `RolloutBatch.logprobs`.
    """
    rows, t = batch.response_ids.shape
    prompt_lens = torch.tensor([len(batch.prompt_ids[int(b)]) for b in batch.prompt_index])
    width = int(prompt_lens.max()) + t
    ids = torch.full((rows, width), batch.pad_id, dtype=torch.long)
    for i, b in enumerate(batch.prompt_index.tolist()):
        p = prompt_lens[i]
        ids[i, :p] = torch.tensor(batch.prompt_ids[b])
        ids[i, p : p + t] = batch.response_ids[i]
    device = next(model.parameters()).device
    valid = torch.arange(width)[None, :] < (prompt_lens + batch.response_lengths)[:, None]
    logits = model(input_ids=ids.to(device), attention_mask=valid.long().to(device)).logits
    positions = prompt_lens[:, None] - 1 + torch.arange(t)[None, :]
    picked = logits[torch.arange(rows)[:, None], positions.to(device)]
    logp = sampling_logprobs(picked, temperature, top_p)
    out = logp.gather(-1, batch.response_ids.to(device)[..., None]).squeeze(-1).cpu()
    mask = torch.arange(t)[None, :] < batch.response_lengths[:, None]
    return torch.where(mask, out, torch.zeros_like(out))
