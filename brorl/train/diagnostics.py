"""Knowledge shrinkage measured on the live policy: the mass balance around each PPO update.

BroRL's argument (BroRL §2, Theorem 1; §4.1) is about the probability of correct tokens: with few
rollouts per prompt an update can lower the probability of correct answers it never sampled;
with large N that term vanishes. The token-level simulator (`brorl.theory`) shows it on a
bandit. Here the same three quantities are measured on the policy being trained, on probes: a
prompt with its known-correct response (`render_target`: the reference answer, or a code
problem's reference solution, followed by EOS), scored teacher-forced under the trainer's
sampling distribution (`brorl.train.ppo.score_batch`, temperature without top-p).

For a set of probes and the probabilities `p` of their reference tokens before and after one
update (all tokens of all probes, padding excluded):
- `q_pos`: the mean reference-token probability after the update (the live analogue of Q_pos);
  `q_pos_delta`: its change over the update;
- `pct_improved`: percent of reference tokens whose probability rose over the update;
- `worst_drop`: min over reference tokens of p_after - p_before (the paper's worst drop, over
  one update).
The held-out set (fixed validation problems) also gets the paper's cumulative pair, against the
run's start: `pct_improved_since_start` and `worst_drop_since_start` (spec Fig. 3's definitions,
min_i p_i(t) - p_i(0)).

Sampled vs unsampled correct paths: the step's own drawn prompts (up to a cap), split by whether
any of their N rollouts was correct (`solved`, the correct path was sampled) or none was
(`unsolved`, it was not). Knowledge shrinkage is the `unsolved` set losing probability.

`decompose`: the first-order change of the held-out Q_pos under one plain gradient step on the
step's policy-gradient loss, split by the rollouts that drive it: the loss is a sum over rollouts,
so its gradient is g = g_correct + g_incorrect, and the first-order change -lr * grad(Q_pos) . g
splits the same way (`first_order_split`). It is the mechanism's sign, not a prediction of the
realised change under AdamW and several mini-batches (a preconditioned, multi-step update).

Deliberately ignored: per-position Q_pos (the mass of every correct token at a position): a
sequence has one known-correct path here, so the reference tokens' own probabilities stand in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from brorl.train.rollouts import response_mask
from brorl.types import Problem, RolloutBatch


@dataclass(frozen=True)
class Probes:
    """Probe problems and their reference responses as a `RolloutBatch` of one row each."""

    problems: tuple[Problem, ...]
    batch: RolloutBatch

    @property
    def mask(self) -> Tensor:
        """bool `[P, T]`: True on each probe's reference tokens (EOS included)."""
        return response_mask(self.batch)

    def __len__(self) -> int:
        return len(self.problems)


def has_reference(problem: Problem) -> bool:
    """Whether `render_target` can write the problem's known-correct response."""
    from brorl.families.prompts import render_target

    try:
        render_target(problem)
    except ValueError:
        return False
    return True


def build_probes(problems: Sequence[Problem], tokenizer) -> Probes:
    """The probes of `problems` that have a reference response (the others are skipped)."""
    from brorl.base.supervised import encode_pairs
    from brorl.policy.tokens import pad_id

    kept = tuple(p for p in problems if has_reference(p))
    pairs = encode_pairs(kept, tokenizer)
    pad = pad_id(tokenizer)
    width = max((len(t) for _, t in pairs), default=0)
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    for row, (_, target) in enumerate(pairs):
        ids[row, : len(target)] = torch.tensor(target)
    batch = RolloutBatch(
        prompt_index=torch.arange(len(pairs)), prompt_ids=tuple(tuple(p) for p, _ in pairs),
        response_ids=ids, response_lengths=torch.tensor([len(t) for _, t in pairs],
                                                        dtype=torch.long),
        logprobs=torch.zeros(len(pairs), width), texts=tuple("" for _ in pairs),
        finish_reasons=tuple("stop" for _ in pairs), rollouts_per_prompt=1, pad_id=pad)
    return Probes(kept, batch)


