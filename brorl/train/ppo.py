"""Trainer-side log-probabilities and the gradient-accumulated PPO mini-batch.

The trainer's policy is the sampling distribution at the rollout temperature without top-p
(verl and OpenRLHF do the same): log pi(y_t) = log_softmax(logits / temperature)[y_t]. Top-p
differences between engine and trainer are left to truncated importance sampling.

A mini-batch (rows of the step's B x N rollouts) is processed in micro-batches of at most
`micro_batch_rollouts` rows and, with `update.max_tokens_per_micro_batch`, at most that many
computed positions, rows packed end to end or bucketed by length (`brorl.train.micro`, planned on
the host before the first forward): forward, `policy_loss` with the mini-batch's token count as
normaliser, `backward(loss)`. The gradients therefore sum to the mini-batch gradient whatever the
split (tested), and peak memory is bounded by the micro-batch, not by N. The loop reads nothing
back from the device: the metrics are summed there and read once per mini-batch. Scoring (old and
reference log-probs) runs the same micro-batches across prompt groups.

Each distinct prompt of a micro-batch is run once and shared by its rows (`brorl.policy.prefix`,
as in generation), so scoring and the update cost about P/N + T token passes per rollout, not
P + T; the LM head is applied only at positions that predict a response token. An architecture
outside `brorl.policy.prefix.SHARED_PREFIX_MODELS` runs each row's prompt and response in one
plain forward pass instead (same log-probs, P + T token passes).

With the token budget and the shared prefix, a micro-batch's rows are packed end to end in lanes
(`brorl.train.micro.Lanes`): one forward over the lanes, each row's positions restarting after its
prompt and its attention kept within its own tokens by a 4-D mask; the log-probs are taken on the
lanes and scattered back to the rows' `[M, T]` layout, so the loss is unchanged.

Deliberately ignored: logit chunking for very large vocabularies.
Paper: BroRL §3.1 (clipped PPO, clip-higher, TIS; token-level as NeMo-RL's ProRLv2 example
config), §4.2.1 (fixed mini-batch count).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from brorl.algorithm.losses import LossConfig, policy_loss, token_entropy
from brorl.policy.prefix import (
    Prefix,
    attention_mask_4d,
    left_pad,
    prefill,
    rows_cache,
    shares_prefix,
)
from brorl.train.micro import MicroBatch, describe, plan
from brorl.types import RolloutBatch


def prefill_prompts(model: torch.nn.Module, batch: RolloutBatch, prompts: list[int],
                    device: torch.device) -> dict[int, Prefix]:
    """Prompt index -> its prefill, for `prompts` (indices into `batch.prompt_ids`), in one pass."""
    return dict(zip(prompts, prefill(model, [batch.prompt_ids[b] for b in prompts], device)))


def response_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, rows: Tensor, temperature: float,
    with_entropy: bool = False, prefixes: Mapping[int, Prefix] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs `[M, T]` of rows' response tokens (0 on padding), and their entropy if asked.

    T is the longest response among `rows` (callers slice their `[.., T_batch]` tensors to it).
    Gradients flow when called outside `torch.no_grad()`. Each distinct prompt among `rows` is
    run once (`brorl.policy.prefix`) and its cache shared by its rows, whose responses are run
    on top of it; the LM head sees only positions that predict a response token. `prefixes`
    (prompt index -> its prefill, covering every prompt of `rows`) reuses prefills made before.
    Architectures the shared prefix does not cover (`shares_prefix`) run each row whole.
    """
    micro = describe(batch.prompt_ids, batch.prompt_index, batch.response_lengths, rows,
                     shares_prefix(model))
    return micro_logprobs(model, batch, micro, temperature, with_entropy, prefixes)


