"""Micro-batches by token budget: rows packed or bucketed by length, planned on the host.

A micro-batch is the rows one forward (and, in the update, one backward) runs at once. Right-padded
to its longest response, a micro-batch of rows with lengths 5 and 500 computes 1,000 positions for
505 real ones; verl (`use_dynamic_bsz`) and NeMo-RL (dynamic batching) size micro-batches by tokens
and group rows by length instead. `plan` does the same: the rows' prompts are taken in windows
whose prompt tokens fill at most `1 / PREFILL_SHARE` of the budget (each prompt of a micro-batch is
prefilled once for all of its rows, `brorl.policy.prefix`), the window's rows are sorted by
response length (longest first; or by prompt, then length, where that costs less) and cut into
consecutive micro-batches, each within `max_tokens`
computed positions (`cost`: its prompts' prefill plus its rows' padded responses) and `max_rows`
rows, at the cuts that minimise the computed positions plus a fixed overhead per micro-batch
(`OVERHEAD_SHARE`; dynamic programming over the cuts). Filling each micro-batch greedily up to the
budget instead would put short rows beside long ones whenever the budget has room. A row that alone
exceeds the budget is a micro-batch of its own. With plain
attention (no shared prefix) every row runs its own left-padded prompt, so rows are sorted by
prompt + response length over the whole set.

Everything a micro-batch's forward needs to know about its shape (its longest response, its
distinct prompts, each row's prompt slot) is computed here, on the host, before the first forward,
so the micro-batch loop reads nothing back from the device.

Packing (`pack`, the shared-prefix path): the rows of one prompt are laid end to end in lanes,
sequences as long as the window's longest response, each row's positions restarting after the
prompt and its attention kept to its prompt and its own earlier tokens (`Lanes`, a 4-D mask
built on the host, `brorl.train.ppo`); the micro-batches are cut over lanes instead of rows.
Rows of very different lengths then share a lane instead of padding to the longest, so the
padding left is a lane's unused tail. A lane holds one prompt's rows only: its prompt cache is
that prompt's. With plain attention (no shared prefix) rows are bucketed by length, which works
with every attention implementation.

Deliberately ignored: lanes across prompts (a lane would carry several prompt caches) and varlen
attention kernels (the lane's mask is dense: a lane of width W attends W x (P + W) scores).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

PREFILL_SHARE = 4
"""A window's prompt tokens fill at most 1/4 of the token budget, so at least 3/4 of a micro-batch's
positions are responses (a micro-batch prefills each of its prompts)."""

OVERHEAD_SHARE = 64
"""A micro-batch costs as much as 1/64 of the budget's positions besides its own (kernel launches,
Python, the per-call work of backward): the plan cuts the sorted rows into one more micro-batch only
where that saves more padding than this. Our choice; `benchmarks/step_memory.py --checkpoint`
shows the padding share it leaves with a real model."""


@dataclass(frozen=True)
class MicroBatch:
    """One forward's rows and what their shapes are, known before it runs."""

    rows: Tensor
    """`[M]` int64 (CPU): indices of the rows in the step's batch."""
    t: int
    """The longest response among `rows` (their tensors are sliced to it)."""
    prompts: tuple[int, ...]
    """The distinct prompt indices of `rows`, ascending."""
    slot: Tensor
    """`[M]` int64 (CPU): each row's position in `prompts`."""
    computed: int
    """Positions the forward runs (`cost`): prompt prefills and padded responses."""
    valid: int
    """Of `computed`, the real ones: prompts' own tokens and responses' own tokens."""
    attended: int
    """Keys the `valid` positions attend, summed (each prompt token its prompt so far, each
    response position its prompt and its response so far): the attention's share of FLOPs."""
    predicted: int
    """Response tokens predicted (positions through the LM head that count)."""
    lanes: Lanes | None = None
    """Packed (`pack`): where each row's response tokens sit in the forward's sequences; None:
    one sequence per row, right-padded to `t`."""


@dataclass(frozen=True)
class Lanes:
    """Rows packed end to end in `L` sequences ("lanes") of `width` positions, each lane one
    prompt's rows. A row with k response tokens occupies positions `offset .. offset + k - 2`
    of its lane, holding its tokens 0..k-2 (each predicting the next; token 0's own prediction
    comes from the prompt's prefill)."""

    slot: Tensor
    """`[L]` int64: each lane's prompt, as a position in the micro-batch's `prompts`."""
    lane: Tensor
    """`[M]` int64: each row's lane (-1: a row of at most one token, which needs none)."""
    offset: Tensor
    """`[M]` int64: the position of each row's token 0 in its lane."""
    width: int
    """Positions per lane: the most any lane uses."""


