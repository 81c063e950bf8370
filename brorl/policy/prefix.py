"""One forward pass per prompt, shared by all of its rollouts: prefill and batch a prompt's cache.

A group's N rollouts share their prompt. Generation (`brorl.engines.hf`) and trainer-side scoring
(`brorl.train.ppo.response_logprobs`) both run each distinct prompt through the model once
(`prefill`, all of a call's distinct prompts in one padded pass). Scoring then copies the prompt's
key/value cache into every row that continues it (`rows_cache`: one pass over all response
tokens); decoding, one token per row per step, keeps each prompt's cache once (`group_prefixes`)
and attends to it from all of the group's rows with one matmul per group
(`shared_prefix_attention`, registered with transformers' AttentionInterface), the rows' own
cache holding their responses only. Prompts of different lengths are left-padded and masked,
positions continue from each prompt's own length. Per rollout this costs about P/N + T token
passes instead of P + T. Outside `torch.no_grad()` gradients flow from every row back through the
one shared prefill, so the update's gradient is that of the unshared forward (tested to float
tolerance).

Deliberately ignored: tree attention over shared response prefixes, paged/block KV layouts.
Paper: BroRL §4.2.4 / spec §6 (one shared prefix per prompt, many concurrent rollouts).
"""

from __future__ import annotations

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


