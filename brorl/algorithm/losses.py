"""The ProRLv2 policy loss: clipped PPO with clip-higher, truncated importance sampling between the
rollout engine and the trainer, a clamped KL penalty to a reference, token-level aggregation. `LossConfig` is its settings, from the `update` section.

Per token t of rollout m (shapes `[M, T]`, M = rollouts in this micro-batch):
    r = pi_theta / pi_old,   loss_pg = w * max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
    w = min(pi_old / pi_engine, cap)  (TIS, detached; BroRL §3.1) or IcePop's masked ratio
    loss = sum_t mask (loss_pg + kl_coef * kl - entropy_coef * H) / normaliser
BroRL §3.1 (clip-higher, TIS); the ProRLv2 blog post (eps 0.20 / 0.28, k2 KL with clamping);
NeMo-RL's ProRLv2 example config (input clamp 20, output clamp 10, TIS cap 5, IcePop band [0.5, 5],
token-level loss).

`normaliser` is the number of valid tokens in the whole mini-batch: passing it to every micro-batch
makes the sum of micro-batch gradients equal the full-batch gradient, and makes every metric
additive over micro-batches. Deliberately ignored: dual-clip PPO, sequence-level aggregation,
KL in the reward (NeMo-RL `use_kl_in_reward: false`), an entropy bonus by default (logged only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from brorl.params import UpdateParams
    from brorl.params.rl import KLEstimator, TISMode

@dataclass(frozen=True)
class LossConfig:
    """Arguments of `brorl.algorithm.losses.policy_loss` besides the tensors."""

    clip_eps_low: float
    clip_eps_high: float
    tis_mode: TISMode
    tis_cap: float
    tis_min: float
    kl_coef: float
    kl_estimator: KLEstimator
    kl_input_clamp: float
    kl_output_clamp: float
    entropy_coef: float

    @classmethod
    def from_params(cls, update: UpdateParams) -> LossConfig:
        """The loss options of the `update` section (same names)."""
        from brorl.params.loading import same_named

        return same_named(cls, update)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last axis: logits `[..., V]` -> `[...]` (nats)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def kl_penalty(
    logp: Tensor,
    ref_logp: Tensor,
    estimator: KLEstimator,
    input_clamp: float | None,
    output_clamp: float | None,
) -> Tensor:
    """Per-token KL(pi || ref) estimate `[M, T]` from log-probs `[M, T]` of the sampled tokens.

    The log ratio log(pi/ref) is clamped to +-input_clamp before the estimator, the estimate to
    +-output_clamp after it (None: no clamp); both keep exp() finite on rare tokens.
    """
    log_ratio = logp - ref_logp
    if input_clamp is not None:
        log_ratio = log_ratio.clamp(-input_clamp, input_clamp)
    match estimator:
        case "k1":
            kl = log_ratio
        case "k2":
            kl = 0.5 * log_ratio**2
        case "k3":
            kl = torch.exp(-log_ratio) - 1 + log_ratio
        case _:
            raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1', 'k2' or 'k3'.")
    if output_clamp is not None:
        kl = kl.clamp(-output_clamp, output_clamp)
    return kl


def importance_weights(
    old_logp: Tensor, engine_logp: Tensor, mode: TISMode, cap: float, tis_min: float
) -> tuple[Tensor, Tensor]:
    """Engine->trainer correction: (weights `[M, T]`, detached; bool `[M, T]` where it acted).

    ratio = pi_old / pi_engine, both for the sampled token (trainer recomputation over engine).
    """
    ratio = torch.exp(old_logp - engine_logp).detach()
    match mode:
        case "none":
            return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)
        case "truncate":
            return ratio.clamp(max=cap), ratio > cap
        case "icepop":
            outside = (ratio < tis_min) | (ratio > cap)
            return torch.where(outside, torch.zeros_like(ratio), ratio), outside
        case _:
            raise ValueError(f"unknown TIS mode {mode!r}; use 'none', 'truncate' or 'icepop'.")


def clipped_policy_objective(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_eps_low: float, clip_eps_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO loss `[M, T]` and bool `[M, T]` masks of active clipping (low, high).

    Clipping is active (zero gradient) where A < 0 and r < 1 - eps_low, or A > 0 and r > 1 + eps_high.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    loss = torch.maximum(unclipped, clipped)
    clip_low = (advantages < 0) & (ratio < 1.0 - clip_eps_low)
    clip_high = (advantages > 0) & (ratio > 1.0 + clip_eps_high)
    return loss, clip_low, clip_high


def _token_sum(values: Tensor, mask: Tensor, normaliser: float) -> Tensor:
    return (values * mask).sum() / normaliser


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: LossConfig,
    *,
    normaliser: float | None = None,
    engine_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Scalar loss and `update/*` metrics (detached 0-d tensors on the loss's device, so a
    micro-batch loop sums them without reading back) for one micro-batch; all tensors `[M, T]`.

    `config` holds the `update` section's loss options (clip band, TIS, KL, entropy:
    `LossConfig`). `advantages` are per token (see
    `advantages.token_advantages`); `normaliser` defaults to this micro-batch's valid-token
    count; pass the mini-batch's for gradient accumulation. `engine_logp` None skips TIS;
    `ref_logp` None skips the KL; `entropy` (from `token_entropy`) is logged and, with
    `config.entropy_coef` > 0, rewarded.
    """
    mask = response_mask.to(logp.dtype)
    norm = float(mask.sum().clamp(min=1)) if normaliser is None else float(normaliser)
    if norm <= 0:
        raise ValueError(f"normaliser must be a positive token count, got {normaliser}.")
    c = config
    pg, clip_low, clip_high = clipped_policy_objective(
        logp, old_logp, advantages, c.clip_eps_low, c.clip_eps_high
    )
    metrics: dict[str, Tensor] = {
        "update/clip_frac_low": _token_sum(clip_low.to(mask.dtype), mask, norm).detach(),
        "update/clip_frac_high": _token_sum(clip_high.to(mask.dtype), mask, norm).detach(),
    }
    if engine_logp is not None:
        weights, acted = importance_weights(old_logp, engine_logp, c.tis_mode, c.tis_cap, c.tis_min)
        pg = pg * weights
        metrics["update/tis_weight_mean"] = _token_sum(weights, mask, norm).detach()
        metrics["update/tis_clip_frac"] = _token_sum(acted.to(mask.dtype), mask, norm).detach()
    loss = _token_sum(pg, mask, norm)
    metrics["update/pg_loss"] = loss.detach()
    if ref_logp is not None:
        per_token = kl_penalty(logp, ref_logp, c.kl_estimator, c.kl_input_clamp,
                               c.kl_output_clamp)
        kl = _token_sum(per_token, mask, norm)
        loss = loss + c.kl_coef * kl
        metrics["update/kl"] = kl.detach()
    if entropy is not None:
        mean_entropy = _token_sum(entropy, mask, norm)
        loss = loss - c.entropy_coef * mean_entropy
        metrics["update/entropy"] = mean_entropy.detach()
    metrics["update/loss"] = loss.detach()
    return loss, metrics
