"""The supervised warm-up of the base stage: teacher forcing in rounds, stopped by validation.

The policy is trained by teacher forcing on (prompt, ideal response) pairs:
`render_prompt(problem, tokenizer)` then `render_target(problem)` + EOS, loss on the response
tokens only. Training runs in rounds of `eval_every` steps; after each round the policy is scored
on a validation sample per family (`brorl.evaluation.scoring.evaluate_policy`, sampled by an hf rollout
engine over the model being trained, `base_engine`) and `warm_up` stops once every family's
pass@1 reaches `target_pass_low`, or at `max_steps`.

Batches draw problems by family share (`family_shares`, equal by default; then uniform within
the family) from a seeded generator: the same seed gives the same checkpoint on the same machine
and thread count. After each check a family whose validation pass@1 already reached the low end
trains at `reached_share` x its share (`round_shares`): the families learn at different speeds
(code's copy-the-constant skill jumps from 0.2 to 0.9 within a few hundred steps), so without it
the fast ones leave the band while the slow ones are still below it.
A batch runs as `micro_batches` length-sorted micro-batches with token-weighted losses: the
gradient of one padded batch at a third less compute (code pairs are twice as long as the rest).
The learning rate warms up linearly, then follows a cosine down to `min_lr_ratio` x lr at
`max_steps` (`lr_at`): at a constant 3e-3 the tiny policy's validation pass@1 swung by 20 points
between checks; the decay lets it settle within the CPU budget.

Deliberately ignored: accumulation over several batches, mixed precision, early stopping on loss.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from brorl.base.config import BaseConfig
from brorl.engines import RolloutEngine, build_engine
from brorl.evaluation.scoring import evaluate_policy
from brorl.families.prompts import render_prompt, render_target
from brorl.types import Problem

IGNORE = -100
"""Label of positions that carry no loss (prompt and padding), torch's cross-entropy default."""