def cost(prompt_lengths: Sequence[int], response_lengths: Sequence[int], shared: bool) -> int:
    """Positions one forward runs over rows with responses of `response_lengths` tokens. Shared
    prefix: `prompt_lengths` are the distinct prompts', each prefilled once, left-padded to the
    longest, and every row runs its response padded to the longest (t - 1 positions: the first
    response token's logits come from the prefill). Plain attention: `prompt_lengths` are every
    row's, and each row runs prompt and response, padded to the longest of each."""
    rows, t = len(response_lengths), max(response_lengths, default=0)
    if t == 0:
        return 0
    p = max(prompt_lengths, default=0)
    if shared:
        return len(prompt_lengths) * p + rows * (t - 1)
    return rows * (p + t - 1)


def plan(prompt_ids: Sequence[Sequence[int]], prompt_index: Tensor, response_lengths: Tensor,
         rows: Tensor, *, max_rows: int, max_tokens: int | None, shared: bool,
         prefill_once: bool = False, pack: bool = False) -> list[MicroBatch]:
    """The micro-batches of `rows` (indices into a batch whose row r continues prompt
    `prompt_index[r]` of `prompt_ids` with a response of `response_lengths[r]` tokens).

    `max_tokens` None: the rows as they come, grouped by prompt, in equal slices of at most
    `max_rows` (the row-padded layout). Otherwise by token budget (module docstring). Every row is
    in exactly one micro-batch; rows with an empty response are in one too (their loss is zero).
    `prefill_once` (scoring, without gradients): a prompt is prefilled once, by the first
    micro-batch that needs it, and kept for the later ones, so the cuts weigh responses only and
    a micro-batch counts the prefill of its new prompts alone. `pack` (shared prefix, with
    `max_tokens`): rows in lanes (`Lanes`), `max_rows` then counting lanes, not rows.
    """
    rows = rows.to(torch.int64).cpu()
    groups = prompt_index[rows].tolist()
    lengths = response_lengths[rows].tolist()
    order: list[list[int]]
    if max_tokens is None:
        by_prompt = torch.tensor(sorted(range(len(rows)), key=lambda i: groups[i]),
                                 dtype=torch.long)
        count = max(-(-len(rows) // max_rows), 1)
        order = [part.tolist() for part in torch.tensor_split(by_prompt, count) if part.numel()]
    elif pack and shared:
        return _packed(prompt_ids, rows, groups, lengths, max_rows, max_tokens, prefill_once)
    else:
        order = _pack(prompt_ids, groups, lengths, max_rows, max_tokens, shared,
                      prompt_cost=not (shared and prefill_once))
    if not (shared and prefill_once):
        return [_micro_batch(prompt_ids, rows, groups, lengths, part, shared) for part in order]
    done: set[int] = set()
    out = []
    for part in order:
        new = tuple(sorted({groups[i] for i in part} - done))
        done.update(new)
        out.append(_micro_batch(prompt_ids, rows, groups, lengths, part, shared, new))
    return out


def _packed(prompt_ids: Sequence[Sequence[int]], rows: Tensor, groups: list[int],
            lengths: list[int], max_lanes: int, max_tokens: int,
            prefill_once: bool) -> list[MicroBatch]:
    """The packed plan (module docstring): per prompt window, each prompt's rows first-fit by
    decreasing length into lanes as wide as the window's longest response (and, with the
    prompt, within the budget: a longer row has a lane of its own), the lanes cut into
    micro-batches like rows are (`_segments`, a lane costing its used positions)."""
    out: list[MicroBatch] = []
    done: set[int] = set()
    for window in _windows(prompt_ids, groups, max_tokens):
        width = max(max(lengths[i] - 1 for i in window), 1)
        lanes: list[list[int]] = []  # positions into the rows, per lane
        used: list[int] = []
        owner: list[int] = []  # each lane's prompt
        for b in sorted({groups[i] for i in window}):
            mine = sorted((i for i in window if groups[i] == b), key=lambda i: (-lengths[i], i))
            first = len(lanes)
            room = min(width, max_tokens - len(prompt_ids[b]))  # a lane alone within the budget
            for i in mine:
                need = max(lengths[i] - 1, 0)
                home = next((k for k in range(first, len(lanes)) if used[k] + need <= room),
                            None)
                if home is None:
                    lanes.append([])
                    used.append(0)
                    owner.append(b)
                    home = len(lanes) - 1
                lanes[home].append(i)
                used[home] += need
        prompts = [len(prompt_ids[b]) for b in owner]
        cuts = _segments(list(range(len(lanes))), prompts, owner, [u + 1 for u in used],
                         max_lanes, max_tokens, True, prompt_cost=not prefill_once)
        for part in cuts:
            new = None
            if prefill_once:
                new = tuple(sorted({owner[k] for k in part} - done))
                done.update(new)
            out.append(_lanes_batch(prompt_ids, rows, groups, lengths,
                                    [lanes[k] for k in part], new))
    return out


def _lanes_batch(prompt_ids: Sequence[Sequence[int]], rows: Tensor, groups: list[int],
                 lengths: list[int], lanes: list[list[int]],
                 new: tuple[int, ...] | None) -> MicroBatch:
    """The micro-batch of `lanes` (positions into `rows`, each lane one prompt's rows, laid
    end to end in that order)."""
    part = [i for lane in lanes for i in lane]
    batch = _micro_batch(prompt_ids, rows, groups, lengths, part, True, new)
    where = {b: k for k, b in enumerate(batch.prompts)}
    lane_of, offset, slot = [], [], []
    width = 0
    for lane in lanes:
        position = 0
        real = any(lengths[i] > 1 for i in lane)
        for i in lane:
            lane_of.append(len(slot) if real else -1)
            offset.append(position)
            position += max(lengths[i] - 1, 0)
        if real:
            slot.append(where[groups[lane[0]]])
            width = max(width, position)
    prefill = batch.computed - (len(part) * max(batch.t - 1, 0))
    return replace(batch, computed=prefill + len(slot) * width, lanes=Lanes(
        slot=torch.tensor(slot, dtype=torch.long), lane=torch.tensor(lane_of, dtype=torch.long),
        offset=torch.tensor(offset, dtype=torch.long), width=width))


def describe(prompt_ids: Sequence[Sequence[int]], prompt_index: Tensor, response_lengths: Tensor,
             rows: Tensor, shared: bool) -> MicroBatch:
    """`rows` as one micro-batch (as `plan` would describe it)."""
    rows = rows.to(torch.int64).cpu()
    groups, lengths = prompt_index[rows].tolist(), response_lengths[rows].tolist()
    return _micro_batch(prompt_ids, rows, groups, lengths, list(range(len(rows))), shared)


def _pack(prompt_ids: Sequence[Sequence[int]], groups: list[int], lengths: list[int],
          max_rows: int, max_tokens: int, shared: bool, prompt_cost: bool) -> list[list[int]]:
    """Positions into the rows, in micro-batches by token budget (module docstring)."""
    windows = _windows(prompt_ids, groups, max_tokens) if shared else [list(range(len(groups)))]
    out: list[list[int]] = []
    for window in windows:
        out.extend(_segments(window, [len(prompt_ids[b]) for b in groups], groups, lengths,
                             max_rows, max_tokens, shared, prompt_cost))
    return out


def _windows(prompt_ids: Sequence[Sequence[int]], groups: list[int],
             max_tokens: int) -> list[list[int]]:
    """Positions into the rows, by prompt, in windows of prompts whose tokens fill at most
    `1 / PREFILL_SHARE` of `max_tokens` (one prompt alone may fill more)."""
    members: dict[int, list[int]] = {}
    for i, b in enumerate(groups):
        members.setdefault(b, []).append(i)
    windows: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for b in sorted(members):
        p = len(prompt_ids[b])
        if current and tokens + p > max_tokens // PREFILL_SHARE:
            windows.append(current)
            current, tokens = [], 0
        current.extend(members[b])
        tokens += p
    if current:
        windows.append(current)
    return windows


def _segments(window: list[int], prompts: list[int], groups: list[int], lengths: list[int],
              max_rows: int, max_tokens: int, shared: bool,
              prompt_cost: bool = True) -> list[list[int]]:
    """The rows `window` cut into consecutive micro-batches of least computed positions plus
    `max_tokens // OVERHEAD_SHARE` per micro-batch (one cut more pays only where it saves more
    padding than that), each within `max_rows` and `max_tokens`: the better of two orders, every
    row by length (least padding) or the rows of each prompt together, by length within it
    (fewest prefills, where a prompt costs more than the padding it saves). Shared prefix: a
    micro-batch's prompts count (`prompt_cost`) unless prefilled once outside."""
    def size(i: int) -> int:
        return lengths[i] + (0 if shared else prompts[i])

    orders = [sorted(window, key=lambda i: (-size(i), groups[i], i)),
              sorted(window, key=lambda i: (groups[i], -size(i), i))]
    plans = [_cut(order, prompts, groups, lengths, max_rows, max_tokens, shared, prompt_cost)
             for order in orders]
    return min(plans)[1]


def _cut(order: list[int], prompts: list[int], groups: list[int], lengths: list[int],
         max_rows: int, max_tokens: int, shared: bool, prompt_cost: bool
         ) -> tuple[int, list[list[int]]]:
    """The rows `order` cut into consecutive micro-batches at the least cost (dynamic
    programming over the cuts); the cost and the micro-batches."""
    overhead = max_tokens // OVERHEAD_SHARE
    best = [0] + [0] * len(order)
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):  # the best plan of order[:j], its last cut
        seen: set[int] = set()
        t = p = 0
        best[j] = -1
        for i in range(j - 1, max(-1, j - 1 - max_rows), -1):  # last micro-batch order[i:j]
            row = order[i]
            t, p = max(t, lengths[row]), max(p, prompts[row])
            seen.add(groups[row])
            rows = j - i
            prefill = len(seen) * p if prompt_cost else 0
            computed = 0 if t == 0 else (prefill + rows * (t - 1) if shared
                                         else rows * (p + t - 1))
            if computed > max_tokens and rows > 1:
                break  # it only grows with more rows
            total = best[i] + computed + overhead
            if best[j] < 0 or total < best[j]:
                best[j], cut[j] = total, i
    parts: list[list[int]] = []
    j = len(order)
    while j > 0:
        parts.append(order[cut[j]:j])
        j = cut[j]
    return best[-1], parts[::-1]


def _prompt_lengths(prompt_ids: Sequence[Sequence[int]], groups: Sequence[int],
                    shared: bool) -> list[int]:
    """The prompt lengths `cost` takes: the distinct prompts' (shared) or every row's."""
    if shared:
        return [len(prompt_ids[b]) for b in sorted(set(groups))]
    return [len(prompt_ids[b]) for b in groups]


def _micro_batch(prompt_ids: Sequence[Sequence[int]], rows: Tensor, groups: list[int],
                 lengths: list[int], part: list[int], shared: bool,
                 new: tuple[int, ...] | None = None) -> MicroBatch:
    """The micro-batch of positions `part` into `rows`, with its shapes and token counts; `new`
    (shared prefix, prompts prefilled once): the prompts this micro-batch prefills (None: all of
    its own)."""
    mine = [groups[i] for i in part]
    prompts = tuple(sorted(set(mine)))
    where = {b: k for k, b in enumerate(prompts)}
    own = [lengths[i] for i in part]
    if new is None:
        computed = cost(_prompt_lengths(prompt_ids, mine, shared), own, shared)
    else:
        widest = max((len(prompt_ids[b]) for b in new), default=0)
        computed = len(new) * widest + len(own) * max(max(own, default=0) - 1, 0)
    valid = attended = 0
    if max(own, default=0) > 0:
        prefilled = (prompts if new is None else new) if shared else mine
        valid = sum(len(prompt_ids[b]) for b in prefilled) + sum(max(k - 1, 0) for k in own)
        attended = sum(len(prompt_ids[b]) * (len(prompt_ids[b]) + 1) // 2 for b in prefilled) \
            + sum((k - 1) * len(prompt_ids[b]) + (k - 1) * k // 2 for b, k in zip(mine, own) if k)
    return MicroBatch(rows=rows[torch.tensor(part, dtype=torch.long)], t=max(own, default=0),
                      prompts=prompts, slot=torch.tensor([where[b] for b in mine],
                                                         dtype=torch.long),
                      computed=computed, valid=valid, attended=attended, predicted=sum(own))
