"""The base checkpoint: supervised warm-up of the tiny policy until it is middling, not solved.

The paper continues RL from a checkpoint that plateaued under ProRLv2 (spec §5.1 baseline row,
§7.2). On CPU our stand-in is a tiny Qwen2 trained by teacher forcing on (prompt, ideal response)
pairs: `render_prompt(problem, tokenizer)` then `render_target(problem)` + EOS, loss on the
response tokens only. Training runs in rounds of `eval_every` steps; after each round the policy
is scored on a validation sample per family (`brorl.evaluate.evaluate_policy`, the RL reward's
own verifiers) and training stops once every family's pass@1 reaches `target_pass_low`
(default 0.2), or at `max_steps`. Stopping at the low end of the 20-60% band leaves room for RL.

Batches draw problems family-balanced (each family equally likely, then uniform within it) from
a seeded generator: the same seed gives the same checkpoint on the same machine and thread count.

Deliberately ignored: learning-rate schedules beyond a linear warm-up, gradient accumulation,
mixed precision, early stopping on loss. Paper: spec §5.1 / §7.2 (plateaued starting point).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from brorl.evaluate import evaluate_policy
from brorl.policy import build_policy, build_tokenizer
from brorl.prompts import render_prompt, render_target
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


def family_weights(problems: Sequence[Problem]) -> torch.Tensor:
    """Sampling weight per problem `[B]`: 1 / (problems in its family), so families are equal."""
    counts: dict[str, int] = {}
    for p in problems:
        counts[p.family] = counts.get(p.family, 0) + 1
    return torch.tensor([1.0 / counts[p.family] for p in problems], dtype=torch.float64)


@dataclass
class WarmUpState:
    """Optimizer, batch generator and step count carried across training rounds."""

    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    lr: float
    step: int = 0
    losses: list[float] = field(default_factory=list)


def start_warm_up(model, *, lr: float, seed: int, weight_decay: float = 0.0) -> WarmUpState:
    """AdamW over the model's parameters and a batch generator seeded with `seed`."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    return WarmUpState(optimizer, torch.Generator().manual_seed(seed), lr)


def train_steps(model, state: WarmUpState, pairs, weights: torch.Tensor, *, steps: int,
                batch_size: int, pad_id: int, warmup_steps: int = 20) -> None:
    """`steps` teacher-forced AdamW steps on family-balanced batches of `pairs` (in place)."""
    model.train()
    for _ in range(steps):
        for group in state.optimizer.param_groups:  # linear warm-up, then constant
            group["lr"] = state.lr * min(1.0, (state.step + 1) / max(warmup_steps, 1))
        idx = torch.multinomial(weights, batch_size, replacement=True, generator=state.generator)
        loss = model(**collate([pairs[i] for i in idx.tolist()], pad_id)).loss
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        state.optimizer.step()
        state.losses.append(loss.item())
        state.step += 1
    model.eval()


def warm_up(model, tokenizer, train: Sequence[Problem], validation: Sequence[Problem], *,
            max_steps: int, eval_every: int, batch_size: int, lr: float, seed: int,
            target_pass_low: float = 0.2, max_new_tokens: int = 64, eval_temperature: float = 0.0,
            workers: int | None = None) -> list[dict]:
    """Train in rounds until every family's validation pass@1 >= `target_pass_low`.

    Returns the history: one dict per evaluation (step, loss of the last batch, seconds, pass@1
    per family), the first at step 0 (the untrained model). The model is trained in place.
    """
    pairs, weights = encode_pairs(train, tokenizer), family_weights(train)
    state = start_warm_up(model, lr=lr, seed=seed)
    started, history = time.perf_counter(), []
    while True:
        scores, _ = evaluate_policy(model, tokenizer, validation, n=1, max_new_tokens=max_new_tokens,
                                    temperature=eval_temperature, seed=seed, workers=workers)
        passes = {f: s["pass_at_1"] for f, s in scores["family"].items()}
        history.append({"step": state.step, "seconds": time.perf_counter() - started,
                        "loss": state.losses[-1] if state.losses else float("nan"),
                        "pass_at_1": passes})
        if state.step >= max_steps or min(passes.values()) >= target_pass_low:
            return history
        train_steps(model, state, pairs, weights, steps=min(eval_every, max_steps - state.step),
                    batch_size=batch_size, pad_id=tokenizer.pad_token_id)


def sample_per_family(problems: Sequence[Problem], per_family: int, seed: int) -> list[Problem]:
    """Up to `per_family` problems of each family, drawn by `seed`, in id order."""
    groups: dict[str, list[Problem]] = {}
    for p in sorted(problems, key=lambda p: p.id):
        groups.setdefault(p.family, []).append(p)
    gen = torch.Generator().manual_seed(seed)
    out: list[Problem] = []
    for family in sorted(groups):
        order = torch.randperm(len(groups[family]), generator=gen)[:per_family].tolist()
        out += [groups[family][i] for i in sorted(order)]
    return out


def make_base_checkpoint(train: Sequence[Problem], validation: Sequence[Problem],
                         test: Sequence[Problem], *, model_config: dict, max_steps: int,
                         eval_every: int, batch_size: int, lr: float, seed: int,
                         target_pass_low: float, eval_per_family: int, test_samples: int,
                         eval_temperature: float, eval_top_p: float, max_response_tokens: int,
                         workers: int | None = None) -> tuple[object, object, dict]:
    """Build the tiny policy from `model_config` (build_policy's sizes), warm it up, score it.

    Returns (model, tokenizer, report); the report holds the warm-up history and the held-out
    test scores (pass@1 from `test_samples` samples at `eval_temperature`, spec §5.2 protocol).
    """
    tokenizer = build_tokenizer()
    model = build_policy(vocab_size=len(tokenizer), **model_config)
    started = time.perf_counter()
    history = warm_up(model, tokenizer, train, sample_per_family(validation, eval_per_family, seed),
                      max_steps=max_steps, eval_every=eval_every, batch_size=batch_size, lr=lr,
                      seed=seed, target_pass_low=target_pass_low,
                      max_new_tokens=max_response_tokens, workers=workers)
    train_seconds = time.perf_counter() - started
    scores, _ = evaluate_policy(model, tokenizer, test, n=test_samples, k_values=(1,),
                                max_new_tokens=max_response_tokens, temperature=eval_temperature,
                                top_p=eval_top_p, seed=seed, workers=workers)
    report = {"history": history, "test": scores, "steps": history[-1]["step"],
              "train_seconds": train_seconds}
    return model, tokenizer, report