def reference_probs(model: torch.nn.Module, probes: Probes, temperature: float,
                    micro_batch_rollouts: int, max_tokens: int | None = None) -> Tensor:
    """Probabilities `[P, T]` float32 of the probes' reference tokens under `model`'s sampling
    distribution (the trainer's: softmax(logits / temperature)), 0 on padding; scored in the
    trainer's micro-batches (`max_tokens`: `update.max_tokens_per_micro_batch`)."""
    from brorl.train.ppo import score_batch

    if len(probes) == 0:
        return torch.zeros(0, 0)
    was_training = model.training
    model.eval()
    logp = score_batch(model, probes.batch, temperature, micro_batch_rollouts,
                       max_tokens=max_tokens)
    model.train(was_training)
    return torch.where(probes.mask, logp.exp(), torch.zeros_like(logp))


def change_metrics(before: Tensor, after: Tensor, mask: Tensor, prefix: str) -> dict[str, float]:
    """`<prefix>/q_pos`, `q_pos_delta`, `pct_improved`, `worst_drop`, `tokens` of one update
    (see the module docstring), over the tokens where `mask` is True; {} without tokens."""
    if not bool(mask.any()):
        return {}
    b, a = before[mask].double(), after[mask].double()
    delta = a - b
    return {f"{prefix}/q_pos": float(a.mean()), f"{prefix}/q_pos_delta": float(delta.mean()),
            f"{prefix}/pct_improved": 100.0 * float((delta > 0).double().mean()),
            f"{prefix}/worst_drop": float(delta.min()), f"{prefix}/tokens": float(mask.sum())}


def since_start_metrics(start: Tensor, now: Tensor, mask: Tensor, prefix: str) -> dict[str, float]:
    """The paper's cumulative pair against the run's start (spec Fig. 3): percent of reference
    tokens above their start probability, and min_i p_i(t) - p_i(0)."""
    if not bool(mask.any()):
        return {}
    delta = now[mask].double() - start[mask].double()
    return {f"{prefix}/pct_improved_since_start": 100.0 * float((delta > 0).double().mean()),
            f"{prefix}/worst_drop_since_start": float(delta.min())}


def probe_metrics(probes: Probes, before: Tensor, after: Tensor, prefix: str,
                  start: Tensor | None = None) -> dict[str, float]:
    """`change_metrics` over all probes and per family (`<prefix>_<family>/...`), the probe
    count, and with `start` the cumulative pair over all probes."""
    if len(probes) == 0:
        return {f"{prefix}/probes": 0.0}
    mask = probes.mask
    out = {f"{prefix}/probes": float(len(probes)), **change_metrics(before, after, mask, prefix)}
    families = sorted({p.family for p in probes.problems})
    for family in families:
        rows = torch.tensor([p.family == family for p in probes.problems])
        out.update(change_metrics(before, after, mask & rows[:, None], f"{prefix}_{family}"))
    if start is not None:
        out.update(since_start_metrics(start, after, mask, prefix))
    return out


Backward = Callable[[Tensor], object]
"""A backward callback: takes one micro-batch loss (`accumulate_mini_batch`'s `backward`)."""


def gradient(params: Sequence[Tensor], run: Callable[[Backward], object]) -> list[Tensor]:
    """The gradient of the sum of every loss `run` hands its backward callback, w.r.t. `params`
    (`torch.autograd.grad`: nothing accumulates into `.grad`, so neither the optimizer nor
    DeepSpeed's gradient hooks see it)."""
    total = [torch.zeros_like(p) for p in params]

    def backward(loss: Tensor) -> None:
        for acc, g in zip(total, torch.autograd.grad(loss, params, allow_unused=True)):
            if g is not None:
                acc += g

    run(backward)
    return total


