"""One forward pass per prompt, shared by all of its rollouts: prefill and batch a prompt's cache.

A group's N rollouts share their prompt. Generation (`brorl.engines.hf`) and trainer-side scoring
(`brorl.train.ppo.response_logprobs`) both run each distinct prompt through the model once
(`prefill`, all of a call's distinct prompts in one padded pass) and then attend to its key/value cache from every row that continues it
(`rows_cache`): prompts of different lengths are left-padded and masked, positions continue from
each prompt's own length. Per rollout this costs about P/N + T token passes instead of P + T.
Outside `torch.no_grad()` gradients flow from every row back through the one shared prefill, so
the update's gradient is that of the unshared forward (tested to float tolerance).

Deliberately ignored: tree attention over shared response prefixes, paged/block KV layouts.
Paper: BroRL §4.2.4 / spec §6 (one shared prefix per prompt, many concurrent rollouts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

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
    unique, index = torch.unique(groups, return_inverse=True)
    chosen = [prefixes[int(b)] for b in unique.tolist()]
    p_max = max(p.length for p in chosen)
    layers = []
    for layer in range(len(chosen[0].kv)):
        keys, values = zip(*[_left_pad(p.kv[layer], p_max) for p in chosen])
        layers.append((torch.cat(keys)[index], torch.cat(values)[index]))
    device = index.device
    lengths = torch.tensor([p.length for p in chosen], device=device)[index]
    mask = torch.arange(p_max, device=device)[None, :] >= (p_max - lengths)[:, None]
    logits = torch.stack([p.logits for p in chosen])[index]
    return DynamicCache(ddp_cache_data=layers), mask.long(), lengths, logits


def _left_pad(kv: tuple[torch.Tensor, torch.Tensor], p_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    pad = p_max - kv[0].shape[-2]
    if pad == 0:
        return kv
    keys, values = (torch.nn.functional.pad(t, (0, 0, pad, 0)) for t in kv)
    return keys, values
