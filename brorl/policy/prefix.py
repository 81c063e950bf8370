"""One forward pass per prompt, shared by all of its rollouts: prefill and batch a prompt's cache.

A group's N rollouts share their prompt. Generation (`brorl.engines.hf`) and trainer-side scoring
(`brorl.train.ppo.response_logprobs`) both run each distinct prompt through the model once
(`prefill`, all of a call's distinct prompts in one padded pass). Scoring then copies the prompt's
key/value cache into every row that continues it (`rows_cache`: one pass over all response
tokens); decoding, one token per row per step, keeps each prompt's cache once (`group_prefixes`)
and attends to it from all of the group's rows (`shared_prefix_attention`, registered with
transformers' AttentionInterface), the rows' own cache holding their responses only. The rows of
a decode chunk are laid out as a grid of prompts x rows, so each layer scores every row against
its own prompt in one batched matmul: a step dispatches the same ops for 1 prompt as for 32 (one
kernel launch each on a GPU). Prompts of different lengths are left-padded and masked, positions
continue from each prompt's own length. For the fixed-shape decode step (`brorl.engines.decode`)
the grid's M, the prompts' padded width and their count are fixed per bucket of rows, filler
rows share one cell of a spare group, and the rows' cache positions not yet written are masked
(`SharedPrefix.newest`). Per rollout this costs about P/N + T token passes instead of P + T.
Outside `torch.no_grad()` gradients flow from every row back through the one shared prefill, so
the update's gradient is that of the unshared forward (tested to float tolerance).

Covered architectures: `SHARED_PREFIX_MODELS` (Qwen2, Llama: RoPE from `position_ids`, every
layer full attention through the registered attention function). For any other, `shares_prefix`
is False and callers use plain attention, each row with its own copy of its prompt; a warning
says so once per process.

Deliberately ignored: tree attention over shared response prefixes, paged/block KV layouts,
fused attention kernels for the shared part (SDPA returns no log-sum-exp to merge two parts).
Paper: BroRL §4.2.4 (one shared prefix per prompt, many concurrent rollouts).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

KV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Prefix:
    """One prompt's prefill: per-layer (K, V) `[1, H, P, D]`, last position's logits `[V]`."""

    kv: KV
    logits: torch.Tensor
    length: int


def left_pad(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompts as one left-padded batch: ids `[R, P_max]` (padding 0), attention mask `[R, P_max]`
    (bool, False on padding), positions `[R, P_max]` counted from each prompt's first token."""
    lengths = [len(ids) for ids in prompts]
    p_max = max(lengths)
    ids = torch.zeros(len(prompts), p_max, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, p_max - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
    pads = torch.tensor([p_max - n for n in lengths])
    mask = torch.arange(p_max)[None, :] >= pads[:, None]
    positions = (torch.arange(p_max)[None, :] - pads[:, None]).clamp(min=0)
    return ids, mask, positions


def attention_mask_4d(visible: torch.Tensor, queries: int) -> torch.Tensor:
    """`[R, 1, Q, K]` bool for rows whose K key positions are `visible [R, K]` (False: left
    padding) and whose queries are the last Q of them: a query attends the keys at or before its
    own position that are visible, and always its own (a padding query then attends one key
    rather than none, which SDPA would turn into NaN). Built on the host, so the model does not
    read the mask back to decide whether it needs one (transformers does for a 2-D mask)."""
    keys = visible.shape[1]
    own = torch.arange(keys - queries, keys)[:, None]
    position = torch.arange(keys)[None, :]
    allowed = ((position <= own)[None] & visible[:, None, :].bool()) | (position == own)[None]
    return allowed[:, None]


def prefill(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], device: torch.device
) -> list[Prefix]:
    """Run prompts through `model` in one left-padded forward pass (masked, positions from each
    prompt's first token); keep each prompt's own cache (its padding cut off) and the logits of
    its last position (the LM head is applied to that position only). One batched call instead
    of one per prompt: on a GPU a 1.5B model's single-prompt pass is bound by kernel launches."""
    ids, mask, positions = left_pad(prompts)
    result = model(input_ids=ids.to(device),
                   attention_mask=attention_mask_4d(mask, mask.shape[1]).to(device),
                   position_ids=positions.to(device), use_cache=True, logits_to_keep=1)
    layers = [(layer.keys, layer.values) for layer in result.past_key_values.layers]
    pads = (~mask).sum(dim=1).tolist()
    return [Prefix(kv=[(k[row:row + 1, :, pad:], v[row:row + 1, :, pad:]) for k, v in layers],
                   logits=result.logits[row, -1], length=len(prompt))
            for row, (pad, prompt) in enumerate(zip(pads, prompts))]


