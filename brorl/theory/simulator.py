"""The paper's token-level RLVR simulator (BroRL §4.1, Fig. 3; spec §3.1), vectorised over seeds.

A single categorical policy over V tokens, |P| of them correct (reward R_c, the rest R_w). Each step
draws N i.i.d. tokens, centres their rewards by the batch mean b = (1/N) sum_j R_j, and takes one
AdamW step on the linear-in-p surrogate L = -(1/N) sum_j (R_j - b) p_{y_j} (spec §3.1; spec §3.3
explains why it must be linear in p, not log p).

The gradient is written in closed form rather than through autograd: with s_i the sum of centred
rewards of the draws of token i,  dL/dz_i = -(p_i / (N tau)) (s_i - M),  M = sum_k s_k p_k:
one dense term M p_i and a scatter over the N draws (no loop over draws, no dense counts).
Seeds run as rows of one tensor; each row has its own generator, so a seed gives the same curve
alone or in a batch. The optimizer is torch's AdamW applied to that gradient. While steps x N is
well below V, tokens never drawn share one bulk column per class (`_Columns`): they evolve
identically, so the run is the dense one exactly, at a cost set by the tokens drawn so far.

Metrics, recorded at step 0, every `log_every` steps and at the end (step t = after t updates):
Q_pos, the percent of correct tokens whose probability rose since step 0, the worst change among
correct tokens min_i (p_i(t) - p_i(0)), and the Theorem-1 terms (spec §2.3, with eta = lr, i.e. the
first-order prediction for a plain gradient step) of the update that produced step t.
Deliberately ignored: anything beyond spec §3.1 (no KL, no clipping, one token position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from brorl.theory.mass_balance import from_moments

if TYPE_CHECKING:
    from brorl.params import SimulateParams

METRICS = ("q_pos", "pct_improved", "worst_drop",
           "term_sampled_correct", "term_sampled_wrong", "term_unsampled")
"""Per-step curves of a `SimulationResult`, in this order."""


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings, no defaults (the schema has them): `brorl.params.SimulateParams`."""

    vocab_size: int
    num_correct: int
    correct_tokens: str
    correct_logit: float
    anchor_logit: float | None
    anchor_is_correct: bool
    freeze_anchor: bool
    temperature: float
    reward_correct: float
    reward_wrong: float
    lr: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    weight_decay: float
    steps: int
    log_every: int

    @classmethod
    def from_params(cls, params: SimulateParams) -> SimConfig:
        """The `simulate` section's fields of the same names (a missing one is a TypeError); its
        sweep keys (N list, seeds, report steps) belong to the flow, not to one run."""
        return cls(**params.model_dump(include=set(cls.__dataclass_fields__)))


@dataclass(frozen=True)
class SimulationResult:
    """Curves for one N over S seeds at L logged steps."""

    rollouts: int
    seeds: tuple[int, ...]
    steps: Tensor
    """`[L]` int64 step numbers."""
    curves: dict[str, Tensor]
    """Metric name (see METRICS) -> `[S, L]` float64."""

    def final(self, metric: str) -> Tensor:
        """`[S]` values of `metric` at the last logged step."""
        return self.curves[metric][:, -1]


@torch.no_grad()
def surrogate_grad(p: Tensor, draws: Tensor, rewards: Tensor, tau: float,
                   out: Tensor | None = None) -> Tensor:
    """dL/dz `[S, V]` of L = -(1/N) sum_j (R_j - b) p_{y_j}, from the draws `[S, N]`.

    `rewards [S, V]` are R_i per token; b is the mean reward of the N draws. With s_i the summed
    centred reward of token i's draws and M = sum_k s_k p_k, dL/dz_i = -(p_i / (N tau))(s_i - M):
    the dense part M p plus a scatter over the draws (also at N = 51,200: 1.1 ms against 1.7 ms
    for per-token counts and dense arithmetic, 8 x 128,000 here). Written into `out` if given.
    """
    scale = 1.0 / (draws.shape[-1] * tau)
    out = torch.empty_like(p) if out is None else out
    r = rewards.gather(1, draws)
    weighted = (r - r.mean(-1, keepdim=True)) * p.gather(1, draws)
    torch.mul(p, weighted.sum(-1, keepdim=True) * scale, out=out)
    return out.scatter_add_(1, draws, weighted.mul_(-scale))