def encode_pairs(problems: Sequence[Problem], tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids `[P]`, response ids `[T]` ending in EOS) per problem."""
    pairs = []
    for p in problems:
        prompt = tokenizer(render_prompt(p, tokenizer), add_special_tokens=False)["input_ids"]
        target = tokenizer(render_target(p), add_special_tokens=False)["input_ids"]
        pairs.append((prompt, target + [tokenizer.eos_token_id]))
    return pairs


def collate(pairs: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded `input_ids`, `attention_mask`, `labels` `[B, max(P + T)]`; labels only on T."""
    width = max(len(p) + len(t) for p, t in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (prompt, target) in enumerate(pairs):
        seq = prompt + target
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, len(prompt):len(seq)] = torch.tensor(target)
        mask[row, :len(seq)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def family_weights(problems: Sequence[Problem],
                   shares: Mapping[str, float] | None = None) -> torch.Tensor:
    """Sampling weight per problem `[B]`: share of its family / (problems in its family).

    `shares` None gives every family the same share; a family missing from `shares` gets 1.
    Within a family problems are equally likely.
    """
    counts: dict[str, int] = {}
    for p in problems:
        counts[p.family] = counts.get(p.family, 0) + 1
    shares = shares or {}
    return torch.tensor([shares.get(p.family, 1.0) / counts[p.family] for p in problems],
                        dtype=torch.float64)


def round_shares(passes: Mapping[str, float], *, target_pass_low: float, reached_share: float,
                 family_shares: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each family's batch share for the next round: its `family_shares` entry (default 1),
    times `reached_share` once its validation pass@1 has reached `target_pass_low`.

    A family that is already in the band trains less while the others catch up, so the stop
    (every family at the low end) comes before the fast ones run past the high end.
    """
    base = family_shares or {}
    return {f: base.get(f, 1.0) * (reached_share if passes[f] >= target_pass_low else 1.0)
            for f in sorted(passes)}


def lr_at(step: int, *, lr: float, warmup_steps: int, total_steps: int,
          min_lr_ratio: float) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up, then cosine decay.

    (step + 1) / warmup_steps x lr during warm-up; then lr x (r + (1 - r)(1 + cos(pi f)) / 2)
    with r = `min_lr_ratio` and f = (step - warmup_steps) / (total_steps - warmup_steps), so lr at
    the first step after warm-up and r x lr at `total_steps`; r = 1 keeps it constant.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    frac = min(1.0, (step - warmup_steps) / max(total_steps - warmup_steps, 1))
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * frac)))


@dataclass
class WarmUpState:
    """Optimizer, batch generator and step count carried across training rounds."""

    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    step: int = 0
    losses: list[float] = field(default_factory=list)


def start_warm_up(model, config: BaseConfig) -> WarmUpState:
    """AdamW over the model's parameters (no weight decay) at `config.lr`, and a batch generator
    seeded with `config.seed`."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    return WarmUpState(optimizer, torch.Generator().manual_seed(config.seed))


def length_sorted_chunks(pairs: Sequence[tuple[list[int], list[int]]],
                         chunks: int) -> list[list[int]]:
    """Positions of `pairs` sorted by length (P + T, ties by position), cut into `chunks` runs
    of near-equal size (empty runs dropped): micro-batches that pad little."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]) + len(pairs[i][1]), i))
    cuts = [round(c * len(order) / chunks) for c in range(chunks + 1)]
    return [order[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


def batch_loss_backward(model, batch: Sequence[tuple[list[int], list[int]]], *, pad_id: int,
                        micro_batches: int) -> float:
    """Backpropagate the batch's mean response-token loss through length-sorted micro-batches.

    Each micro-batch's mean loss is weighted by its share of the batch's response tokens, so
    the accumulated gradient equals that of one padded batch `[B, max(P + T)]` while padding
    only to each micro-batch's own longest pair. Returns the batch's mean loss.
    """
    total = sum(len(target) for _, target in batch)
    loss_sum = 0.0
    for chunk in length_sorted_chunks(batch, micro_batches):
        part = [batch[i] for i in chunk]
        share = sum(len(target) for _, target in part) / total
        loss = model(**collate(part, pad_id)).loss * share
        loss.backward()
        loss_sum += loss.item()
    return loss_sum


def train_steps(model, state: WarmUpState, config: BaseConfig, pairs, weights: torch.Tensor, *,
                steps: int, pad_id: int) -> None:
    """`steps` teacher-forced AdamW steps on family-balanced batches of `pairs` (in place): batches
    of `config.batch_size` in `config.micro_batches`, the LR of `lr_at` over `config.max_steps`."""
    c = config
    model.train()
    for _ in range(steps):
        rate = lr_at(state.step, lr=c.lr, warmup_steps=c.warmup_steps, total_steps=c.max_steps,
                     min_lr_ratio=c.min_lr_ratio)
        for group in state.optimizer.param_groups:
            group["lr"] = rate
        idx = torch.multinomial(weights, c.batch_size, replacement=True, generator=state.generator)
        state.optimizer.zero_grad(set_to_none=True)
        loss = batch_loss_backward(model, [pairs[i] for i in idx.tolist()], pad_id=pad_id,
                                   micro_batches=c.micro_batches)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        state.optimizer.step()
        state.losses.append(loss)
        state.step += 1
    model.eval()


def band_distance(passes: Mapping[str, float], low: float, high: float) -> float:
    """How far pass@1 per family lies outside [low, high], summed: 0 when every family is in."""
    return sum(max(0.0, low - v) + max(0.0, v - high) for v in passes.values())


def base_engine(model, tokenizer, config: BaseConfig) -> RolloutEngine:
    """The rollout engine the stage's checks and test sample with: `config.engine` (hf) over
    `model` itself, so it samples the weights as they are trained, with no copy to sync."""
    return build_engine(config.engine, model=model, tokenizer=tokenizer, model_path=None,
                        max_model_len=model.config.max_position_embeddings)


def warm_up(model, tokenizer, train: Sequence[Problem], validation: Sequence[Problem],
            config: BaseConfig) -> list[dict]:
    """Train in rounds of `eval_every` steps until every family's validation pass@1 reaches the
    band's low end, then keep the weights of the check closest to the band: [target_pass_low,
    target_pass_high] of `config` narrowed by `band_margin` at each end. Each check samples one
    response per problem at `eval_temperature` and `eval_top_p` (at most `max_response_tokens`).

    Returns the history: one dict per evaluation (step, mean loss of the round's batches,
    seconds, pass@1 per family, `band_distance` to [low, high], the shares of the next round
    from `round_shares`), the first at step 0 (the untrained model, loss NaN). The learning rate
    follows `lr_at` over `max_steps`. The model is trained in place and ends with the weights of
    the check of least band distance (the latest on ties), marked `selected` in the history:
    families learn at different speeds, and one may jump past the band (code from 0.2 to 0.8 in
    200 steps) while another is still below it; selection on validation is early stopping.
    """
    c = config
    low, high = c.target_pass_low + c.band_margin, c.target_pass_high - c.band_margin
    pairs = encode_pairs(train, tokenizer)
    state = start_warm_up(model, c)
    round_start, best, best_weights = 0, None, None
    started, history = time.perf_counter(), []
    engine = base_engine(model, tokenizer, c)
    while True:
        scores, _ = evaluate_policy(engine, tokenizer, validation, n=1,
                                    max_new_tokens=c.max_response_tokens,
                                    temperature=c.eval_temperature, top_p=c.eval_top_p,
                                    seed=c.seed, verify=c.verify)
        passes = {f: s["pass_at_1"] for f, s in scores["family"].items()}
        shares = round_shares(passes, target_pass_low=low, reached_share=c.reached_share,
                              family_shares=c.family_shares)
        losses = state.losses[round_start:]
        history.append({"step": state.step, "seconds": time.perf_counter() - started,
                        "loss": sum(losses) / len(losses) if losses else float("nan"),
                        "pass_at_1": passes, "shares": shares,
                        "band_distance": band_distance(passes, low, high), "selected": False})
        if best is None or history[-1]["band_distance"] <= history[best]["band_distance"]:
            best = len(history) - 1
            best_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if state.step >= c.max_steps or min(passes.values()) >= low:
            model.load_state_dict(best_weights)
            history[best]["selected"] = True
            return history
        round_start = len(state.losses)
        weights = family_weights(train, shares)
        train_steps(model, state, c, pairs, weights,
                    steps=min(c.eval_every, c.max_steps - state.step),
                    pad_id=tokenizer.pad_token_id)