def micro_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, micro: MicroBatch, temperature: float,
    with_entropy: bool = False, prefixes: Mapping[int, Prefix] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`response_logprobs` of a planned micro-batch (`brorl.train.micro`): its shapes come from
    the plan, so nothing is read back from the device."""
    rows, t = micro.rows, micro.t
    device = next(model.parameters()).device
    if t == 0:
        empty = torch.zeros(len(rows), 0, device=device)
        return empty, (empty if with_entropy else None)
    if micro.lanes is not None:
        return _packed_logprobs(model, batch, micro, temperature, with_entropy, prefixes)
    if shares_prefix(model):
        picked = _shared_prefix_logits(model, batch, micro, prefixes)
    else:
        picked = _plain_logits(model, batch, rows, t)
    logp, entropy = _token_logprobs(picked, batch.response_ids[rows, :t].to(device), temperature,
                                    with_entropy)
    valid = (torch.arange(t)[None, :] < batch.response_lengths[rows][:, None]).to(device)
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    if entropy is not None:
        entropy = torch.where(valid, entropy, torch.zeros_like(logp))
    return logp, entropy


def _token_logprobs(logits: Tensor, tokens: Tensor, temperature: float, with_entropy: bool
                    ) -> tuple[Tensor, Tensor | None]:
    """Log-probs of `tokens [...]` under `logits [..., V]` at `temperature`, and the entropy."""
    picked = logits.float()
    if temperature > 0:
        picked = picked / temperature
    logp = torch.log_softmax(picked, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    return logp, (token_entropy(picked) if with_entropy else None)


def _packed_logprobs(model: torch.nn.Module, batch: RolloutBatch, micro: MicroBatch,
                     temperature: float, with_entropy: bool,
                     prefixes: Mapping[int, Prefix] | None) -> tuple[Tensor, Tensor | None]:
    """`micro_logprobs` of a packed micro-batch: token 0 of each row from its prompt's prefill,
    tokens 1.. from one forward over the lanes (`brorl.train.micro.Lanes`), each lane on top of
    its prompt's cache, scattered back to `[M, t]` (0 past each row's length)."""
    device = next(model.parameters()).device
    rows, t, lanes = micro.rows, micro.t, micro.lanes
    assert lanes is not None
    if prefixes is None:
        prefixes = prefill_prompts(model, batch, list(micro.prompts), device)
    first = torch.stack([prefixes[b].logits for b in micro.prompts])[micro.slot.to(device)]
    logp0, entropy0 = _token_logprobs(first, batch.response_ids[rows, 0].to(device), temperature,
                                      with_entropy)
    valid = (torch.arange(t)[None, :] < batch.response_lengths[rows][:, None]).to(device)
    zeros = torch.zeros(len(rows), t, device=device)
    packed = packed_entropy = None  # no lane: every row has at most one token
    if len(lanes.slot):
        ids, targets, positions, mask, index = _lane_layout(batch, micro)
        cache, _, prompt_lengths, _ = rows_cache(prefixes, micro.prompts, lanes.slot)
        visible = torch.cat([_prompt_visible(batch, micro.prompts, lanes.slot,
                                             cache.get_seq_length()).unsqueeze(1)
                             .expand(-1, lanes.width, -1), mask], dim=2)
        logits = model(
            input_ids=ids.to(device), attention_mask=visible[:, None].to(device),
            position_ids=prompt_lengths[:, None] + positions.to(device), past_key_values=cache,
            use_cache=False,
        ).logits
        packed, packed_entropy = _token_logprobs(logits, targets.to(device), temperature,
                                                 with_entropy)
        index = index.to(device)

    def unpack(head: Tensor, lanes_values: Tensor | None) -> Tensor:
        rest = zeros[:, 1:] if lanes_values is None else lanes_values.reshape(-1)[index]
        return torch.where(valid, torch.cat([head[:, None], rest], dim=1), zeros)

    entropy = unpack(entropy0, packed_entropy) if entropy0 is not None else None
    return unpack(logp0, packed), entropy


def _lane_layout(batch: RolloutBatch, micro: MicroBatch
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """On the host, for a packed micro-batch's `[L, W]` lanes: input ids (each row's tokens
    0..k-2), targets (its tokens 1..k-1), positions after the prompt (restarting per row), the
    `[L, W, W]` mask of which lane positions each position attends (its own row's, up to itself;
    a padding position itself only), and `[M, t - 1]` indices into the flattened lanes where row
    tokens 1..t-1 are predicted (0 past a row's length)."""
    lanes, rows, t = micro.lanes, micro.rows, micro.t
    assert lanes is not None
    count, width = len(lanes.slot), lanes.width
    ids = torch.zeros(count, width, dtype=torch.long)
    targets = torch.zeros(count, width, dtype=torch.long)
    positions = torch.zeros(count, width, dtype=torch.long)
    owner = torch.full((count, width), -1, dtype=torch.long)  # which row holds each position
    index = torch.zeros(len(rows), max(t - 1, 0), dtype=torch.long)
    for m, (row, k, lane, start) in enumerate(zip(rows.tolist(),
                                                  batch.response_lengths[rows].tolist(),
                                                  lanes.lane.tolist(), lanes.offset.tolist())):
        if k < 2:
            continue
        span = slice(start, start + k - 1)
        ids[lane, span] = batch.response_ids[row, : k - 1]
        targets[lane, span] = batch.response_ids[row, 1:k]
        positions[lane, span] = torch.arange(k - 1)
        owner[lane, span] = m
        index[m, : k - 1] = lane * width + torch.arange(start, start + k - 1)
    here = torch.arange(width)
    mask = ((owner[:, :, None] == owner[:, None, :]) & (owner[:, :, None] >= 0)
            & (here[None, None, :] <= here[None, :, None])) | (here[:, None] == here[None, :])
    return ids, targets, positions, mask, index


def _shared_prefix_logits(model: torch.nn.Module, batch: RolloutBatch, micro: MicroBatch,
                          prefixes: Mapping[int, Prefix] | None) -> Tensor:
    """Logits `[M, t, V]` predicting the micro-batch's response tokens 0..t-1: each distinct
    prompt run once (or taken from `prefixes`), its cache copied into its rows, the responses
    run on top."""
    device = next(model.parameters()).device
    rows, t = micro.rows, micro.t
    if prefixes is None:
        prefixes = prefill_prompts(model, batch, list(micro.prompts), device)
    cache, mask, lengths, first = rows_cache(prefixes, micro.prompts, micro.slot)
    if t == 1:
        return first[:, None]
    visible = torch.cat([_prompt_visible(batch, micro.prompts, micro.slot,
                                         cache.get_seq_length()),
                         torch.ones(len(rows), t - 1, dtype=torch.bool)], dim=1)
    rest = model(  # response tokens 0..t-2 predict tokens 1..t-1
        input_ids=batch.response_ids[rows, : t - 1].to(device),
        attention_mask=attention_mask_4d(visible, t - 1).to(device),
        position_ids=lengths[:, None] + torch.arange(t - 1, device=device)[None, :],
        past_key_values=cache,
        use_cache=False,
    ).logits
    return torch.cat([first[:, None], rest], dim=1)


def _prompt_visible(batch: RolloutBatch, prompts: tuple[int, ...], slot: Tensor,
                    width: int) -> Tensor:
    """`[R, width]` bool on the host: the prompt positions of sequences continuing
    `prompts[slot]` in a cache left-padded to `width` (what `rows_cache`'s mask holds, without
    reading it back)."""
    lengths = torch.tensor([len(batch.prompt_ids[b]) for b in prompts])[slot]
    return torch.arange(width)[None, :] >= (width - lengths)[:, None]


def _plain_logits(model: torch.nn.Module, batch: RolloutBatch, rows: Tensor, t: int) -> Tensor:
    """Logits `[M, t, V]` predicting rows' response tokens 0..t-1 from one plain forward pass
    over each row's left-padded prompt and its response tokens 0..t-2."""
    device = next(model.parameters()).device
    prompts = [batch.prompt_ids[b] for b in batch.prompt_index[rows].tolist()]
    ids, mask, positions = left_pad(prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    ids = torch.cat([ids, batch.response_ids[rows, : t - 1]], dim=1)
    mask = torch.cat([mask, torch.ones(len(rows), t - 1, dtype=torch.bool)], dim=1)
    positions = torch.cat([positions, lengths[:, None] + torch.arange(t - 1)[None, :]], dim=1)
    return model(input_ids=ids.to(device),
                 attention_mask=attention_mask_4d(mask, mask.shape[1]).to(device),
                 position_ids=positions.to(device), use_cache=False, logits_to_keep=t).logits


def micro_batches(model: torch.nn.Module, batch: RolloutBatch, rows: Tensor,
                  micro_batch_rollouts: int, max_tokens: int | None,
                  prefill_once: bool = False) -> list[MicroBatch]:
    """The micro-batches of `rows` (`brorl.train.micro.plan`): at most `micro_batch_rollouts`
    rows each and, with `max_tokens`, at most that many computed positions, each prompt's rows
    packed in lanes (shared prefix) or rows bucketed by length; `prefill_once` for scoring (each
    prompt prefilled once for all of them)."""
    shared = shares_prefix(model)
    return plan(batch.prompt_ids, batch.prompt_index, batch.response_lengths, rows,
                max_rows=micro_batch_rollouts, max_tokens=max_tokens, shared=shared,
                prefill_once=prefill_once, pack=shared)


@torch.no_grad()
def score_batch(
    model: torch.nn.Module, batch: RolloutBatch, temperature: float, micro_batch_rollouts: int,
    rows: Tensor | None = None, max_tokens: int | None = None,
    on_plan: Callable[[list[MicroBatch]], Any] | None = None,
) -> Tensor:
    """Log-probs `[B*N, T]` float32 under `model`, in micro-batches (`micro_batches`) across
    prompt groups.

    Only `rows` (default: all) are scored; the other rows stay 0. A prompt is prefilled once
    for all its rows, whichever micro-batches they fall in, and its cache dropped after the last
    micro-batch that needs it (the token-budget plan takes prompts in windows, so no more than a
    window's prompts are held at once). `on_plan` receives the plan (for throughput figures).
    """
    total, t = batch.response_ids.shape
    rows = torch.arange(total) if rows is None else rows
    device = next(model.parameters()).device
    out = torch.zeros(total, t, dtype=torch.float32, device=device)  # read back once, at the end
    parts = micro_batches(model, batch, rows, micro_batch_rollouts, max_tokens, prefill_once=True)
    if on_plan is not None:
        on_plan(parts)
    last = {b: i for i, micro in enumerate(parts) for b in micro.prompts}
    shared = shares_prefix(model)
    prefixes: dict[int, Prefix] = {}
    for i, micro in enumerate(parts):
        missing = [b for b in micro.prompts if b not in prefixes]
        if missing and shared:
            prefixes.update(prefill_prompts(model, batch, missing, device))
        logp, _ = micro_logprobs(model, batch, micro, temperature,
                                 prefixes=prefixes if shared else None)
        out[micro.rows.to(device), : logp.shape[1]] = logp.float()
        for done in [b for b in micro.prompts if last[b] == i]:
            prefixes.pop(done, None)
    return out.cpu()


def accumulate_mini_batch(
    model: torch.nn.Module,
    backward: Callable[[Tensor], Any],
    batch: RolloutBatch,
    rows: Tensor,
    *,
    advantages: Tensor,
    old_logp: Tensor,
    engine_logp: Tensor | None,
    ref_logp: Tensor | None,
    temperature: float,
    micro_batch_rollouts: int,
    normaliser: float,
    loss_scale: float = 1.0,
    num_micro_batches: int | None = None,
    max_tokens: int | None = None,
    parts: list[MicroBatch] | None = None,
    loss: LossConfig,
) -> dict[str, float]:
    """Forward/backward `rows` in micro-batches; return the mini-batch's `update/*` metrics.

    `advantages`, `old_logp`, `engine_logp`, `ref_logp` are `[B*N, T]` over the whole batch
    (token advantages; log-probs as from `score_batch`). `normaliser` is the valid-token count
    of the whole mini-batch (over all ranks); `loss_scale` multiplies the loss handed to
    `backward` (the data-parallel world size, when the backend averages gradients over ranks).
    Metrics are sums of per-micro-batch metrics, i.e. this rank's share of the mini-batch values,
    summed on the device and read once after the last micro-batch.

    Micro-batches (`micro_batches`, or `parts` when the caller planned them already): at most
    `micro_batch_rollouts` rows, and with `max_tokens` at most that many computed positions,
    packed or bucketed by length; without it, rows of one prompt together, right-padded (the
    row-padded layout). How a mini-batch is split does not
    change its gradient: each loss is over the mini-batch's tokens. `num_micro_batches` (default:
    as many as the plan has) fixes the number of backward calls, so every data-parallel rank makes
    the same number (ZeRO-2 reduces gradients inside each backward); the extra calls
    backpropagate a zero loss.
    """
    if parts is None:
        parts = micro_batches(model, batch, rows, micro_batch_rollouts, max_tokens)
    count = len(parts) if num_micro_batches is None else num_micro_batches
    if count < len(parts):
        size = f"<= {micro_batch_rollouts} rollouts" + (
            f" and <= {max_tokens} tokens" if max_tokens is not None else "")
        raise ValueError(
            f"{len(rows)} rows need {len(parts)} micro-batches of {size}, "
            f"got num_micro_batches={count}."
        )
    totals: dict[str, Any] = {}
    for micro in parts:
        logp, entropy = micro_logprobs(model, batch, micro, temperature, with_entropy=True)
        t = logp.shape[1]
        device = logp.device
        index = micro.rows

        def part(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[index, :t].to(device)

        mask = (torch.arange(t)[None, :] < batch.response_lengths[index][:, None]).to(device)
        value, metrics = policy_loss(
            logp, part(old_logp), part(advantages), mask, loss, normaliser=normaliser,
            engine_logp=part(engine_logp), ref_logp=part(ref_logp), entropy=entropy,
        )
        backward(value * loss_scale)
        for key, value in metrics.items():
            totals[key] = totals.get(key, 0.0) + value
    for _ in range(count - len(parts)):
        backward(_zero_loss(model))
    return read_metrics(totals)


def read_metrics(totals: Mapping[str, Any]) -> dict[str, float]:
    """Metrics summed on the device (0-d tensors, or floats) as floats, in one read."""
    keys = list(totals)
    if not keys:
        return {}
    device = next((v.device for v in totals.values() if isinstance(v, Tensor)), None)
    values = torch.stack([torch.as_tensor(totals[k], dtype=torch.float64, device=device).detach()
                          for k in keys])
    return dict(zip(keys, values.tolist()))


def _zero_loss(model: torch.nn.Module) -> Tensor:
    """0 * (sum of all trainable parameters): a backward that adds zero to every gradient."""
    return sum((p.sum() * 0.0 for p in model.parameters() if p.requires_grad), torch.tensor(0.0))
