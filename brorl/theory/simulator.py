"""The paper's token-level RLVR simulator (BroRL §4.1, Fig. 3; spec §3.1), vectorised over seeds.

A single categorical policy over V tokens, |P| of them correct (reward R_c, the rest R_w). Each step
draws N i.i.d. tokens, centres their rewards by the batch mean b = (1/N) sum_j R_j, and takes one
AdamW step on the linear-in-p surrogate L = -(1/N) sum_j (R_j - b) p_{y_j} (spec §3.1; spec §3.3
explains why it must be linear in p, not log p).

The gradient is written in closed form rather than through autograd: with s_i the sum of centred
rewards of the draws of token i,  dL/dz_i = -(p_i / (N tau)) (s_i - M),  M = sum_k s_k p_k:
one dense term M p_i and a scatter over the N draws (no loop over draws, no dense counts).
Seeds run as rows of one tensor; each row has its own generator, so a seed gives the same curve
alone or in a batch. The optimizer is torch's AdamW applied to that gradient.

Tokens that were never drawn share their whole history within their class (correct or not), so
the V tokens are held as slots (`_Population`): one slot per class of undrawn tokens, with its
multiplicity, and one per token drawn so far. The process is the V-token one exactly; the work
per step follows the slots in use, far below V at small N (at N = 4 about 4 new slots a step).
Which ids are correct (`correct_tokens`) therefore does not change any curve: tokens of a class
are exchangeable.

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

import torch
from torch import Tensor
from torch.optim.adamw import adamw

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


def correct_mask(config: SimConfig, seed: int) -> Tensor:
    """Bool `[V]`: the correct set P for a seed (anchor is token 0)."""
    has_anchor = config.anchor_logit is not None
    mask = torch.zeros(config.vocab_size, dtype=torch.bool)
    if config.correct_tokens == "first":
        start = 1 if has_anchor else 0
        mask[start:start + config.num_correct] = True
    else:
        gen = torch.Generator().manual_seed(10_000_019 * (seed + 1))
        pool = torch.arange(1 if has_anchor else 0, config.vocab_size)
        mask[pool[torch.randperm(len(pool), generator=gen)[: config.num_correct]]] = True
    if has_anchor and config.anchor_is_correct:
        mask[0] = True
    return mask


def initial_logits(config: SimConfig, correct: Tensor) -> Tensor:
    """`[..., V]` float64 logits: 0, `correct_logit` on P (seeding), `anchor_logit` on token 0."""
    z = torch.where(correct, config.correct_logit, 0.0).to(torch.float64)
    if config.anchor_logit is not None:
        z[..., 0] = config.anchor_logit
    return z


def surrogate_grad(p: Tensor, draws: Tensor, rewards: Tensor, tau: float) -> Tensor:
    """dL/dz `[S, V]` of L = -(1/N) sum_j (R_j - b) p_{y_j}, from the draws `[S, N]`.

    `rewards [S, V]` are R_i per token; b is the mean reward of the N draws. With s_i the summed
    centred reward of token i's draws and M = sum_k s_k p_k, dL/dz_i = -(p_i / (N tau))(s_i - M).
    Few draws (N < V/8): the dense part M p plus a scatter over the draws. Many draws: per-token
    draw counts and dense arithmetic, which beats gathering per draw.
    """
    rollouts, vocab = draws.shape[-1], p.shape[-1]
    scale = 1.0 / (rollouts * tau)
    if rollouts * 8 < vocab:
        r = rewards.gather(1, draws)
        weighted = (r - r.mean(-1, keepdim=True)) * p.gather(1, draws)
        grad = p * (weighted.sum(-1, keepdim=True) * scale)
        return grad.scatter_add_(1, draws, weighted.mul_(-scale))
    counts = torch.zeros_like(p).scatter_add_(1, draws, torch.ones_like(draws, dtype=p.dtype))
    baseline = (counts * rewards).sum(-1, keepdim=True) / rollouts
    s = counts.mul_(rewards - baseline)
    m = (s * p).sum(-1, keepdim=True)
    return s.sub_(m).mul_(p).mul_(-scale)


def row_cumsum(x: Tensor, block: int = 256, workspace: Tensor | None = None) -> Tensor:
    """Float64 cumulative sums along the last axis of `x [S, V]`, in blocks.

    Same values as `x.double().cumsum(-1)`, about 13x faster here: torch's CPU cumsum over one long
    float64 row is slow, over many short rows fast. Sums within blocks, then block offsets.
    `workspace` (float64 `[S, ceil(V / block) * block]`, zero past V) avoids a fresh allocation.
    """
    rows, vocab = x.shape
    padded_len = -(-vocab // block) * block
    if workspace is None:
        workspace = torch.zeros(rows, padded_len, dtype=torch.float64)
    workspace[:, :vocab].copy_(x)
    sums = workspace.view(rows, -1, block)
    sums.cumsum_(-1)
    offsets = sums[:, :, -1].cumsum(-1)
    sums[:, 1:, :] += offsets[:, :-1, None]
    return workspace[:, :vocab]


def draw_tokens(p: Tensor, rollouts: int, generators: Sequence[torch.Generator],
                workspace: Tensor | None = None, *, many: bool | None = None) -> Tensor:
    """`[S, N]` int64 i.i.d. draws from each row of `p [S, V]`: exact inverse-CDF sampling.

    Few draws: a binary search per draw. Many draws (`many`, default N >= V/8): a guide table
    (Chen & Asau 1974) maps each of V equal slices of [0, 1) to the first token whose CDF reaches
    it, so a uniform u starts its search next to its answer; three vectorised steps forward settle
    almost every draw, a binary search the rest. Each row draws its N uniforms from its own
    generator, so a row's draws do not depend on the other rows (pass `many` explicitly when the
    width of `p` varies with them). `p` need not be normalised; `workspace` goes to `row_cumsum`.
    """
    rows, vocab = p.shape
    cdf = row_cumsum(p, workspace=workspace)
    total = cdf[:, -1:].clone()
    if not (rollouts * 8 >= vocab if many is None else many):
        u = torch.stack([torch.rand(rollouts, generator=g, dtype=torch.float64)
                         for g in generators])
        u *= total  # uniforms on [0, total) instead of normalising the cdf
        return torch.searchsorted(cdf, u, right=True).clamp_(max=vocab - 1)
    # Many draws: the N uniforms come already sorted (order statistics from exponential spacings),
    # so every lookup below walks forward through memory. The draws are i.i.d., so only their
    # multiset matters; they are returned in ascending token order.
    uniforms = torch.stack([torch.rand(rollouts + 1, generator=g, dtype=torch.float64)
                            for g in generators])
    spacings = uniforms.neg_().log1p_().neg_()  # Exp(1) = -log(1 - U), finite since U < 1
    arrivals = row_cumsum(spacings)
    u = arrivals[:, :-1] * (total / arrivals[:, -1:])
    slices = vocab
    # guide[b] = #tokens with cdf < b * total / slices: the first index whose cdf reaches slice b.
    floor = (cdf * (slices / total)).long().clamp_(max=slices - 1)
    hist = torch.zeros(rows, slices, dtype=torch.int32).scatter_add_(
        1, floor, torch.ones(1, dtype=torch.int32).expand_as(floor))
    guide = hist.cumsum(-1, dtype=torch.int32).sub_(hist)  # exclusive prefix sum
    idx = guide.gather(1, (u * (slices / total)).long().clamp_(max=slices - 1)).long()
    idx.clamp_(max=vocab - 1)
    for _ in range(3):  # walk forward to the first token with cdf > u
        behind = cdf.gather(1, idx) <= u
        idx.add_(behind).clamp_(max=vocab - 1)
    rows_left, cols_left = (cdf.gather(1, idx) <= u).logical_and_(idx < vocab - 1).nonzero(
        as_tuple=True)
    for row in rows_left.unique().tolist():  # slices packed with tiny tokens: binary search
        cols = cols_left[rows_left == row]
        idx[row, cols] = torch.searchsorted(cdf[row], u[row, cols], right=True).clamp_(max=vocab - 1)
    return idx


class _Recorder:
    """Accumulates the logged metrics of S runs from the policy each step computes anyway.

    Works on slots (`_Population`): each slot stands for `count` tokens of one probability, so
    a sum over tokens is a count-weighted sum over slots; with `count` all 1 the slots are the V
    tokens themselves. Theorem-1 moments gather the drawn slots (deduplicated: A and B are sets;
    every drawn slot holds one token) and take class totals from count-weighted sums. Values are
    summed in float64.
    """

    def __init__(self, config: SimConfig, rows: int) -> None:
        self.config = config
        self.rows_count = rows
        self.rows: dict[str, list[Tensor]] = {m: [] for m in METRICS}
        self.steps: list[int] = []

    def policy(self, step: int, p: Tensor, count: Tensor, correct: Tensor, p0: Tensor) -> None:
        """Q_pos, % of correct tokens above their step-0 probability `p0`, the worst change."""
        weight = count.double() * correct
        pd = p.double()
        self.steps.append(step)
        self.rows["q_pos"].append((pd * weight).sum(-1))
        self.rows["pct_improved"].append(
            100.0 * ((pd > p0) * weight).sum(-1) / weight.sum(-1))
        change = torch.where(weight > 0, pd - p0, torch.inf)
        self.rows["worst_drop"].append(change.min(-1).values)

    def theorem(self, p: Tensor | None, draws: Tensor | None, count: Tensor | None = None,
                correct: Tensor | None = None) -> None:
        """The Theorem-1 terms of the update from policy `p` and `draws [S, N]` (slot ids)."""
        if p is None or draws is None or count is None or correct is None:
            nan = torch.full((self.rows_count,), torch.nan, dtype=torch.float64)
            for name in METRICS[3:]:
                self.rows[name].append(nan)
            return
        pd, cnt = p.double(), count.double()
        sq = cnt * pd * pd
        q_pos = (cnt * pd * correct).sum(-1)
        sq_all, sq_pos = sq.sum(-1), (sq * correct).sum(-1)
        ids, _ = draws.sort(-1)
        first = torch.ones_like(ids, dtype=torch.bool)
        first[:, 1:] = ids[:, 1:] != ids[:, :-1]
        p_d = pd.gather(1, ids) * first
        pos_d = correct.gather(1, ids).double()
        p_pos, a2 = (p_d * pos_d).sum(-1), (p_d * p_d * pos_d).sum(-1)
        p_neg, b2 = p_d.sum(-1) - p_pos, (p_d * p_d).sum(-1) - a2
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


class _Population:
    """The V tokens of S runs as slots: token classes never drawn, and single drawn tokens.

    Tokens never drawn share their class's whole history (logit, AdamW moments, step-0
    probability), so one slot with a multiplicity `count` stands for all of them: slot 0 is the
    anchor, slot 1 the undrawn correct tokens, slot 2 the undrawn incorrect ones; slots from 3 on
    hold one drawn token each. A draw that lands in a class picks one of its members uniformly
    (several draws may pick the same member), and each member picked leaves the class as a new
    slot with the class's state. The dynamics are those of the V-token policy exactly (the same
    distribution of every draw, the same gradient and AdamW step per token); the work per step
    is proportional to the slots in use, which at small N stays far below V. The width grows by
    doubling, the same for every row; unused slots have count 0 and stay at 0.
    """

    def __init__(self, config: SimConfig, rows: int, dtype: torch.dtype) -> None:
        has_anchor = config.anchor_logit is not None
        anchor = 1 if has_anchor else 0
        width = min(config.vocab_size + 3, 1024)
        self.config = config
        self.z = torch.zeros(rows, width, dtype=dtype)
        self.m = torch.zeros_like(self.z)
        self.v = torch.zeros_like(self.z)
        self.count = torch.zeros_like(self.z)
        self.correct = torch.zeros(rows, width, dtype=torch.bool)
        self.count[:, 0] = anchor
        self.count[:, 1] = config.num_correct
        self.count[:, 2] = config.vocab_size - config.num_correct - anchor
        self.correct[:, 0] = has_anchor and config.anchor_is_correct
        self.correct[:, 1] = True
        self.z[:, 1] = config.correct_logit
        if has_anchor:
            self.z[:, 0] = config.anchor_logit
        self.log_count = self.count.log()
        self.rewards = torch.where(self.correct, config.reward_correct, config.reward_wrong).to(dtype)
        self.used = torch.full((rows,), 3, dtype=torch.long)
        self.step = torch.zeros((), dtype=torch.float32)
        self.p0 = self.probs()[1].double()

    def probs(self) -> tuple[Tensor, Tensor]:
        """`[S, W]` each slot's probability mass and the probability of ONE of its tokens.

        An unused slot has mass 0 and probability 0. (Its logit may drift under the dense part
        of the gradient; a slot's state is overwritten when it is first used.)"""
        tau = self.config.temperature
        mass = torch.softmax((self.z if tau == 1.0 else self.z / tau) + self.log_count, dim=-1)
        return mass, mass / self.count.clamp_min(1.0)

    def split(self, draws: Tensor, p: Tensor,
              generators: Sequence[torch.Generator]) -> tuple[Tensor, Tensor]:
        """Give the class members picked by `draws [S, N]` (slot ids) slots of their own; return
        the draws as those slots' ids and `p` with the new slots' probabilities."""
        picked = (draws == 1) | (draws == 2)
        if not bool(picked.any()):
            return draws, p
        rows, cols = picked.nonzero(as_tuple=True)  # row-major: each row's draws in order
        per_row = picked.sum(-1).tolist()
        uniforms = torch.cat([torch.rand(k, generator=g, dtype=torch.float64)
                              for k, g in zip(per_row, generators)])
        cls = draws[rows, cols]
        member = (uniforms * self.count[rows, cls]).long()
        span = self.config.vocab_size + 1
        keys, inverse = torch.unique((rows * 3 + cls) * span + member, return_inverse=True)
        key_row, source = keys // (3 * span), (keys // span) % 3
        new = torch.bincount(key_row, minlength=len(generators))
        rank = torch.arange(len(keys)) - (new.cumsum(0) - new)[key_row]
        slots = self.used[key_row] + rank
        p = self._grow(int((self.used + new).max()), p)
        for t in (self.z, self.m, self.v, self.correct, self.rewards, self.p0, p):
            t[key_row, slots] = t[key_row, source]
        self.count[key_row, slots] = 1.0
        self.count.index_put_((key_row, source), torch.full_like(source, -1, dtype=self.count.dtype),
                              accumulate=True)
        self.log_count[key_row, slots] = 0.0
        classes = torch.arange(1, 3)
        self.log_count[:, classes] = self.count[:, classes].log()
        self.used += new
        draws = draws.clone()
        draws[rows, cols] = slots[inverse]
        return draws, p

    def _grow(self, needed: int, p: Tensor) -> Tensor:
        width = self.z.shape[1]
        if needed <= width:
            return p
        new = min(max(2 * width, needed), self.config.vocab_size + 3)

        def grown(t: Tensor, fill: float = 0.0) -> Tensor:
            out = torch.full((t.shape[0], new), fill, dtype=t.dtype)
            out[:, :width] = t
            return out

        self.z, self.m, self.v = grown(self.z), grown(self.m), grown(self.v)
        self.count, self.correct, self.p0 = grown(self.count), grown(self.correct), grown(self.p0)
        self.rewards, self.log_count = grown(self.rewards), grown(self.log_count, float("-inf"))
        return grown(p)

    def adamw(self, grad: Tensor) -> None:
        """One step of torch's AdamW on every slot's logit; a frozen anchor keeps its logit."""
        cfg = self.config
        frozen = cfg.freeze_anchor and cfg.anchor_logit is not None
        if frozen:
            grad[:, 0] = 0.0
        self.step += 1
        adamw(
            [self.z], [grad], [self.m], [self.v], [], [self.step], fused=True, amsgrad=False,
            beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, lr=cfg.lr,
            weight_decay=cfg.weight_decay, eps=cfg.adam_eps, maximize=False)
        if frozen:
            self.z[:, 0] = cfg.anchor_logit


def simulate(config: SimConfig, rollouts: int, seeds: Sequence[int],
             dtype: torch.dtype = torch.float32) -> SimulationResult:
    """Run the simulator for one N over several seeds at once (rows of one tensor).

    `dtype` is the policy's working precision; metrics are always taken in float64. The V
    tokens are held as slots (`_Population`): classes of undrawn tokens and single drawn ones.
    """
    seeds = list(seeds)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    pop = _Population(config, len(seeds), dtype)
    rec = _Recorder(config, len(seeds))
    rec.theorem(None, None)
    many = rollouts * 8 >= config.vocab_size  # the same draw method whatever the slot width
    workspace: Tensor | None = None
    for step in range(config.steps + 1):
        mass, p = pop.probs()
        if _is_logged(step, config):
            rec.policy(step, p, pop.count, pop.correct, pop.p0)
        if step == config.steps:
            break
        padded = -(-mass.shape[1] // 256) * 256  # row_cumsum's buffer, reused while it fits
        if workspace is None or workspace.shape[1] != padded:
            workspace = torch.zeros(len(seeds), padded, dtype=torch.float64)
        draws = draw_tokens(mass, rollouts, gens, workspace, many=many)
        draws, p = pop.split(draws, p, gens)
        grad = surrogate_grad(p, draws, pop.rewards, config.temperature)
        if _is_logged(step + 1, config):
            rec.theorem(p, draws, pop.count, pop.correct)  # the update about to happen
        pop.adamw(grad)
    return rec.result(rollouts, seeds)


def summarize(result: SimulationResult, metric: str) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation over seeds, each `[L]` (std is 0 for a single seed)."""
    values = result.curves[metric]
    std = values.std(0) if values.shape[0] > 1 else torch.zeros(values.shape[1], dtype=values.dtype)
    return values.mean(0), std