def first_order_split(model: torch.nn.Module, objective: Callable[[], Tensor],
                      parts: dict[str, Callable[[Backward], object]], lr: float
                      ) -> dict[str, float]:
    """-lr * grad(objective) . grad(loss_k) for each named loss part, and their sum
    (`first_order`): the first-order change of `objective` under one plain gradient step of size
    `lr` on the summed loss, split by part. A part runs its micro-batches through the backward
    callback it is given."""
    params = [p for p in model.parameters() if p.requires_grad]
    grad_f = gradient(params, lambda backward: backward(objective()))
    out: dict[str, float] = {}
    for name, run in parts.items():
        dot = sum(float((gf.double() * g.double()).sum())
                  for gf, g in zip(grad_f, gradient(params, run)))
        out[name] = -lr * dot
    out["first_order"] = sum(out.values())
    return out


def rollout_parts(model: torch.nn.Module, reference: torch.nn.Module, groups, config
                  ) -> dict[str, Callable[[Backward], object]]:
    """The step's policy-gradient loss at the current weights (on-policy: old log-probs are the
    current ones, ratio 1), split into the rollouts judged correct (reward >= the filter's
    `correct_reward`) and the others: two runners for `first_order_split`. Advantages, TIS
    weights, KL and normaliser are the update's own (`Trainer.update`: over all N rollouts, or
    over the M each group keeps with `train_subset`)."""
    from functools import partial

    from brorl.algorithm.advantages import compute_advantages, token_advantages
    from brorl.algorithm.downsample import max_variance_subset
    from brorl.train.ppo import accumulate_mini_batch, score_batch

    c = config
    if c.train_subset is not None:
        groups = groups.select_rollouts(max_variance_subset(groups.rewards, c.train_subset))
    batch = groups.batch
    mask = response_mask(batch)
    advantages = token_advantages(
        compute_advantages(groups.rewards, c.advantage_estimator, groups.valid), mask).float()
    tokens = c.max_tokens_per_micro_batch
    old_logp = score_batch(model, batch, c.temperature, c.micro_batch_rollouts, max_tokens=tokens)
    ref_logp = score_batch(reference, batch, c.temperature, c.micro_batch_rollouts,
                           max_tokens=tokens) if c.loss.kl_coef > 0 else None
    correct = groups.rewards.reshape(-1) >= c.correct_reward
    real = groups.valid_mask().reshape(-1)  # padded groups: their empty rows are neither
    rows = torch.arange(batch.num_rollouts)

    def run(index: Tensor, backward: Backward) -> None:
        accumulate_mini_batch(
            model, backward, batch, index, advantages=advantages, old_logp=old_logp,
            engine_logp=batch.logprobs, ref_logp=ref_logp, temperature=c.temperature,
            micro_batch_rollouts=c.micro_batch_rollouts, normaliser=float(mask.sum()),
            max_tokens=tokens, loss=c.loss)

    return {"correct": partial(run, rows[correct & real]),
            "incorrect": partial(run, rows[~correct & real])}


@dataclass(frozen=True)
class DiagnosticsConfig:
    """The `diagnostics` section as plain values (`brorl.params.DiagnosticsParams` documents
    each field); no defaults here."""

    enabled: bool
    probes_per_family: int
    step_probes: int
    decompose: bool
    seed: int

    @classmethod
    def from_params(cls, params) -> DiagnosticsConfig:
        d = params.diagnostics
        return cls(enabled=d.enabled, probes_per_family=d.probes_per_family,
                   step_probes=d.step_probes, decompose=d.decompose, seed=d.seed)


@dataclass
class Pending:
    """What `Shrinkage.before` measured, for `Shrinkage.after`."""

    heldout: Tensor
    solved: Probes
    solved_before: Tensor
    unsolved: Probes
    unsolved_before: Tensor
    decomposition: dict[str, float]
    seconds: float