def rows_cache(
    prefixes: Mapping[int, Prefix], prompts: Sequence[int], slot: torch.Tensor
) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For rows continuing the prompts `prompts` (distinct keys of `prefixes`; row i continues
    `prompts[slot[i]]`): the cache `[C, H, P_max, D]` per layer, its attention mask `[C, P_max]`
    (left padding masked), each row's prompt length `[C]` (its next position) and the logits of
    its first response token `[C, V]`. Reads nothing back from the device."""
    device = prefixes[prompts[0]].logits.device
    index = slot.to(device)
    kv, lengths, mask, logits = _stack(prefixes, prompts, index)
    layers = [(keys[index], values[index]) for keys, values in kv]
    return DynamicCache(ddp_cache_data=layers), mask[index].long(), lengths[index], logits


def _stack(prefixes: Mapping[int, Prefix], prompts: Sequence[int], index: torch.Tensor,
           p_width: int | None = None, n_groups: int | None = None
           ) -> tuple[KV, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompts `prompts` (keys of `prefixes`) of rows `index [C]` (each row's position in
    `prompts`): their caches per layer left-padded to the longest `[G, H, P_max, D]`, lengths
    `[G]`, masks `[G, P_max]`, and each row's first-token logits `[C, V]`. A fixed layout
    (`brorl.engines.decode`) pads P_max to `p_width` and G to `n_groups` (zero caches, nothing
    masked, no row of theirs)."""
    chosen = [prefixes[b] for b in prompts]
    p_max = max(p.length for p in chosen) if p_width is None else p_width
    extra = 0 if n_groups is None else n_groups - len(chosen)
    kv = []
    for layer in range(len(chosen[0].kv)):
        keys, values = zip(*[_pad_cache(p.kv[layer], p_max) for p in chosen])
        blank = keys[0].new_zeros(extra, *keys[0].shape[1:])
        kv.append((torch.cat([*keys, blank]), torch.cat([*values, blank])))
    lengths = torch.tensor([p.length for p in chosen] + [p_max] * extra, device=index.device)
    mask = torch.arange(p_max, device=index.device)[None, :] >= (p_max - lengths)[:, None]
    logits = torch.stack([p.logits for p in chosen])[index]
    return kv, lengths, mask, logits