def prefill(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], device: torch.device
) -> list[Prefix]:
    """Run prompts through `model` in one left-padded forward pass (masked, positions from each
    prompt's first token); keep each prompt's own cache (its padding cut off) and the logits of
    its last position (the LM head is applied to that position only). One batched call instead
    of one per prompt: on a GPU a 1.5B model's single-prompt pass is bound by kernel launches."""
    lengths = [len(ids) for ids in prompts]
    p_max = max(lengths)
    ids = torch.zeros(len(prompts), p_max, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, p_max - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
    pads = torch.tensor([p_max - n for n in lengths])
    mask = torch.arange(p_max)[None, :] >= pads[:, None]
    positions = (torch.arange(p_max)[None, :] - pads[:, None]).clamp(min=0)
    result = model(input_ids=ids.to(device), attention_mask=mask.long().to(device),
                   position_ids=positions.to(device), use_cache=True, logits_to_keep=1)
    layers = [(layer.keys, layer.values) for layer in result.past_key_values.layers]
    return [Prefix(kv=[(k[row:row + 1, :, pad:], v[row:row + 1, :, pad:]) for k, v in layers],
                   logits=result.logits[row, -1], length=n)
            for row, (pad, n) in enumerate(zip(pads.tolist(), lengths))]


def rows_cache(
    prefixes: Mapping[int, Prefix], groups: torch.Tensor
) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For rows continuing prompts `groups [C]` (keys of `prefixes`): the cache `[C, H, P_max, D]`
    per layer, its attention mask `[C, P_max]` (left padding masked), each row's prompt length
    `[C]` (its next position) and the logits of its first response token `[C, V]`."""
    index, kv, lengths, mask, logits = _stack(prefixes, groups)
    layers = [(keys[index], values[index]) for keys, values in kv]
    return DynamicCache(ddp_cache_data=layers), mask[index].long(), lengths[index], logits


def _stack(prefixes: Mapping[int, Prefix], groups: torch.Tensor
           ) -> tuple[torch.Tensor, KV, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct prompts of rows `groups [C]`: each row's index among them `[C]`, their caches
    per layer left-padded to the longest `[G, H, P_max, D]`, lengths `[G]`, masks `[G, P_max]`,
    and each row's first-token logits `[C, V]`."""
    unique, index = torch.unique(groups, return_inverse=True)
    chosen = [prefixes[int(b)] for b in unique.tolist()]
    p_max = max(p.length for p in chosen)
    kv = []
    for layer in range(len(chosen[0].kv)):
        keys, values = zip(*[_left_pad(p.kv[layer], p_max) for p in chosen])
        kv.append((torch.cat(keys), torch.cat(values)))
    lengths = torch.tensor([p.length for p in chosen], device=index.device)
    mask = torch.arange(p_max, device=index.device)[None, :] >= (p_max - lengths)[:, None]
    logits = torch.stack([p.logits for p in chosen])[index]
    return index, kv, lengths, mask, logits


def _left_pad(kv: tuple[torch.Tensor, torch.Tensor], p_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    pad = p_max - kv[0].shape[-2]
    if pad == 0:
        return kv
    keys, values = (torch.nn.functional.pad(t, (0, 0, pad, 0)) for t in kv)
    return keys, values


SHARED_PREFIX = "brorl_shared_prefix"
"""Attention implementation name under which `shared_prefix_attention` is registered."""


@dataclass
class SharedPrefix:
    """The prompt caches of a decode chunk, one per group, attended by every row of the group.

    `kv` per layer `[G, H_kv, P_max, D]` (left-padded), `mask [G, P_max]` (False on padding),
    `group [C]`: each decoding row's group, ascending (a group's rows are contiguous).
    """

    kv: KV
    mask: torch.Tensor
    group: torch.Tensor
    spans: list[tuple[int, int, int]] = field(init=False)
    """(group, first row, end row) of each group's rows, from `group`."""
    padded: list[bool] = field(init=False)
    """Per group: whether its prompt is shorter than `P_max` (only then is `mask` applied)."""

    def __post_init__(self) -> None:
        self.spans = group_spans(self.group)
        self.padded = (~self.mask[:, 0]).tolist()

    def keep(self, rows: torch.Tensor) -> None:
        """Go on with rows `rows` only (indices into the current rows, ascending)."""
        self.group = self.group[rows]
        self.spans = group_spans(self.group)


def group_prefixes(prefixes: Mapping[int, Prefix], groups: torch.Tensor
                   ) -> tuple[SharedPrefix, torch.Tensor, torch.Tensor]:
    """For rows continuing prompts `groups [C]` (ascending keys of `prefixes`): their groups'
    caches stacked once each (`SharedPrefix`), each row's prompt length `[C]` (its next position)
    and the logits of its first response token `[C, V]`. Unlike `rows_cache`, no row gets a copy
    of its prompt's cache: decode with `shared_prefix_attention` and a cache of responses only."""
    index, kv, lengths, mask, logits = _stack(prefixes, groups)
    return SharedPrefix(kv=kv, mask=mask, group=index), lengths[index], logits


def group_spans(index: torch.Tensor) -> list[tuple[int, int, int]]:
    """(group, first row, end row) of each run of equal values in the ascending `index [C]`."""
    values, counts = torch.unique_consecutive(index, return_counts=True)
    ends = counts.cumsum(0).tolist()
    return [(g, end - c, end) for g, c, end in zip(values.tolist(), counts.tolist(), ends)]


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
    last). Scores against the prompt come from one matmul per group on its single cache copy,
    scores against the response from the rows' own caches; one softmax over both. Equal to
    attention over the concatenated caches (to float rounding). Without `shared_prefix` it is
    plain SDPA, so the model's other calls are unaffected.
    """
    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    rows, heads, length, dim = query.shape
    kv_heads, seen = key.shape[1], key.shape[2]
    per_kv = heads // kv_heads * length  # queries per kv head (GQA), `length` positions each
    scale = dim ** -0.5 if scaling is None else scaling
    q = query.reshape(rows, kv_heads, per_kv, dim)
    scores_own = torch.matmul(q, key.transpose(-1, -2)).mul_(scale)
    if length > 1:  # new token l sees the responses up to itself
        causal = torch.ones(length, seen, dtype=torch.bool, device=query.device).tril(seen - length)
        scores_own.masked_fill_(~causal.repeat(heads // kv_heads, 1), float("-inf"))
    prefix_k, prefix_v = shared_prefix.kv[module.layer_idx]
    p_max = prefix_k.shape[2]
    scores_prompt = scores_own.new_empty(rows, kv_heads, per_kv, p_max)
    for group, first, end in shared_prefix.spans:
        # [n, H_kv, M, D] -> [H_kv, n M, D] @ [H_kv, D, P]: the group's keys read once
        qg = q[first:end].transpose(0, 1).reshape(kv_heads, -1, dim)
        sg = torch.bmm(qg, prefix_k[group].transpose(-1, -2)).mul_(scale)
        if shared_prefix.padded[group]:
            sg.masked_fill_(~shared_prefix.mask[group], float("-inf"))
        scores_prompt[first:end] = sg.view(kv_heads, end - first, per_kv, p_max).transpose(0, 1)
    weights = torch.softmax(torch.cat([scores_prompt, scores_own], dim=-1), dim=-1)
    w_prompt, w_own = weights.split([p_max, seen], dim=-1)
    out = torch.matmul(w_own, value)
    for group, first, end in shared_prefix.spans:
        wg = w_prompt[first:end].transpose(0, 1).reshape(kv_heads, -1, p_max)
        og = torch.bmm(wg, prefix_v[group]).view(kv_heads, end - first, per_kv, dim)
        out[first:end] += og.transpose(0, 1)
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