class Scratch:
    """Reusable scratch tensors by name. A fresh multi-megabyte tensor every step costs more here
    than the arithmetic on it (each one is new memory from the OS and page-faults in), so the
    simulator's per-step temporaries at large V live here."""

    def __init__(self) -> None:
        self._tensors: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """The tensor `name` of this shape and dtype (contents undefined), made on first use."""
        t = self._tensors.get(name)
        if t is None or t.shape != shape or t.dtype != dtype:
            t = self._tensors[name] = torch.empty(shape, dtype=dtype)
        return t


def row_cumsum(x: Tensor, block: int = 256, workspace: Tensor | None = None) -> Tensor:
    """Float64 cumulative sums along the last axis of `x [S, V]`, in blocks.

    Same values as `x.double().cumsum(-1)`, about 13x faster here: torch's CPU cumsum over one long
    float64 row is slow, over many short rows fast. Sums within blocks, then block offsets.
    `workspace` (float64 `[S, ceil(V / block) * block]`) avoids a fresh allocation; on return its
    positions past V hold the row's total, so its whole rows are sorted too.
    """
    rows, vocab = x.shape
    padded_len = -(-vocab // block) * block
    if workspace is None:
        workspace = torch.empty(rows, padded_len, dtype=torch.float64)
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
    """`[S, N]` int64 i.i.d. draws from each row of `p [S, V]`: exact inverse-CDF sampling.

    A guide table (Chen & Asau 1974) maps each of V equal slices of [0, 1) to the first token whose
    CDF reaches it, so a uniform u starts its search next to its answer: O(1) expected work per draw
    instead of a binary search per draw (7x faster at N = 51,200 here); below N = V/8 the table
    costs more than it saves and plain binary search is used. Each row draws its uniforms from its
    own numpy generator (PCG64 fills float64 uniforms 2x faster than torch's CPU generator here).
    `p` need not be normalised; `scratch` holds the temporaries between calls.
    """
    rows, vocab = p.shape
    s = scratch if scratch is not None else Scratch()
    f64, i64, i32 = torch.float64, torch.int64, torch.int32
    padded = s.get("cdf", (rows, -(-vocab // 256) * 256), f64)
    cdf = row_cumsum(p, workspace=padded)
    total = cdf[:, -1:].clone()
    if rollouts * 8 < vocab:  # few draws: a binary search each is cheaper than building the table
        u = torch.from_numpy(np.stack([g.random(rollouts) for g in generators]))
        u *= total  # uniforms on [0, total) instead of normalising the cdf
        # The padded rows are sorted and contiguous: searchsorted would copy the cdf view.
        return torch.searchsorted(padded, u, right=True).clamp_(max=vocab - 1)
    # Many draws: the N uniforms come already sorted (order statistics from exponential spacings),
    # so every lookup below walks forward through memory. The draws are i.i.d., so only their
    # multiset matters; they are returned in ascending token order.
    uniforms = s.get("uniforms", (rows, rollouts + 1), f64)
    for row, gen in zip(uniforms.numpy(), generators):
        gen.random(out=row)
    spacings = uniforms.neg_().log1p_().neg_()  # Exp(1) = -log(1 - U), finite since U < 1
    padded_draws = (rows, -(-(rollouts + 1) // 256) * 256)
    arrivals = row_cumsum(spacings, workspace=s.get("arrivals", padded_draws, f64))
    u = torch.mul(arrivals[:, :-1], total / arrivals[:, -1:], out=s.get("u", (rows, rollouts), f64))
    # u < total, so no draw walks past its row's last token (a last spacing below the float
    # resolution of the arrivals would give u = total).
    torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)), out=u)
    # guide[b] = #tokens with cdf < b * total / V: the first index whose cdf reaches slice b
    # (slice V collects the cdf's end, which no draw reaches).
    scale = vocab / total
    slice_of = s.get("slice_of", (rows, vocab), i64)
    slice_of.copy_(torch.mul(cdf, scale, out=s.get("scaled", (rows, vocab), f64)))
    hist = s.get("hist", (rows, vocab + 1), i32).zero_()
    hist.scatter_add_(1, slice_of, torch.ones(1, dtype=i32).expand(rows, vocab))
    guide = torch.cumsum(hist, -1, out=s.get("guide", (rows, vocab + 1), i32)).sub_(hist)
    # Walk forward to the first token with cdf > u, only for the draws still behind, on flat
    # indices (row r's token i is r V + i).
    draw_slice = s.get("draw_slice", (rows, rollouts), i64)
    draw_slice.copy_(torch.mul(u, scale, out=s.get("draw_scaled", (rows, rollouts), f64)))
    draw_slice.clamp_(max=vocab - 1)
    offsets = torch.arange(0, rows * vocab, vocab)[:, None]
    flat = torch.empty(rows, rollouts, dtype=i64)
    flat.copy_(torch.gather(guide, 1, draw_slice, out=s.get("start", (rows, rollouts), i32)))
    flat = flat.add_(offsets).view(-1)
    cdf_flat, u_flat = cdf.contiguous().view(-1), u.view(-1)
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
            idx[row, cols] = torch.searchsorted(cdf[row], u[row, cols], right=True)
    return idx.clamp_(max=vocab - 1)


class _Columns:
    """The policy of S runs as columns of one tensor `[S, C]`, each column one token or a bulk.

    Tokens never drawn evolve identically within their class (same logit, same gradient
    p_i M / (N tau), same AdamW state), so in *lumped* mode all of them stand in one bulk column
    with a multiplicity w (wrong tokens, correct tokens); a drawn bulk token leaves it for a column
    of its own (w = 1), starting from the bulk's logit and optimizer state. The dynamics are the
    dense simulator's exactly; the work per step scales with the distinct tokens drawn so far,
    not with V, which pays while steps x N is well below V. Otherwise every token has a column
    from the start (*dense* mode). Which member of a bulk is drawn is a uniform choice; tokens are
    never named, since every metric depends only on the multiset of (class, p).

    Layout: column 0 is empty (gather padding), 1 and 2 the bulks (wrong, correct), 3 the anchor
    if any, then one column per token (dense: correct ones, then wrong ones). Empty columns have
    logit -inf and w = 0, so they are never drawn and never move.
    """

    EMPTY, BULK, ANCHOR = 0, slice(1, 3), 3

    def __init__(self, config: SimConfig, rows: int, dtype: torch.dtype, lumped: bool) -> None:
        has_anchor = config.anchor_logit is not None
        anchor_correct = has_anchor and config.anchor_is_correct
        wrong = config.vocab_size - config.num_correct - int(has_anchor)
        self.config = config
        self.num_correct = config.num_correct + int(anchor_correct)
        first = self.ANCHOR + int(has_anchor)  # first token column
        width = first if lumped else first + config.num_correct + wrong
        width = -(-width // 256) * 256  # whole cumsum blocks: the cdf is the contiguous workspace
        logits = torch.full((rows, width), -torch.inf, dtype=dtype)
        self.weights = torch.zeros(rows, width, dtype=dtype)
        self.correct = torch.zeros(rows, width, dtype=torch.bool)
        if lumped:
            self.weights[:, 1], self.weights[:, 2] = wrong, config.num_correct
            logits[:, 1] = 0.0 if wrong else -torch.inf
            logits[:, 2] = config.correct_logit if config.num_correct else -torch.inf
            self.correct[:, 2] = True
            self.used = torch.full((rows,), first, dtype=torch.int64)
        else:
            stop = first + config.num_correct
            self.weights[:, first:stop + wrong] = 1.0
            logits[:, first:stop], logits[:, stop:stop + wrong] = config.correct_logit, 0.0
            self.correct[:, first:stop] = True
            self.used = torch.full((rows,), stop + wrong, dtype=torch.int64)
        if has_anchor:
            self.weights[:, self.ANCHOR], logits[:, self.ANCHOR] = 1.0, config.anchor_logit
            self.correct[:, self.ANCHOR] = anchor_correct
        # Correct columns of each row (padded with the empty column), for the correct-token metrics.
        self.pos_cols = torch.full((rows, self.num_correct + 1), self.EMPTY, dtype=torch.int64)
        self.pos_used = torch.zeros(rows, dtype=torch.int64)
        self._add_correct(*self.correct.nonzero(as_tuple=True))
        self.param = torch.nn.Parameter(logits)
        self.opt = self._adamw()
        self.rewards = self._rewards()
        self.p0 = self.policy()[0]  # p of each column at step 0 (a token keeps its own)
        self.scratch = Scratch()

    @property
    def width(self) -> int:
        return self.param.shape[1]

    def bulk_left(self) -> bool:
        return bool((self.weights[:, self.BULK] > 0).any())

    def policy(self) -> tuple[Tensor, Tensor]:
        """`[S, C]` per-token probabilities p (a bulk column: one member's) and column masses
        (w p: a bulk column's is its members' total); empty columns 0. Without bulk: one tensor.
        """
        tau = self.config.temperature
        z = self.param if tau == 1.0 else self.param / tau
        if not self.bulk_left():  # every column is one token (or empty at -inf)
            p = torch.softmax(z, dim=-1)
            return p, p
        z = z.clone()
        bulk = self.weights[:, self.BULK]
        z[:, self.BULK] += bulk.log()
        mass = torch.softmax(z, dim=-1)
        p = mass.clone()
        p[:, self.BULK] = torch.where(bulk > 0, mass[:, self.BULK] / bulk, 0.0)
        return p, mass

    def reserve(self, extra: int) -> None:
        """Room for `extra` more token columns in every row (doubling, in whole 256-blocks)."""
        need = int(self.used.max()) + extra
        if need <= self.width:
            return
        width = -(-min(max(need, 2 * self.width), 4 + self.config.vocab_size) // 256) * 256
        grow, rows = width - self.width, self.param.shape[0]
        state = self.opt.state[self.param]
        pad = lambda t, fill: torch.cat([t, t.new_full((rows, grow), fill)], dim=1)  # noqa: E731
        self.param = torch.nn.Parameter(pad(self.param.detach(), -torch.inf))
        self.weights, self.correct, self.p0 = (pad(self.weights, 0.0), pad(self.correct, False),
                                               pad(self.p0, 0.0))
        self.opt = self._adamw()
        if state:
            self.opt.state[self.param] = {"step": state["step"],
                                          "exp_avg": pad(state["exp_avg"], 0.0),
                                          "exp_avg_sq": pad(state["exp_avg_sq"], 0.0)}
        self.rewards = self._rewards()

    def split(self, draws: Tensor, p: Tensor, generators: Sequence[np.random.Generator]) -> Tensor:
        """Give each distinct bulk token drawn a column of its own; returns the draws as columns.

        A draw in bulk b is its member floor(u w_b) (u uniform from the row's generator, in draw
        order); draws of the same (row, b, member) are one token. A new column takes the bulk's
        logit, AdamW moments, step-0 probability and this step's `p` (written into `p`).
        """
        rows, cols = ((draws >= self.BULK.start) & (draws < self.BULK.stop)).nonzero(as_tuple=True)
        if rows.numel() == 0:
            return draws
        bulk = draws[rows, cols]
        per_row = torch.bincount(rows, minlength=len(generators)).tolist()
        u = torch.from_numpy(np.concatenate([g.random(k) for g, k in zip(generators, per_row)]))
        size = self.weights[rows, bulk].double()
        member = (u * size).long().minimum(size.long() - 1)
        span = self.config.vocab_size
        keys, inverse = torch.unique((rows * 4 + bulk) * span + member, return_inverse=True)
        new_rows, new_bulk = keys // (4 * span), (keys // span) % 4
        added = torch.bincount(new_rows, minlength=len(generators))
        first = (added.cumsum(0) - added)[new_rows]  # index of each row's first new token
        new_cols = self.used[new_rows] + torch.arange(len(keys)) - first
        state = self.opt.state[self.param]
        for t in [self.param.data, self.correct, self.p0, p, self.rewards,
                  *(state[k] for k in ("exp_avg", "exp_avg_sq") if k in state)]:
            t[new_rows, new_cols] = t[new_rows, new_bulk]
        self.weights[new_rows, new_cols] = 1.0
        self.weights.index_put_((new_rows, new_bulk), torch.full_like(new_rows, -1, dtype=p.dtype),
                                accumulate=True)
        self.param.data[:, self.BULK].masked_fill_(self.weights[:, self.BULK] == 0, -torch.inf)
        self.used += added
        correct = self.correct[new_rows, new_cols]
        self._add_correct(new_rows[correct], new_cols[correct])
        draws = draws.clone()
        draws[rows, cols] = new_cols[inverse]
        return draws

    def _add_correct(self, rows: Tensor, cols: Tensor) -> None:
        """Append correct columns `cols` to their rows' `pos_cols` (rows ascending)."""
        added = torch.bincount(rows, minlength=self.pos_cols.shape[0])
        slot = self.pos_used[rows] + torch.arange(len(rows)) - (added.cumsum(0) - added)[rows]
        self.pos_cols[rows, slot] = cols
        self.pos_used += added

    def _adamw(self) -> torch.optim.AdamW:
        cfg = self.config
        return torch.optim.AdamW([self.param], lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                 eps=cfg.adam_eps, weight_decay=cfg.weight_decay, fused=True)

    def _rewards(self) -> Tensor:
        cfg = self.config
        return torch.where(self.correct, cfg.reward_correct, cfg.reward_wrong).to(self.param.dtype)


class _Recorder:
    """Accumulates the logged metrics of S runs from the columns' policy.

    Correct-token metrics gather the correct columns, each weighed by its multiplicity;
    Theorem-1 moments gather the drawn columns (deduplicated: A and B are sets; a drawn column is
    one token) and take class totals from the correct columns plus one sum of w p^2.
    Gathered values are summed in float64.
    """

    def __init__(self, runs: int, config: SimConfig) -> None:
        self.config, self.runs = config, runs
        self.rows: dict[str, list[Tensor]] = {m: [] for m in METRICS}
        self.steps: list[int] = []

    def policy(self, step: int, p: Tensor, cols: _Columns) -> None:
        idx = cols.pos_cols
        p_pos, w_pos = p.gather(1, idx).double(), cols.weights.gather(1, idx).double()
        p0 = cols.p0.gather(1, idx).double()
        self.steps.append(step)
        self.rows["q_pos"].append((p_pos * w_pos).sum(-1))
        self.rows["pct_improved"].append(100.0 * (w_pos * (p_pos > p0)).sum(-1) / cols.num_correct)
        drop = torch.where(w_pos > 0, p_pos - p0, torch.inf)
        self.rows["worst_drop"].append(drop.min(-1).values)

    def theorem(self, p: Tensor | None, draws: Tensor | None, cols: _Columns | None = None) -> None:
        """Theorem-1 terms of the update taking policy `p` with `draws` `[S, N]` (columns)."""
        if p is None or draws is None or cols is None:
            nan = torch.full((self.runs,), torch.nan, dtype=torch.float64)
            for name in METRICS[3:]:
                self.rows[name].append(nan)
            return
        if not bool((draws[:, 1:] >= draws[:, :-1]).all()):
            draws, _ = draws.sort(-1)
        first = torch.ones_like(draws, dtype=torch.bool)
        first[:, 1:] = draws[:, 1:] != draws[:, :-1]
        p_d = p.gather(1, draws).double() * first
        pos_d = cols.correct.gather(1, draws).double()
        p_pos, a2 = (p_d * pos_d).sum(-1), (p_d * p_d * pos_d).sum(-1)
        p_neg, b2 = p_d.sum(-1) - p_pos, (p_d * p_d).sum(-1) - a2
        idx = cols.pos_cols
        p_all, w_all = p.gather(1, idx).double(), cols.weights.gather(1, idx).double()
        q_pos, sq_pos = (p_all * w_all).sum(-1), (p_all * p_all * w_all).sum(-1)
        bulk_p, bulk_w = p[:, cols.BULK].double(), cols.weights[:, cols.BULK].double()
        sq_all = (p * p).sum(-1, dtype=torch.float64) + (bulk_p * bulk_p * (bulk_w - 1)).sum(-1)
        cfg = self.config
        mb = from_moments(q_pos, p_pos, p_neg, a2, b2, (sq_pos - a2).clamp_min(0.0),
                          (sq_all - sq_pos - b2).clamp_min(0.0), cfg.reward_correct,
                          cfg.reward_wrong, cfg.lr, draws.shape[-1])
        for name in METRICS[3:]:
            self.rows[name].append(getattr(mb, name))

    def result(self, rollouts: int, seeds: Sequence[int]) -> SimulationResult:
        curves = {m: torch.stack(v, dim=-1) for m, v in self.rows.items()}
        return SimulationResult(rollouts, tuple(seeds), torch.tensor(self.steps), curves)


def _is_logged(step: int, config: SimConfig) -> bool:
    return step % config.log_every == 0 or step == config.steps


def simulate(config: SimConfig, rollouts: int, seeds: Sequence[int],
             dtype: torch.dtype = torch.float32, lumped: bool | None = None) -> SimulationResult:
    """Run the simulator for one N over several seeds at once (rows of one tensor).

    `dtype` is the optimizer's working precision; metrics are always taken in float64. `lumped`
    (default: when steps x N <= V / 2) keeps never-drawn tokens in bulk columns (`_Columns`).
    """
    seeds = list(seeds)
    if lumped is None:
        lumped = config.steps * rollouts <= config.vocab_size // 2
    gens = [np.random.default_rng(s) for s in seeds]
    cols = _Columns(config, len(seeds), dtype, lumped)
    tau = config.temperature
    frozen = config.freeze_anchor and config.anchor_logit is not None
    anchor = _Columns.ANCHOR if frozen else None
    rec = _Recorder(len(seeds), config)
    rec.theorem(None, None)
    with torch.no_grad():
        for step in range(config.steps + 1):
            lumps = lumped and cols.bulk_left()
            if lumps:
                cols.reserve(min(rollouts, int(cols.weights[:, cols.BULK].sum(-1).max())))
            p, mass = cols.policy()
            if _is_logged(step, config):
                rec.policy(step, p, cols)
            if step == config.steps:
                break
            draws = draw_tokens(mass, rollouts, gens, cols.scratch)
            if lumps:
                draws = cols.split(draws, p, gens)
            cols.param.grad = surrogate_grad(p, draws, cols.rewards, tau, out=cols.param.grad)
            if anchor is not None:
                cols.param.grad[:, anchor] = 0.0
            if _is_logged(step + 1, config):
                rec.theorem(p, draws, cols)  # the moments of the update about to happen
            cols.opt.step()
            if anchor is not None:
                cols.param[:, anchor] = config.anchor_logit
    return rec.result(rollouts, seeds)


def summarize(result: SimulationResult, metric: str) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation over seeds, each `[L]` (std is 0 for a single seed)."""
    values = result.curves[metric]
    std = values.std(0) if values.shape[0] > 1 else torch.zeros(values.shape[1], dtype=values.dtype)
    return values.mean(0), std
