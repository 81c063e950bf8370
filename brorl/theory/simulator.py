"""The paper's token-level RLVR simulator (BroRL §4.1, Fig. 3), vectorised over seeds.

A single categorical policy over V tokens, |P| of them correct (reward R_c, the rest R_w). Each step
draws N i.i.d. tokens, centres their rewards by the batch mean b = (1/N) sum_j R_j, and takes one
AdamW step on the linear-in-p surrogate L = -(1/N) sum_j (R_j - b) p_{y_j} (BroRL §4.1; it must be
linear in p, as written there, not log p: with log p, unsampled logits get no gradient).

The gradient is written in closed form rather than through autograd: with s_i the sum of centred
rewards of the draws of token i, dL/dz_i = -(p_i / (N tau)) (s_i - M), M = sum_k s_k p_k: one
dense term M p_i and a scatter over the N draws (no loop over draws, no dense counts). The draws
are exact (`brorl.theory.sampling`): a dense run draws by rejection within each class of tokens
(the correct ones, the wrong ones, the anchor; within a class the probabilities stay close), a
lumped one by inverse CDF. Seeds run as rows of one tensor, each with its own generator, so a
seed gives the same curve alone or in a batch. The optimizer is torch's AdamW applied to that
gradient, on float64 logits; the policy's exponentials are float32 over a float64 total
(`simulate`). While steps x N is well below V, tokens never drawn share one bulk column per class
(`_Columns`): they evolve identically, so the run is the dense one exactly, at a cost set by the
tokens drawn so far.

Metrics, recorded at step 0, every `log_every` steps and at the end (step t = after t updates):
Q_pos, the percent of correct tokens whose probability rose since step 0, the worst change among
correct tokens min_i (p_i(t) - p_i(0)), and the Theorem-1 terms (BroRL App. C.1, with eta = lr, i.e.
the first-order prediction for a plain gradient step) of the update that produced step t.
Deliberately ignored: anything beyond BroRL §4.1 (no KL, no clipping, one token position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor
from torch.optim.adamw import adamw

from brorl.theory.mass_balance import from_moments
from brorl.theory.sampling import (
    Scratch,
    draw_by_rejection,
    draw_from_cdf,
    row_cumsum,
    segment_sums,
)

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

    @classmethod
    def concat(cls, parts: Sequence[SimulationResult]) -> SimulationResult:
        """One result with the seeds of `parts` (runs of one N), in the order given."""
        rollouts = {r.rollouts for r in parts}
        if len(rollouts) != 1:
            raise ValueError(f"results of one N can be joined, got N in {sorted(rollouts)}")
        curves = {m: torch.cat([r.curves[m] for r in parts]) for m in METRICS}
        seeds = tuple(s for r in parts for s in r.seeds)
        return cls(rollouts.pop(), seeds, parts[0].steps, curves)


@torch.no_grad()
def surrogate_grad(p: Tensor, draws: Tensor, rewards: Tensor, tau: float,
                   out: Tensor | None = None) -> Tensor:
    """dL/dz `[S, V]` of L = -(1/N) sum_j (R_j - b) p_{y_j}, from the draws `[S, N]`.

    `rewards [S, V]` are R_i per token; b is the mean reward of the N draws. Gathers each draw's
    weight (R_j - b) p_{y_j}, then `grad_from_weights`. Written into `out` if given (it has the
    rewards' dtype; a new tensor of that dtype otherwise)."""
    r = rewards.gather(1, draws)
    weighted = (r - r.mean(-1, keepdim=True)).mul_(p.gather(1, draws).to(r.dtype))
    return grad_from_weights(p, draws, weighted, tau, out)


@torch.no_grad()
def grad_from_weights(p: Tensor, draws: Tensor, weighted: Tensor, tau: float,
                      out: Tensor | None = None) -> Tensor:
    """dL/dz `[S, V]` from the draws `[S, N]` and their weights (R_j - b) p_{y_j} (`weighted`,
    overwritten).

    With s_i the summed centred reward of token i's draws and M = sum_k s_k p_k,
    dL/dz_i = -(p_i / (N tau))(s_i - M): the dense part M p plus a scatter over the draws (faster than per-token counts and dense
    arithmetic also at N = 51,200: `benchmarks/simulate_speed.py`). Written into `out` if given (the weights' dtype; a new tensor
    otherwise).
    """
    scale = 1.0 / (draws.shape[-1] * tau)
    if out is None:
        out = torch.empty_like(p, dtype=weighted.dtype)
    dense = weighted.sum(-1, keepdim=True) * scale
    if p.dtype == out.dtype:
        torch.mul(p, dense, out=out)
    else:  # a float32 p: convert, then multiply (one mixed-dtype multiply is 5x slower here)
        out.copy_(p).mul_(dense)
    return out.scatter_add_(1, draws, weighted.mul_(-scale))


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
    logit -inf and w = 0, so they are never drawn and never move. Everything a column carries
    lives in one float64 table `[fields, S, C]` (one indexing op moves a column's whole state);
    `logits`, `exp_avg`, `exp_avg_sq`, `p0`, `rewards` and `weights` are its rows."""

    EMPTY, BULK, ANCHOR = 0, slice(1, 3), 3
    FIELDS = ("logits", "exp_avg", "exp_avg_sq", "p0", "rewards", "weights")
    FILL = (-torch.inf, 0.0, 0.0, 0.0, 0.0, 0.0)

    def __init__(self, config: SimConfig, rows: int, lumped: bool,
                 policy_dtype: torch.dtype = torch.float32, rejection: bool = False) -> None:
        has_anchor = config.anchor_logit is not None
        anchor_correct = has_anchor and config.anchor_is_correct
        wrong = config.vocab_size - config.num_correct - int(has_anchor)
        self.config, self.policy_dtype = config, policy_dtype
        self.segments: list[tuple[int, int]] | None = None  # set: dense, drawn by rejection
        self.num_correct = config.num_correct + int(anchor_correct)
        first = self.ANCHOR + int(has_anchor)  # first token column
        self.max_width = _blocks(first + config.num_correct + wrong)
        self._alloc(rows, self.max_width if not lumped else _blocks(first))
        logits, weights, correct = self.logits, self.weights, self.correct
        if lumped:
            weights[:, 1], weights[:, 2] = wrong, config.num_correct
            logits[:, 1] = 0.0 if wrong else -torch.inf
            logits[:, 2] = config.correct_logit if config.num_correct else -torch.inf
            correct[:, 2] = True
            self.used = torch.full((rows,), first, dtype=torch.int64)
        else:
            stop = first + config.num_correct
            weights[:, first:stop + wrong] = 1.0
            logits[:, first:stop], logits[:, stop:stop + wrong] = config.correct_logit, 0.0
            correct[:, first:stop] = True
            self.used = torch.full((rows,), stop + wrong, dtype=torch.int64)
            if rejection:  # the classes, each a column range: correct, wrong, anchor
                ranges = [(first, stop), (stop, stop + wrong), (self.ANCHOR, first)]
                self.segments = [(a, b) for a, b in ranges if b > a]
        if has_anchor:
            weights[:, self.ANCHOR], logits[:, self.ANCHOR] = 1.0, config.anchor_logit
            correct[:, self.ANCHOR] = anchor_correct
        self.rewards.copy_(torch.where(correct, config.reward_correct, config.reward_wrong))
        if self.segments is not None:  # each class's reward `[S, K]` (numpy)
            self.segment_rewards = self.rewards[:, [a for a, _ in self.segments]].numpy().copy()
        # Correct columns of each row (padded with the empty column), for the correct-token metrics.
        self.pos_cols = torch.full((rows, self.num_correct + 1), self.EMPTY, dtype=torch.int64)
        self.pos_used = torch.zeros(rows, dtype=torch.int64)
        self._add_correct(*np.nonzero(correct.numpy()))
        self.updates = torch.zeros((), dtype=torch.float32)  # AdamW's step count
        self.bulk_left = lumped  # some bulk still has members (kept up to date by `split`)
        self.p0.copy_(self.policy()[0])  # p of each column at step 0 (a token keeps its own)

    def _alloc(self, rows: int, width: int) -> None:
        """Fresh state for `width` columns (every field at its fill), and views on it."""
        self.table = torch.empty(len(self.FIELDS), rows, width, dtype=torch.float64)
        for field, fill in zip(self.table, self.FILL):
            field.fill_(fill)
        self.correct = torch.zeros(rows, width, dtype=torch.bool)
        self.grad = torch.zeros(rows, width, dtype=torch.float64)
        self.logits, self.exp_avg, self.exp_avg_sq, self.p0, self.rewards, self.weights = self.table
        self.scratch = Scratch()

    @property
    def width(self) -> int:
        return self.table.shape[2]

    def policy(self) -> tuple[Tensor, Tensor]:
        """`[S, C]` per-token probabilities p (a bulk column: one member's) and what `draw` draws
        from: the float64 running sums of the unnormalised column masses (w p: a bulk column's is
        its members' total), for `draw_from_cdf`; or, with `segments`, the segments' float64
        shares of p `[S, K]`, for `draw_by_rejection`. Empty columns are 0.

        The exponentials are taken in `policy_dtype` and divided by their float64 total:
        torch.softmax in float32 sums its 128,000 terms in float32, and its probabilities total
        1 - 2.7e-5 here, an error every correct token shares (it moved the final Q_pos at N = 512
        by about five seed standard deviations). Both live in scratch until the next call."""
        tau = self.config.temperature
        z = self.logits if tau == 1.0 else self.logits / tau
        shape, dtype = tuple(z.shape), self.policy_dtype
        p = self.scratch.get("p", shape, dtype)
        # exp(x) = 2^(x log2 e): torch's exp2 takes half the time of its exp here (AMD EPYC,
        # float32, 8 x 128,256: 0.38 against 0.69 ms); the extra rounding of x log2 e adds a
        # relative error near 3e-7 per probability, the size of the float32 exponentials' own.
        p.copy_(z).mul_(_LOG2E)
        p.sub_(p.amax(-1, keepdim=True)).exp2_()
        if self.segments is not None:  # the [S, K] arithmetic in numpy (cheaper calls)
            masses = segment_sums(p, self.segments).numpy()
            total = masses.sum(-1, keepdims=True)
            p.mul_(torch.from_numpy(np.reciprocal(total)).to(dtype))
            return p, torch.from_numpy(np.divide(masses, total, out=masses))
        mass = p
        if self.bulk_left:  # a bulk's exponential is one member's: its mass is w times that
            mass = torch.mul(p, self.weights, out=self.scratch.get("mass", shape, dtype))
        cdf = row_cumsum(mass, workspace=self.scratch.get("cdf", shape, torch.float64))
        return p.mul_(cdf[:, -1:].reciprocal().to(dtype)), cdf

    def draw(self, p: Tensor, source: Tensor, rollouts: int,
             generators: Sequence[np.random.Generator]) -> tuple[Tensor, Tensor, Tensor]:
        """`[S, N]` draws as columns, float64 p at each, and each one's weight (R_j - b) p_j for
        `grad_from_weights`, from what `policy` returned (`source`): by rejection within the
        segments (the classes: a draw's reward is its segment's), or from the running sums (a
        drawn bulk token then gets its column: `split`)."""
        if self.segments is not None:
            draws = draw_by_rejection(p, self.segments, rollouts, generators, self.scratch,
                                      source)
            rewards = self.segment_rewards
            centred = rewards - (draws.counts * rewards).sum(-1, keepdims=True) / rollouts
            ends = draws.counts.cumsum(-1)
            weighted = self.scratch.get("weighted", tuple(draws.cols.shape), torch.float64)
            for w, drawn_p, factors, stops in zip(weighted.numpy(), draws.p.numpy(),
                                                  centred.tolist(), ends.tolist()):
                for a, b, factor in zip([0, *stops], stops, factors):
                    np.multiply(drawn_p[a:b], factor, out=w[a:b])
            return draws.cols, draws.p, weighted
        draws = draw_from_cdf(source, self.width, rollouts, generators, self.scratch)
        draws = self.split(draws, p, generators) if self.bulk_left else draws
        r, drawn_p = self.rewards.gather(1, draws), p.gather(1, draws).double()
        return draws, drawn_p, (r - r.mean(-1, keepdim=True)).mul_(drawn_p)

    def reserve(self, extra: int) -> None:
        """Room for `extra` more token columns in every row (doubling, in whole 256-blocks)."""
        need = int(self.used.max()) + extra
        if need <= self.width or self.width == self.max_width:
            return
        old, old_correct = self.table, self.correct
        self._alloc(old.shape[1], min(_blocks(max(need, 2 * self.width)), self.max_width))
        self.table[:, :, :old.shape[2]] = old  # grad is not state: every step overwrites it
        self.correct[:, :old.shape[2]] = old_correct

    def split(self, draws: Tensor, p: Tensor, generators: Sequence[np.random.Generator]) -> Tensor:
        """Give each distinct bulk token drawn a column of its own; returns the draws as columns.

        A draw in bulk b is its member floor(u w_b) (u uniform from the row's generator, in draw
        order); draws of the same (row, b, member) are one token. A new column takes the bulk's
        logit, AdamW moments, step-0 probability and this step's `p` (written into `p`).
        The bookkeeping is a few dozen operations on tiny index arrays every step, so it runs in
        numpy on views of the tensors (a numpy call costs a fraction of a torch op's dispatch).
        """
        d = draws.numpy()
        rows, cols = np.nonzero((d >= self.BULK.start) & (d < self.BULK.stop))
        if rows.size == 0:
            return draws
        bulk = d[rows, cols]
        weights, used = self.weights.numpy(), self.used.numpy()
        per_row = np.bincount(rows, minlength=len(generators)).tolist()
        u = np.concatenate([g.random(k) for g, k in zip(generators, per_row)])
        size = weights[rows, bulk]
        member = np.minimum((u * size).astype(np.int64), size.astype(np.int64) - 1)
        span = self.config.vocab_size
        keys, inverse = np.unique((rows * 4 + bulk) * span + member, return_inverse=True)
        new_rows, new_bulk = keys // (4 * span), (keys // span) % 4
        added = np.bincount(new_rows, minlength=len(generators))
        first = (np.cumsum(added) - added)[new_rows]  # index of each row's first new token
        new_cols = used[new_rows] + np.arange(len(keys)) - first
        for t in (self.table.numpy(), self.correct.numpy()[None], p.numpy()[None]):
            t[:, new_rows, new_cols] = t[:, new_rows, new_bulk]
        weights[new_rows, new_cols] = 1.0
        np.subtract.at(weights, (new_rows, new_bulk), 1.0)
        empty = weights[:, self.BULK] == 0
        self.logits.numpy()[:, self.BULK][empty] = -np.inf
        self.bulk_left = not empty.all()
        used += added
        correct = self.correct.numpy()[new_rows, new_cols]
        self._add_correct(new_rows[correct], new_cols[correct])
        out = d.copy()
        out[rows, cols] = new_cols[inverse]
        return torch.from_numpy(out)

    def _add_correct(self, rows: np.ndarray, cols: np.ndarray) -> None:
        """Append correct columns `cols` to their rows' `pos_cols` (rows ascending)."""
        pos_used = self.pos_used.numpy()
        added = np.bincount(rows, minlength=len(pos_used))
        slot = pos_used[rows] + np.arange(len(rows)) - (np.cumsum(added) - added)[rows]
        self.pos_cols.numpy()[rows, slot] = cols
        pos_used += added

    def update(self) -> None:
        """One step of torch's fused AdamW on the logits from `grad` (the optimizer's functional
        form: the same kernel as `torch.optim.AdamW(fused=True).step()`, without its per-call
        bookkeeping, and with state that `reserve` and `split` can copy and grow)."""
        cfg = self.config
        adamw([self.logits], [self.grad], [self.exp_avg], [self.exp_avg_sq], [], [self.updates],
              fused=True, amsgrad=False, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, lr=cfg.lr,
              weight_decay=cfg.weight_decay, eps=cfg.adam_eps, maximize=False)


_LOG2E = 1.4426950408889634


def _blocks(width: int) -> int:
    """`width` rounded up to whole 256-column cumsum blocks (the cdf is then its own workspace)."""
    return -(-width // 256) * 256


class _Recorder:
    """Accumulates the logged metrics of S runs from the columns' policy.

    Correct-token metrics gather the correct columns, each weighed by its multiplicity;
    Theorem-1 moments gather the drawn columns (deduplicated: A and B are sets; a drawn column is
    one token) and take class totals from the correct columns plus one sum of w p^2.
    Gathered values are summed in float64."""

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

    def theorem(self, p: Tensor | None, draws: Tensor | None, cols: _Columns | None = None,
                drawn_p: Tensor | None = None) -> None:
        """Theorem-1 terms of the update taking policy `p` with `draws` `[S, N]` (columns; p at
        each is `drawn_p`, gathered if not given)."""
        if p is None or draws is None or cols is None:
            nan = torch.full((self.runs,), torch.nan, dtype=torch.float64)
            for name in METRICS[3:]:
                self.rows[name].append(nan)
            return
        # One draw per distinct column: each column records one of its draws' positions.
        position = torch.arange(draws.shape[1], dtype=torch.int32).expand_as(draws)
        owner = cols.scratch.get("owner", tuple(p.shape), torch.int32).scatter_(1, draws, position)
        first = owner.gather(1, draws) == position
        drawn_p = p.gather(1, draws) if drawn_p is None else drawn_p
        p_d = torch.where(first, drawn_p, 0.0).double()
        pos_d = torch.where(cols.correct.gather(1, draws), p_d, 0.0)
        p_pos, a2 = pos_d.sum(-1), torch.linalg.vecdot(pos_d, p_d)
        p_neg, b2 = p_d.sum(-1) - p_pos, torch.linalg.vecdot(p_d, p_d) - a2
        idx = cols.pos_cols
        p_all, w_all = p.gather(1, idx).double(), cols.weights.gather(1, idx).double()
        q_pos, sq_pos = (p_all * w_all).sum(-1), (p_all * p_all * w_all).sum(-1)
        bulk_p, bulk_w = p[:, cols.BULK].double(), cols.weights[:, cols.BULK].double()
        squares = segment_sums(torch.square(p), [(0, p.shape[1])])[:, 0]
        sq_all = squares + (bulk_p * bulk_p * (bulk_w - 1)).sum(-1)
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


STATE_BUDGET = 24 * 2**20
"""Bytes of per-step state one batch of seeds may hold: three quarters of the 32 MiB L3 cache
of the machines measured. At the paper's V a dense run's state is about 4.6 MB a seed at N = 512,
so 8 seeds in one batch stream it from memory every step (about 28 GB/s here, against about
100 GB/s from the L3); a batch costs about 0.2 ms a step in calls. Measured: docs/theory.md §6."""


def simulate(config: SimConfig, rollouts: int, seeds: Sequence[int],
             policy_dtype: torch.dtype = torch.float32, lumped: bool | None = None,
             rejection: bool = True, budget: int = STATE_BUDGET) -> SimulationResult:
    """Run the simulator for one N over several seeds, in batches of seeds (`seed_batches`), each
    batch's seeds at once as rows of one tensor.

    The logits and AdamW's state are float64: in float32 the update's rounding at logits near 3 is
    the same for every correct token, and at the paper's settings with N = 512 it moved the final
    Q_pos by 1e-5 (0.7 seed standard deviations) from a float64 run. `policy_dtype` is the
    precision of the exponentials and probabilities drawn from; they are divided by a float64
    total (see `_Columns.policy`), so float32 costs a relative error near 1e-7 per token, not
    one shared by a class. CDFs and metrics are always float64. `lumped` (default: when
    steps x N <= V / 2) keeps never-drawn tokens in bulk columns (`_Columns`). A dense run
    draws by rejection within each class of tokens (`draw_by_rejection`: no running sums over
    V), unless `rejection` is False; a lumped run by inverse CDF. Each seed has its own
    generator, so its curves do not depend on the batches."""
    if lumped is None:
        lumped = config.steps * rollouts <= config.vocab_size // 2
    batches = seed_batches(config, rollouts, seeds, lumped, policy_dtype, budget)
    return SimulationResult.concat([_simulate_batch(config, rollouts, batch, policy_dtype, lumped,
                                                    rejection) for batch in batches])


def seed_batches(config: SimConfig, rollouts: int, seeds: Sequence[int], lumped: bool,
                 policy_dtype: torch.dtype = torch.float32,
                 budget: int = STATE_BUDGET) -> list[list[int]]:
    """`seeds` in the fewest consecutive batches, as even as possible, whose per-step state
    (`_row_bytes` a seed) fits in `budget` bytes each (one seed a batch at the least)."""
    seeds = list(seeds)
    per_seed = _row_bytes(config, rollouts, lumped, policy_dtype)
    count = max(1, min(len(seeds), -(-len(seeds) * per_seed // budget)))
    return [part.tolist() for part in np.array_split(np.array(seeds, dtype=np.int64), count)]


def _row_bytes(config: SimConfig, rollouts: int, lumped: bool, policy_dtype: torch.dtype) -> int:
    """Bytes of one seed's per-step state: per column float64 logits, AdamW moments and gradient
    and p; per draw its column, p and weight. A lumped run has at most a column per draw."""
    columns = config.vocab_size + _Columns.ANCHOR + 1
    if lumped:
        columns = min(columns, _Columns.ANCHOR + 1 + config.steps * rollouts)
    itemsize = torch.empty((), dtype=policy_dtype).element_size()
    return _blocks(columns) * (4 * 8 + itemsize) + rollouts * 3 * 8


def _simulate_batch(config: SimConfig, rollouts: int, seeds: Sequence[int],
                    policy_dtype: torch.dtype, lumped: bool, rejection: bool) -> SimulationResult:
    """`simulate` for one batch of seeds, all at once."""
    gens = [np.random.default_rng(s) for s in seeds]
    cols = _Columns(config, len(seeds), lumped, policy_dtype, rejection and not lumped)
    tau = config.temperature
    frozen = config.freeze_anchor and config.anchor_logit is not None
    anchor = _Columns.ANCHOR if frozen else None
    rec = _Recorder(len(seeds), config)
    rec.theorem(None, None)
    with torch.no_grad():
        for step in range(config.steps + 1):
            if cols.bulk_left:
                cols.reserve(rollouts)
            p, source = cols.policy()
            if _is_logged(step, config):
                rec.policy(step, p, cols)
            if step == config.steps:
                break
            draws, drawn_p, weighted = cols.draw(p, source, rollouts, gens)
            grad_from_weights(p, draws, weighted, tau, out=cols.grad)
            if anchor is not None:
                cols.grad[:, anchor] = 0.0
            if _is_logged(step + 1, config):
                rec.theorem(p, draws, cols, drawn_p)  # the moments of the update about to happen
            cols.update()
            if anchor is not None:
                cols.logits[:, anchor] = config.anchor_logit
    return rec.result(rollouts, seeds)


def summarize(result: SimulationResult, metric: str) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation over seeds, each `[L]` (std is 0 for a single seed)."""
    values = result.curves[metric]
    std = values.std(0) if values.shape[0] > 1 else torch.zeros(values.shape[1], dtype=values.dtype)
    return values.mean(0), std