class Shrinkage:
    """The probes of one run and their measurement around each update (module docstring).

    `start` holds the held-out probes' reference-token probabilities at the run's start, flat
    over their tokens (`RunState.probe_start`, saved in every checkpoint): taken at the first
    update of a fresh run, restored on resume."""

    def __init__(self, heldout: Probes, tokenizer, config: DiagnosticsConfig, temperature: float,
                 micro_batch_rollouts: int, correct_reward: float,
                 start: Sequence[float] | None = None, max_tokens: int | None = None) -> None:
        self.heldout, self.tokenizer, self.config = heldout, tokenizer, config
        self.temperature, self.micro = temperature, micro_batch_rollouts
        self.max_tokens = max_tokens
        """`update.max_tokens_per_micro_batch` (None: row-padded micro-batches)."""
        self.correct_reward = correct_reward
        self.start: Tensor | None = None
        if start is not None:
            self.start = torch.zeros(heldout.mask.shape)
            self.start[heldout.mask] = torch.tensor(list(start), dtype=torch.float32)

    def start_values(self) -> list[float] | None:
        """The start probabilities, flat (what `RunState.probe_start` saves)."""
        return None if self.start is None else self.start[self.heldout.mask].tolist()

    def _probs(self, model: torch.nn.Module, probes: Probes) -> Tensor:
        return reference_probs(model, probes, self.temperature, self.micro, self.max_tokens)

    def before(self, model: torch.nn.Module, drawn: Sequence[tuple[Problem, bool]],
               decompose: Callable[[Callable[[], Tensor]], dict[str, float]] | None
               ) -> Pending:
        """Score the held-out probes and the step's drawn prompts (`(problem, solved)` pairs)
        under the policy before the update; `decompose(objective)` (when configured) gives the
        first-order split of the held-out Q_pos objective."""
        started = time.perf_counter()
        heldout = self._probs(model, self.heldout)
        if self.start is None:
            self.start = heldout.clone()
        cap = self.config.step_probes
        solved = build_probes([p for p, s in drawn if s][:cap], self.tokenizer)
        unsolved = build_probes([p for p, s in drawn if not s][:cap], self.tokenizer)
        decomposition = {}
        if self.config.decompose and decompose is not None and len(self.heldout):
            decomposition = {f"diag/decompose/{k}": v
                             for k, v in decompose(self.objective(model)).items()}
        return Pending(heldout, solved, self._probs(model, solved), unsolved,
                       self._probs(model, unsolved), decomposition,
                       time.perf_counter() - started)

    def objective(self, model: torch.nn.Module) -> Callable[[], Tensor]:
        """The held-out Q_pos as a differentiable function of `model`'s weights: the mean
        reference-token probability over all held-out probes."""
        from brorl.train.ppo import response_logprobs

        rows, mask = torch.arange(len(self.heldout)), self.heldout.mask

        def q_pos() -> Tensor:
            logp, _ = response_logprobs(model, self.heldout.batch, rows, self.temperature)
            valid = mask[:, : logp.shape[1]].to(logp.device)
            return (logp.exp() * valid).sum() / valid.sum()

        return q_pos

    def after(self, model: torch.nn.Module, pending: Pending) -> dict[str, float]:
        """The `diag/*` metrics of the update that ran since `before`, and `time/diagnostics`
        (the seconds of both halves)."""
        started = time.perf_counter()
        out = probe_metrics(self.heldout, pending.heldout, self._probs(model, self.heldout),
                            "diag/heldout", start=self.start)
        for name, probes, before in (("solved", pending.solved, pending.solved_before),
                                     ("unsolved", pending.unsolved, pending.unsolved_before)):
            if len(probes):
                out.update(change_metrics(before, self._probs(model, probes), probes.mask,
                                          f"diag/{name}"))
            out[f"diag/{name}/probes"] = float(len(probes))
        out.update(pending.decomposition)
        out["time/diagnostics"] = pending.seconds + time.perf_counter() - started
        return out
