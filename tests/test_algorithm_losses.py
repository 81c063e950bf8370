"""Policy loss: PPO clipping by hand, micro-batch invariance, KL estimators, TIS, entropy."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from brorl.algorithm.losses import (
    LossConfig,
    importance_weights,
    kl_penalty,
    policy_loss,
    token_entropy,
)
from tests.devices import DEVICES

LN2 = math.log(2.0)
LOSS = LossConfig(clip_eps_low=0.2, clip_eps_high=0.28, tis_mode="truncate", tis_cap=5.0,
                  tis_min=0.5, kl_coef=0.0, kl_estimator="k2", kl_input_clamp=20.0,
                  kl_output_clamp=10.0, entropy_coef=0.0)
"""The options the hand computations use: the paper's clip band (0.2, 0.28) and TIS cap 5 (the
ProRLv2 blog post; NeMo-RL's ProRLv2 example config), the KL's clamps 20 and 10, no KL penalty, no
entropy bonus."""
KL = replace(LOSS, kl_coef=0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_ppo_loss_by_hand_with_clipping_on_each_side(device):
    # tokens: (A=+1, r=1.5) clipped high; (A=-1, r=0.5) clipped low; (A=+2, r=1); one pad token
    ratio = torch.tensor([[1.5, 0.5, 1.0, 9.0]], device=device)
    adv = torch.tensor([[1.0, -1.0, 2.0, 100.0]], device=device)
    mask = torch.tensor([[1, 1, 1, 0]], device=device)
    old = torch.zeros(1, 4, device=device)
    logp = ratio.log().requires_grad_()
    loss, m = policy_loss(logp, old, adv, mask, LOSS)
    # token 1: max(-1.5, -1.28) = -1.28; token 2: max(0.5, 0.8) = 0.8; token 3: -2
    # sum -2.48 over 3 valid tokens = -0.826667
    assert loss.item() == pytest.approx(-2.48 / 3, abs=1e-6)
    assert m["update/clip_frac_high"] == pytest.approx(1 / 3)
    assert m["update/clip_frac_low"] == pytest.approx(1 / 3)
    loss.backward()
    # clipped tokens and the pad get no gradient; token 3: d(-A r)/dlogp = -A r = -2, / 3
    torch.testing.assert_close(logp.grad.cpu(), torch.tensor([[0.0, 0.0, -2 / 3, 0.0]]))


def test_ratio_below_low_bound_with_positive_advantage_is_not_clipped():
    # A > 0, r = 0.5 < 1 - eps_low: min(r A, clip(r) A) = r A, gradient flows
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, m = policy_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), LOSS)
    assert loss.item() == pytest.approx(-0.5)
    assert m["update/clip_frac_low"] == 0.0 and m["update/clip_frac_high"] == 0.0
    loss.backward()
    assert logp.grad.item() == pytest.approx(-0.5)  # d(-A e^logp) = -0.5


def _random_batch(seed, device="cpu"):
    """Drawn on the CPU (the same values on every device), then moved to `device`."""
    gen = torch.Generator().manual_seed(seed)
    m, t = 6, 5
    old = -torch.rand(m, t, generator=gen) * 2
    batch = {
        "features": torch.randn(m, t, 3, generator=gen),
        "old_logp": old,
        "advantages": torch.randn(m, t, generator=gen),
        "response_mask": (torch.rand(m, t, generator=gen) > 0.3).int(),
        "engine_logp": old + 0.5 * torch.randn(m, t, generator=gen),
        "ref_logp": old + 0.2 * torch.randn(m, t, generator=gen),
    }
    return {k: v.to(device) for k, v in batch.items()}


def _accumulated_grad(batch, splits, normaliser=None):
    """Gradient accumulation on a shared weight w [3]: logp = old + 0.3 * features @ w."""
    w = torch.tensor([0.5, -1.0, 2.0], device=batch["features"].device, requires_grad=True)
    for lo, hi in splits:
        part = {k: v[lo:hi] for k, v in batch.items() if k != "features"}
        logp = part["old_logp"] + 0.3 * batch["features"][lo:hi] @ w
        loss, _ = policy_loss(logp, **part, config=KL, normaliser=normaliser)
        loss.backward()
    return w.grad


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_invariant_to_micro_batch_split_with_global_normaliser(device):
    batch = _random_batch(0, device)
    total = float(batch["response_mask"].sum())
    full = _accumulated_grad(batch, [(0, 6)], total)
    assert full.abs().sum() > 0
    for splits in ([(0, 2), (2, 6)], [(0, 1), (1, 4), (4, 6)]):
        torch.testing.assert_close(_accumulated_grad(batch, splits, total), full)
    # per-micro-batch normalisers weight tokens unequally: the accumulated grad differs
    assert not torch.allclose(_accumulated_grad(batch, [(0, 1), (1, 6)]), full)


@pytest.mark.parametrize("device", DEVICES)
def test_metrics_add_up_over_micro_batches(device):
    batch = _random_batch(1, device)
    batch["logp"] = batch.pop("old_logp") + 0.1 * batch["features"].sum(-1)
    batch["old_logp"] = batch["engine_logp"] - 0.05
    del batch["features"]
    total = float(batch["response_mask"].sum())
    _, full = policy_loss(**batch, config=KL, normaliser=total)
    parts = [policy_loss(**{k: v[lo:hi] for k, v in batch.items()}, config=KL, normaliser=total)[1]
             for lo, hi in [(0, 3), (3, 6)]]
    for key, value in full.items():  # device tensors, summed without a read-back
        assert isinstance(value, torch.Tensor) and value.device == batch["logp"].device, key
        assert float(sum(p[key] for p in parts)) == pytest.approx(float(value), abs=1e-6), key


def _loop_loss(b, eps_low, eps_high, cap, kl_coef):
    """Slow reference: plain Python over valid tokens, truncated TIS and clamped k3 KL."""
    total, count, clip_low, clip_high = 0.0, 0, 0, 0
    keys = ("logp", "old_logp", "advantages", "response_mask", "engine_logp", "ref_logp")
    rows = zip(*(b[k].tolist() for k in keys))
    for row in rows:
        for lp, old, a, m, eng, ref in zip(*row):
            if not m:
                continue
            r = math.exp(lp - old)
            pg = max(-a * r, -a * min(max(r, 1 - eps_low), 1 + eps_high))
            x = max(-20.0, min(20.0, lp - ref))
            kl = min(10.0, math.exp(-x) - 1 + x)
            total += pg * min(math.exp(old - eng), cap) + kl_coef * kl
            count += 1
            clip_low += a < 0 and r < 1 - eps_low
            clip_high += a > 0 and r > 1 + eps_high
    return total / count, clip_low / count, clip_high / count


@pytest.mark.parametrize("device", DEVICES)
def test_vectorised_loss_equals_loop_version(device):
    b = _random_batch(4, device)
    b["logp"] = b["old_logp"] + 0.8 * b.pop("features")[..., 0]  # ratios well outside the clip band
    loss, m = policy_loss(**b, config=replace(LOSS, tis_cap=1.5, kl_coef=0.3, kl_estimator="k3"))
    want, low, high = _loop_loss(b, 0.2, 0.28, 1.5, 0.3)
    assert low > 0 and high > 0  # both clip sides exercised
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert m["update/clip_frac_low"] == pytest.approx(low)
    assert m["update/clip_frac_high"] == pytest.approx(high)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # log(pi/ref) = ln 2 = 0.693147
    assert kl_penalty(logp, ref, "k1", 20.0, 10.0).item() == pytest.approx(LN2)
    assert kl_penalty(logp, ref, "k2", 20.0, 10.0).item() == pytest.approx(0.5 * LN2**2)  # 0.240227
    assert kl_penalty(logp, ref, "k3", 20.0, 10.0).item() == pytest.approx(0.5 - 1 + LN2)  # ref/pi = 0.5


def test_kl_clamps_input_then_output():
    logp, ref = torch.tensor([0.0, -30.0]), torch.tensor([-30.0, 0.0])  # log ratios +30, -30
    # k1: +-30 -> input clamp +-20 -> output clamp +-10
    assert kl_penalty(logp, ref, "k1", 20.0, 10.0).tolist() == [10.0, -10.0]
    # k2 with the ProRLv2 blog post's input clamp 10 and no output clamp: 0.5 * 10^2 = 50
    assert kl_penalty(logp, ref, "k2", input_clamp=10.0, output_clamp=None).tolist() == [50.0, 50.0]
    # k3 at +20: e^-20 - 1 + 20 = 19.0 -> 10; at -20: e^20 - 1 - 20 is huge, clamped to 10
    assert kl_penalty(logp, ref, "k3", 20.0, 10.0).tolist() == [10.0, 10.0]


@pytest.mark.parametrize("device", DEVICES)
def test_truncated_importance_sampling_caps_the_engine_ratio(device):
    old = torch.log(torch.tensor([8.0, 0.25, 2.0], device=device))
    engine = torch.zeros(3, device=device)  # ratios pi_old / pi_engine = 8, 0.25, 2
    w, acted = importance_weights(old.requires_grad_(), engine, "truncate", cap=5.0, tis_min=0.5)
    torch.testing.assert_close(w.cpu(), torch.tensor([5.0, 0.25, 2.0]))
    assert acted.tolist() == [True, False, False] and not w.requires_grad
    w, acted = importance_weights(old, engine, "icepop", cap=5.0, tis_min=0.5)
    torch.testing.assert_close(w.cpu(), torch.tensor([0.0, 0.0, 2.0]))
    assert acted.tolist() == [True, True, False]


@pytest.mark.parametrize("device", DEVICES)
def test_tis_weight_scales_the_policy_gradient(device):
    logp = torch.zeros(1, 1, device=device, requires_grad=True)
    engine = torch.full((1, 1), -math.log(8.0), device=device)  # ratio 8, capped at 5
    ones = torch.ones(1, 1, device=device)
    loss, m = policy_loss(logp, torch.zeros(1, 1, device=device), ones, ones, LOSS,
                          engine_logp=engine)
    assert loss.item() == pytest.approx(-5.0)  # -A r w = -1 * 1 * 5
    loss.backward()
    assert logp.grad.item() == pytest.approx(-5.0)
    assert m["update/tis_weight_mean"] == pytest.approx(5.0) and m["update/tis_clip_frac"] == 1.0


def test_token_entropy_matches_brute_force():
    probs = torch.tensor([0.5, 0.25, 0.25])
    assert token_entropy(probs.log()).item() == pytest.approx(1.5 * LN2)  # 0.5 ln2 + 2 * 0.25 ln4
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(3))
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(token_entropy(logits), -(p * p.log()).sum(-1))


def test_entropy_is_logged_and_only_rewarded_with_a_coefficient():
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))
    entropy = torch.tensor([[1.0, 3.0]])
    loss, m = policy_loss(*args, LOSS, entropy=entropy)
    assert loss.item() == 0.0 and m["update/entropy"] == 2.0
    loss, _ = policy_loss(*args, replace(LOSS, entropy_coef=0.1), entropy=entropy)
    assert loss.item() == pytest.approx(-0.2)


def test_unknown_variants_and_bad_normaliser_name_the_fix():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="'k1', 'k2' or 'k3'"):
        kl_penalty(x, x, "k4", 20.0, 10.0)
    with pytest.raises(ValueError, match="'truncate'"):
        importance_weights(x, x, "clip", 5.0, 0.5)
    with pytest.raises(ValueError, match="normaliser"):
        policy_loss(x, x, x, torch.ones(1, 1), LOSS, normaliser=0)