def _pad_cache(kv: tuple[torch.Tensor, torch.Tensor], p_max: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """One prompt's (K, V) `[1, H, P, D]` left-padded with zeros to `P_max` positions."""
    pad = p_max - kv[0].shape[-2]
    if pad == 0:
        return kv
    keys, values = (torch.nn.functional.pad(t, (0, 0, pad, 0)) for t in kv)
    return keys, values


SHARED_PREFIX = "brorl_shared_prefix"
"""Attention implementation name under which `shared_prefix_attention` is registered."""

SHARED_PREFIX_MODELS = ("qwen2", "llama")
"""`config.model_type`s whose attention `shared_prefix_attention` replaces, tested for equality
with plain attention (their layers all call the registered attention with the layer's queries,
keys and values after RoPE, and take positions from `position_ids`)."""

logger = logging.getLogger(__name__)


def shares_prefix(model: torch.nn.Module) -> bool:
    """Whether `model`'s architecture is covered by the shared-prefix path (`SHARED_PREFIX_MODELS`,
    full attention in every layer). Otherwise callers fall back to plain attention, and a warning
    says so once per process and architecture."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if config.model_type not in SHARED_PREFIX_MODELS:
        _warn_plain(config.model_type)
        return False
    if set(layer_types) != {"full_attention"}:
        _warn_plain(f"{config.model_type} with {sorted(set(layer_types))} layers")
        return False
    return True


@functools.cache
def _warn_plain(architecture: str) -> None:
    logger.warning(
        "shared-prefix decoding covers %s only, not %s: generation and scoring fall back to "
        "plain attention (each rollout runs its own copy of the prompt).",
        "/".join(SHARED_PREFIX_MODELS), architecture)


@dataclass
class SharedPrefix:
    """The prompt caches of a decode chunk, one per group, attended by every row of the group.

    `kv` per layer `[G, H_kv, P_max, D]` (left-padded), `mask [G, P_max]` (False on padding),
    `group [C]`: each decoding row's group, ascending (a group's rows are contiguous). The rows
    are laid out for attention as a `[G, M]` grid (M: the most rows any group has), a group's
    rows side by side, so that one batched matmul per layer scores every row against its own
    group's prompt whatever the number of groups.
    """

    kv: KV
    mask: torch.Tensor
    group: torch.Tensor
    max_width: int | None = None
    """A fixed M (the fixed-shape decode step, `brorl.engines.decode`): no group may have more
    rows; None: M is the most rows any group has (one host sync per layout)."""
    spare: int | None = None
    """A group holding filler rows only (a fixed-shape chunk padded to its bucket size): they all
    share its first cell, whatever their number; their outputs are never read."""
    newest: torch.Tensor | None = None
    """`[1]` int64: in a fixed layout (the rows' cache allocated for every response position),
    the position of the newest token in the rows' cache; later positions are masked. None:
    every key of the rows' cache is attended."""
    bias: torch.Tensor = field(init=False)
    """`[G * H_kv, 1, P_max]`: 0 on prompt tokens, -inf on left padding (added to the scores)."""
    slot: torch.Tensor = field(init=False)
    """`[C]`: each row's cell in the `[G, M]` grid, flattened."""
    width: int = field(init=False)
    """M, the grid's row count per group."""

    def __post_init__(self) -> None:
        keys = self.kv[0][0]
        groups, kv_heads = keys.shape[:2]
        bias = torch.zeros(self.mask.shape, dtype=keys.dtype, device=keys.device)
        bias.masked_fill_(~self.mask.to(keys.device), float("-inf"))
        self.bias = bias[:, None, None, :].expand(-1, kv_heads, 1, -1).reshape(
            groups * kv_heads, 1, -1)
        self._layout()

    def keep(self, rows: torch.Tensor) -> None:
        """Go on with rows `rows` only (indices into the current rows, ascending)."""
        self.group = self.group[rows]
        self._layout()

    def pad(self, count: int) -> None:
        """Append `count` filler rows in the last group (`spare`), which no real row uses."""
        self.spare = self.mask.shape[0] - 1
        self.group = torch.cat([self.group, self.group.new_full((count,), self.spare)])
        self._layout()

    def _layout(self) -> None:
        counts = torch.zeros(self.mask.shape[0], dtype=torch.long, device=self.group.device)
        counts.scatter_add_(0, self.group, torch.ones_like(self.group))
        self.width = int(counts.max()) if self.max_width is None else self.max_width
        first = counts.cumsum(0) - counts  # each group's first row
        rank = torch.arange(len(self.group), device=self.group.device) - first[self.group]
        if self.spare is not None:
            rank = torch.where(self.group == self.spare, 0, rank)
        self.slot = self.group * self.width + rank


def group_prefixes(prefixes: Mapping[int, Prefix], groups: torch.Tensor, *,
                   max_width: int | None = None, p_width: int | None = None,
                   n_groups: int | None = None) -> tuple[SharedPrefix, torch.Tensor, torch.Tensor]:
    """For rows continuing prompts `groups [C]` (ascending keys of `prefixes`): their groups'
    caches stacked once each (`SharedPrefix`), each row's prompt length `[C]` (its next position)
    and the logits of its first response token `[C, V]`. Unlike `rows_cache`, no row gets a copy
    of its prompt's cache: decode with `shared_prefix_attention` and a cache of responses only.
    A fixed layout gives the grid's M (`max_width`), the prompt width and the group count
    (`_stack`)."""
    unique, index = torch.unique(groups, return_inverse=True)
    kv, lengths, mask, logits = _stack(prefixes, unique.tolist(), index, p_width, n_groups)
    return (SharedPrefix(kv=kv, mask=mask, group=index, max_width=max_width), lengths[index],
            logits)


def _to_grid(x: torch.Tensor, shared: SharedPrefix, groups: int) -> torch.Tensor:
    """Rows `[C, H_kv, K, E]` -> the grid `[G * H_kv, M * K, E]` (empty cells zero)."""
    rows, kv_heads, k, e = x.shape
    grid = x.new_zeros(groups * shared.width, kv_heads, k, e).index_copy_(0, shared.slot, x)
    return grid.view(groups, shared.width, kv_heads, k, e).transpose(1, 2).reshape(
        groups * kv_heads, shared.width * k, e)


def _from_grid(x: torch.Tensor, shared: SharedPrefix, groups: int, k: int) -> torch.Tensor:
    """The grid `[G * H_kv, M * K, E]` -> rows `[C, H_kv, K, E]`."""
    kv_heads, e = x.shape[0] // groups, x.shape[-1]
    cells = x.view(groups, kv_heads, shared.width, k, e).transpose(1, 2).reshape(
        groups * shared.width, kv_heads, k, e)
    return cells.index_select(0, shared.slot)


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    shared_prefix: SharedPrefix | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over a group's shared prompt cache plus each row's own response cache.

    `query [C, H, L, D]`, `key`/`value [C, H_kv, t, D]` (the responses so far, the L new tokens
    last). Scores against the prompts come from one batched matmul over the `[G, M]` grid of
    rows (`SharedPrefix`), each prompt's keys read once; scores against the responses from the
    rows' own caches; one softmax over both. The same dozen ops per layer for any number of
    prompts in the chunk. Equal to attention over the concatenated caches (to float rounding).
    Without `shared_prefix` it is plain SDPA, so the model's other calls are unaffected.
    """
    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    rows, heads, length, dim = query.shape
    kv_heads, seen = key.shape[1], key.shape[2]
    per_kv = heads // kv_heads * length  # queries per kv head (GQA), `length` positions each
    scale = dim ** -0.5 if scaling is None else scaling
    q = query.reshape(rows, kv_heads, per_kv, dim)
    prefix_k, prefix_v = shared_prefix.kv[module.layer_idx]
    groups, _, p_max, _ = prefix_k.shape
    grid_k = prefix_k.view(groups * kv_heads, p_max, dim).transpose(1, 2)
    scores_prompt = torch.baddbmm(shared_prefix.bias, _to_grid(q, shared_prefix, groups), grid_k,
                                  alpha=scale)
    scores_own = torch.matmul(q, key.transpose(-1, -2)).mul_(scale)
    if shared_prefix.newest is not None:  # fixed layout: positions not yet written are masked
        unwritten = torch.arange(seen, device=query.device) > shared_prefix.newest
        scores_own.masked_fill_(unwritten, float("-inf"))
    if length > 1:  # new token l sees the responses up to itself
        causal = torch.ones(length, seen, dtype=torch.bool, device=query.device).tril(seen - length)
        scores_own.masked_fill_(~causal.repeat(heads // kv_heads, 1), float("-inf"))
    scores = torch.cat([_from_grid(scores_prompt, shared_prefix, groups, per_kv), scores_own], -1)
    w_prompt, w_own = torch.softmax(scores, dim=-1).split([p_max, seen], dim=-1)
    out_prompt = torch.bmm(_to_grid(w_prompt, shared_prefix, groups),
                           prefix_v.view(groups * kv_heads, p_max, dim))
    out = torch.matmul(w_own, value).add_(_from_grid(out_prompt, shared_prefix, groups, per_kv))
    return out.view(rows, heads, length, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(SHARED_PREFIX, shared_prefix_attention)


@contextmanager
def attention(model: torch.nn.Module, implementation: str) -> Iterator[None]:
    """Run `model` with attention `implementation` inside the block, restoring it after."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = before
