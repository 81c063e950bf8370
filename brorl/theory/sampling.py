"""Exact draws from many categorical rows at once: inverse-CDF and rejection sampling.

The token-level simulator (`brorl.theory.simulator`) draws N tokens from each of S rows of a
policy over V = 128,000 tokens every step, N up to 51,200. Two exact samplers:

- inverse CDF (`draw_from_cdf`) from float64 running sums: below N = V/8 a binary search per draw;
  above it, uniforms generated already sorted and a guide table (Chen & Asau 1974), so each draw
  costs O(1). It works for any distribution, but needs the running sums (a pass over V).
- rejection (`draw_by_rejection`) for rows made of a few column ranges within each of which the
  probabilities are close (the simulator's classes: correct tokens, wrong tokens, the anchor):
  the draws per range are multinomial, then each range proposes uniformly among its columns and
  accepts column i with probability p_i / max p. No running sums, no pass over V per draw.

Each row draws from its own numpy generator, and how many variates a row takes depends on that
row alone, so a row's draws do not depend on the others. Per-step temporaries live in a `Scratch`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor


class Scratch:
    """Reusable scratch tensors by name. A fresh multi-megabyte tensor every step costs more here
    than the arithmetic on it (each one is new memory from the OS and page-faults in), so the
    simulator's per-step temporaries at large V live here."""

    def __init__(self) -> None:
        self._tensors: dict[str, Tensor] = {}
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """The tensor `name` of this shape and dtype (contents undefined), made on first use."""
        t = self._tensors.get(name)
        if t is None or t.shape != shape or t.dtype != dtype:
            t = self._tensors[name] = torch.empty(shape, dtype=dtype)
        return t

    def array(self, name: str, size: int, dtype: type[np.generic]) -> np.ndarray:
        """A numpy array of `size` elements viewing the flat buffer `name` (contents undefined),
        which grows by half again when too small: for a size that changes a little every call.
        numpy, not torch: a small numpy call costs a fraction of a torch op's dispatch."""
        buffer = self._arrays.get(name)
        if buffer is None or buffer.size < size or buffer.dtype != dtype:
            buffer = self._arrays[name] = np.empty(size + size // 2, dtype=dtype)
        return buffer[:size]


def row_cumsum(x: Tensor, block: int = 256, workspace: Tensor | None = None) -> Tensor:
    """Float64 cumulative sums along the last axis of `x [S, V]`, in blocks.

    Same values as `x.double().cumsum(-1)`, about 13x faster at V = 128,000: torch's CPU cumsum
    over one long float64 row is slow, over many short rows fast. Sums within blocks, then block
    offsets; rows of at most 65,536 that fill the workspace take one plain cumsum (faster there).
    `workspace` (float64 `[S, ceil(V / block) * block]`) avoids a fresh allocation; on return its
    positions past V hold the row's total, so its whole rows are sorted too. `x` may be the
    workspace itself.
    """
    rows, vocab = x.shape
    padded_len = -(-vocab // block) * block
    if workspace is None:
        workspace = torch.empty(rows, padded_len, dtype=torch.float64)
    if vocab == padded_len and vocab <= 65536:  # short rows: one plain cumsum is faster
        return torch.cumsum(x, -1, dtype=torch.float64, out=workspace)
    if x.data_ptr() != workspace.data_ptr() or x.stride() != workspace.stride():
        workspace[:, :vocab].copy_(x)
    workspace[:, vocab:].zero_()
    sums = workspace.view(rows, -1, block)
    sums.cumsum_(-1)
    offsets = sums[:, :, -1].cumsum(-1)
    sums[:, 1:, :] += offsets[:, :-1, None]
    return workspace[:, :vocab]


@torch.no_grad()
def draw_tokens(p: Tensor, rollouts: int, generators: Sequence[np.random.Generator],
                scratch: Scratch | None = None) -> Tensor:
    """`[S, N]` int64 i.i.d. draws from each row of `p [S, V]` (need not be normalised): the
    float64 running sums of `p`, then `draw_from_cdf`."""
    s = scratch if scratch is not None else Scratch()
    rows, vocab = p.shape
    padded = s.get("cdf", (rows, -(-vocab // 256) * 256), torch.float64)
    row_cumsum(p, workspace=padded)
    return draw_from_cdf(padded, vocab, rollouts, generators, s)


@torch.no_grad()
def draw_from_cdf(cdf: Tensor, vocab: int, rollouts: int,
                  generators: Sequence[np.random.Generator], scratch: Scratch) -> Tensor:
    """`[S, N]` int64 i.i.d. draws of tokens `0..vocab-1`, exact inverse-CDF sampling.

    `cdf [S, >= V]` is contiguous float64, each row the running sums of its token masses, positions
    past V holding the row's total (what `row_cumsum` leaves in its workspace); a row need not sum
    to 1, and at many draws it is rescaled in place. Each row draws from its own numpy generator.

    Below N = V/8, a binary search per draw. Otherwise the N uniforms come sorted (cumulative
    Exp(1) spacings over their total, so every lookup walks forward through memory), and a guide
    table (Chen & Asau 1974) maps each of V equal slices of the CDF's range to the first token
    that reaches it, so a uniform starts its search next to its answer: O(1) expected work per
    draw. The draws are i.i.d., so only their multiset matters; they come in ascending token order.
    """
    rows = cdf.shape[0]
    s = scratch
    f64, i64, i32 = torch.float64, torch.int64, torch.int32
    if rollouts * 8 < vocab:  # few draws: a binary search each is cheaper than building the table
        u = torch.from_numpy(np.stack([g.random(rollouts) for g in generators]))
        u *= cdf[:, vocab - 1:vocab]  # uniforms on [0, total) instead of normalising the cdf
        return torch.searchsorted(cdf, u, right=True).clamp_(max=vocab - 1)
    # Scaled to [0, V], slice b of the table is [b, b + 1) and a value's slice is its integer part.
    cdf.mul_(vocab / cdf[:, vocab - 1:vocab])
    slice_of = s.get("slice_of", (rows, vocab), i64)
    slice_of.copy_(cdf[:, :vocab])
    hist = s.get("hist", (rows, vocab + 1), i32).zero_()
    hist.scatter_add_(1, slice_of, torch.ones(1, dtype=i32).expand(rows, vocab))
    # guide[b] = #tokens whose scaled cdf is below b: the first that reaches slice b
    guide = torch.cumsum(hist, -1, out=s.get("guide", (rows, vocab + 1), i32)).sub_(hist)
    arrivals = s.get("arrivals", (rows, -(-(rollouts + 1) // 256) * 256), f64)
    _exponentials(arrivals.numpy()[:, :rollouts + 1], generators)
    arrivals[:, rollouts + 1:] = 0.0
    row_cumsum(arrivals, workspace=arrivals)
    u = torch.mul(arrivals[:, :rollouts], vocab / arrivals[:, rollouts:rollouts + 1],
                  out=s.get("u", (rows, rollouts), f64))
    # u below the last token's cdf, so no walk passes the row's end (a last spacing under the
    # arrivals' float resolution, or the cdf's rounding, could otherwise put u at its top).
    last = cdf[:, vocab - 1:vocab]
    torch.minimum(u, torch.nextafter(last, torch.zeros_like(last)), out=u)
    draw_slice = s.get("draw_slice", (rows, rollouts), i64)
    draw_slice.copy_(u)
    # Walk forward to the first token with cdf > u, on flat indices (row r's token i is r W + i).
    offsets = torch.arange(0, rows * cdf.shape[1], cdf.shape[1])[:, None]
    flat = torch.empty(rows, rollouts, dtype=i64)
    flat.copy_(torch.gather(guide, 1, draw_slice, out=s.get("start", (rows, rollouts), i32)))
    flat = flat.add_(offsets).view(-1)
    cdf_flat, u_flat = cdf.view(-1), u.view(-1)
    at = s.get("at", (rows * rollouts,), f64)
    behind = s.get("behind", (rows * rollouts,), torch.bool)
    for _ in range(2):  # most draws are 0-2 tokens behind: step all of them, no index lists
        flat += torch.le(torch.take(cdf_flat, flat, out=at), u_flat, out=behind)
    left = torch.le(torch.take(cdf_flat, flat, out=at), u_flat, out=behind).nonzero().squeeze(1)
    for _ in range(64):
        if left.numel() == 0:
            break
        step = flat[left] + 1
        flat[left] = step
        left = left[cdf_flat.take(step) <= u_flat[left]]
    idx = flat.view(rows, rollouts).sub_(offsets)
    if left.numel():  # pathological slices: binary search the rest
        r, c = left // rollouts, left % rollouts
        for row in r.unique().tolist():
            cols = c[r == row]
            idx[row, cols] = torch.searchsorted(cdf[row, :vocab], u[row, cols], right=True)
    return idx.clamp_(max=vocab - 1)


def segment_sums(x: Tensor, segments: Sequence[tuple[int, int]], block: int = 256) -> Tensor:
    """`[S, K]` float64 sums of `x [S, W]` (float32 or float64, W a multiple of `block`) over the
    column ranges `segments` (start, stop).

    Sums `x`'s own dtype within blocks of `block` columns (torch, on its threads), then block
    totals in float64 (as `row_cumsum` does): one pass over `x`, and a float32 row of 128,000
    sums to about 3e-9 relative, where one float32 sum is off by 1e-7 and a float64 sum of float32
    costs 13x more. The few hundred block totals and the partial blocks at a range's ends are
    summed in numpy (a small numpy call costs a fraction of a torch op's dispatch).
    """
    rows, width = x.shape
    totals = x.view(rows, width // block, block).sum(-1).numpy().astype(np.float64)
    xs = x.numpy()
    out = np.empty((rows, len(segments)))
    for k, (start, stop) in enumerate(segments):  # head, whole blocks, tail
        a, b = -(-start // block), stop // block
        if a >= b:  # within one block
            out[:, k] = xs[:, start:stop].sum(-1, dtype=np.float64)
            continue
        out[:, k] = totals[:, a:b].sum(-1)
        out[:, k] += xs[:, start:a * block].sum(-1, dtype=np.float64)
        out[:, k] += xs[:, b * block:stop].sum(-1, dtype=np.float64)
    return torch.from_numpy(out)


MARGIN_SD = 4.0
"""A rejection round proposes enough for the draws still needed plus this many standard
deviations of the accepted count (and 8): a row falls short, and takes a second round for what
it still needs, at most about once in 30,000 rounds."""

MIN_ACCEPTANCE = 0.25
"""A row in which some range accepts less often than this (mean p over max p) draws by inverse
CDF instead: rejection would cost more than 4 proposals a draw."""


class Draws(NamedTuple):
    """Draws of `draw_by_rejection`, each row grouped by range in the ranges' order."""

    cols: Tensor
    """`[S, N]` int64 columns drawn."""
    p: Tensor
    """`[S, N]` float64 p at each draw."""
    counts: np.ndarray
    """`[S, K]` int64: row r's first counts[r, 0] draws are in range 0, the next in range 1..."""


@torch.no_grad()
def draw_by_rejection(p: Tensor, segments: Sequence[tuple[int, int]], rollouts: int,
                      generators: Sequence[np.random.Generator], scratch: Scratch,
                      masses: Tensor | None = None) -> Draws:
    """N i.i.d. draws from each row of `p [S, W]` (float, W a multiple of 256), whose mass lies
    in the column ranges `segments` (start, stop), with p at each draw: exact rejection sampling.

    Each row first splits its N draws over the ranges, multinomially by their masses (`masses`
    `[S, K]` float64, `segment_sums(p, segments)` if not given; need not sum to 1); a range of
    one column takes its draws at once. In a longer range of L columns with largest probability
    m, a uniform u proposes column floor(u L) and, with f = frac(u L) independent of it, accepts
    when f m < p: a column is drawn with probability p_i / m per proposal, so accepted proposals
    are exact draws from p restricted to the range (f has 53 - log2 L bits: at L = 118,000 the
    acceptance probabilities are exact to 2e-11). The first accepted proposals are kept (their
    order is random); the draws come grouped by range, in random order within one.

    A row in which a range's acceptance (its mean p over its largest) is below `MIN_ACCEPTANCE`
    draws by inverse CDF (`draw_tokens`) instead, its draws then grouped by range too. The
    number of variates a row takes depends only on that row, so a row's draws do not depend on
    the others in the batch.
    """
    rows = p.shape[0]
    if masses is None:
        masses = segment_sums(p, segments)
    spans = [(start, stop - start) for start, stop in segments]
    values = p.numpy()  # numpy's max: 1.6x torch's amax on two threads here
    maxes_np = np.stack([values[:, a:a + n].max(-1) for a, n in spans], 1).astype(np.float64)
    masses_np = masses.numpy()
    with np.errstate(invalid="ignore"):  # a range without mass: 0 / 0, and no draws there
        acceptance = masses_np / (np.array([n for _, n in spans]) * maxes_np)
    ok = ((acceptance >= MIN_ACCEPTANCE) | (masses_np <= 0)).all(1)
    draws = Draws(torch.empty(rows, rollouts, dtype=torch.int64),
                  torch.empty(rows, rollouts, dtype=torch.float64),
                  np.zeros((rows, len(spans)), dtype=np.int64))
    cols_np, p_np, counts = draws.cols.numpy(), draws.p.numpy(), draws.counts
    if not ok.all():  # rows whose ranges are too uneven: inverse CDF, then grouped by range
        bad = np.flatnonzero(~ok).tolist()
        found = draw_tokens(p[bad], rollouts, [generators[r] for r in bad]).numpy()
        which = np.select([(found >= a) & (found < a + n) for a, n in spans], list(range(len(spans))))
        order = np.argsort(which, axis=1, kind="stable")
        cols_np[bad] = np.take_along_axis(found, order, 1)
        p_np[bad] = p[bad].gather(1, draws.cols[bad]).numpy()
        counts[bad] = [np.bincount(w, minlength=len(spans)) for w in which]
    shares = masses_np / masses_np.sum(-1, keepdims=True)
    for r in np.flatnonzero(ok).tolist():  # Python numbers in the loops: numpy scalars are slow
        generator, row, filled = generators[r], values[r], 0
        counts[r] = generator.multinomial(rollouts, shares[r])
        for (start, length), n, rate, top in zip(spans, counts[r].tolist(), acceptance[r].tolist(),
                                                  maxes_np[r].tolist()):
            cols, drawn_p = cols_np[r, filled:filled + n], p_np[r, filled:filled + n]
            filled += n
            if length == 1:
                cols[:], drawn_p[:] = start, row[start]
                continue
            block, got = row[start:start + length], 0
            while got < n:
                got += _rejection_round(block, start, cols[got:], drawn_p[got:], rate, top,
                                        generator, scratch)
    return draws


def _rejection_round(block: np.ndarray, start: int, cols: np.ndarray, drawn_p: np.ndarray,
                     acceptance: float, top: float, generator: np.random.Generator,
                     scratch: Scratch) -> int:
    """One round of proposals among the columns of `block` (one row's range, from column
    `start`, largest value `top`): writes the first accepted columns and p at each into `cols`
    and `drawn_p`, as many as they hold or fewer if fewer were accepted; returns how many.

    Row by row in numpy, on scratch buffers: a row's proposals (at most about 60,000 here) and
    its range of p stay in the core's cache. With the rows batched in torch ops the benchmark's
    N = 51,200 took 7.0-7.6 s against 6.0 s (AMD EPYC, same draws). Grouping a row's proposals by
    slices of the range, so that the lookups stay within a few KB, cost more than it saved (15.4
    against 13.6 ms a step at N = 51,200), and needs a random subset of the accepted ones, not
    the first.
    """
    need, length = cols.size, block.size
    k = math.ceil(max(need + MARGIN_SD * math.sqrt(need) + 8, 8) / acceptance)
    x = generator.random(out=scratch.array("reject_u", k, np.float64))
    x *= length  # below length: u <= 1 - 2^-53 and length < 2^53 is no power of two or exact
    whole = np.floor(x, out=scratch.array("reject_floor", k, np.float64))
    x -= whole  # frac(u L), independent of the column
    x *= top
    proposed = scratch.array("reject_cols", k, np.int64)
    np.copyto(proposed, whole, casting="unsafe")
    # in range: "wrap" only skips the bounds checks (and is faster than "clip" here)
    values = block.take(proposed, mode="wrap", out=scratch.array("reject_p", k, block.dtype))
    accept = np.less(x, values, out=scratch.array("reject_ok", k, np.bool_))
    kept = proposed[accept][:need]  # a boolean mask: 3.7x faster here than its indices and take
    np.add(kept, start, out=cols[:kept.size])
    drawn_p[:kept.size] = values[accept][:need]
    return kept.size


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, min(2, os.cpu_count() or 1)), thread_name_prefix="brorl-draw")


def _exponentials(out: np.ndarray, generators: Sequence[np.random.Generator]) -> None:
    """Fill row r of `out` with Exp(1) variates from generator r, rows split over two threads
    (numpy releases the GIL while it fills, so the two halves run at once)."""
    def fill(rows: range) -> None:
        for r in rows:
            generators[r].standard_exponential(out=out[r])
    list(_pool().map(fill, (range(0, len(generators), 2), range(1, len(generators), 2))))
