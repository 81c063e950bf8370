"""Theorem 1 and Lemma 2 (BroRL §2, App. C) against exact updates and Monte Carlo."""

from __future__ import annotations

import math

import pytest
import torch

from brorl.theory.mass_balance import (
    exact_delta_q_pos,
    expected_unsampled_second_moment,
    logit_update,
    mass_balance,
    sampled_mask,
)

F64 = torch.float64


def random_instances(count: int, vocab: int, rollouts: int, seed: int):
    """`count` random policies (logit spread 2), correct masks with 5-50% correct, and draws."""
    gen = torch.Generator().manual_seed(seed)
    z = 2.0 * torch.randn(count, vocab, generator=gen, dtype=F64)
    share = 0.05 + 0.45 * torch.rand(count, 1, generator=gen, dtype=F64)
    correct = torch.rand(count, vocab, generator=gen) < share
    correct[:, 0], correct[:, 1] = True, False  # both classes present in every instance
    p = torch.softmax(z, -1)
    sampled = torch.multinomial(p, rollouts, replacement=True, generator=gen)
    return z, p, correct, sampled


@pytest.mark.parametrize("vocab,rollouts,rewards", [(50, 8, (1.0, -1.0)), (2000, 8, (1.0, -1.0)),
                                                    (300, 64, (1.0, 0.0)), (20, 4, (0.5, -2.0))])
def test_theorem1_matches_exact_update_on_random_instances(vocab, rollouts, rewards):
    # 200 instances per case; eta at most 1e-4 keeps the second-order remainder ~eta relative.
    z, p, correct, sampled = random_instances(200, vocab, rollouts, seed=vocab + rollouts)
    r_c, r_w = rewards
    for lr in (1e-4, 1e-6):
        mb = mass_balance(p, correct, sampled, r_c, r_w, lr)
        dz = logit_update(p, correct, sampled, r_c, r_w, lr)
        exact = exact_delta_q_pos(z, correct, dz)
        # Relative to the terms' total size: where the terms cancel, ΔQ_pos itself is ~0 and a
        # plain relative error only measures the O(eta^2) remainder against nothing.
        scale = (mb.term_sampled_correct.abs() + mb.term_sampled_wrong.abs()
                 + mb.term_unsampled.abs()).clamp_min(1e-300)
        rel = (mb.delta_q_pos - exact).abs() / scale
        assert rel.max() <= 1e-4, f"max relative error {rel.max():.2e} at lr={lr}"
        assert rel.median() <= 1e-5


def test_sampled_terms_are_never_negative_and_s_r_is_within_rewards():
    for vocab, rollouts in ((30, 4), (500, 16), (2000, 512)):
        _, p, correct, sampled = random_instances(200, vocab, rollouts, seed=rollouts)
        mb = mass_balance(p, correct, sampled, 1.0, -1.0, 1e-3)
        assert (mb.term_sampled_correct >= 0).all()
        assert (mb.term_sampled_wrong >= 0).all()
        assert ((mb.s_r >= -1.0) & (mb.s_r <= 1.0)).all()
        # Partial masses add up: Q_pos = P_pos + unsampled correct mass (BroRL §2).
        drawn = sampled_mask(sampled, vocab)
        assert torch.allclose(mb.q_pos, mb.p_pos + (p * (correct & ~drawn)).sum(-1))


def test_quantities_by_hand_on_a_four_token_policy():
    # p = [0.4, 0.3, 0.2, 0.1]; correct = {0, 2}; draws = 0, 0, 1 (N = 3); R_c = 1, R_w = -1.
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=F64)
    correct = torch.tensor([True, False, True, False])
    mb = mass_balance(p, correct, torch.tensor([[0, 0, 1]]), 1.0, -1.0, lr=0.3)
    # A = {0}, B = {1}, U = {2, 3}: P_pos 0.4, P_neg 0.3, Q_pos 0.6, Q_neg 0.4
    # A_2 = 0.16, B_2 = 0.09, U_pos,2 = 0.04, U_neg,2 = 0.01, S_R = 0.4 - 0.3 = 0.1
    assert mb.q_pos.item() == pytest.approx(0.6)
    assert mb.s_r.item() == pytest.approx(0.1)
    assert (mb.a2.item(), mb.b2.item()) == pytest.approx((0.16, 0.09))
    assert (mb.u_pos2.item(), mb.u_neg2.item()) == pytest.approx((0.04, 0.01))
    # eta/N = 0.1; terms: 0.1*(1-0.1)*0.4*0.16 = 0.00576; 0.1*(0.1+1)*0.6*0.09 = 0.00594;
    # 0.1*0.1*(0.6*0.01 - 0.4*0.04) = -0.0001
    assert mb.term_sampled_correct.item() == pytest.approx(0.00576)
    assert mb.term_sampled_wrong.item() == pytest.approx(0.00594)
    assert mb.term_unsampled.item() == pytest.approx(-0.0001)
    # dz_j = (eta/N) p_j (R_j - S_R): [0.1*0.4*0.9, 0.1*0.3*(-1.1), 0.1*0.2*(-0.1), 0.1*0.1*(-0.1)]
    dz = logit_update(p, correct, torch.tensor([[0, 0, 1]]), 1.0, -1.0, lr=0.3)
    assert dz[0].tolist() == pytest.approx([0.036, -0.033, -0.002, -0.001])


def test_logit_update_is_gradient_descent_on_the_linear_surrogate():
    # L = -(1/N) sum_{i in A u B u U} R_i p_i with R_i = 0 on U; dz must equal -eta dL/dz.
    z, p, correct, sampled = random_instances(5, 40, 6, seed=3)
    drawn = sampled_mask(sampled, 40)
    r = torch.where(drawn, torch.where(correct, 1.0, -1.0), 0.0).to(F64)
    zz = z.clone().requires_grad_(True)
    loss = -(r * torch.softmax(zz, -1)).sum() / 6
    loss.backward()
    dz = logit_update(p, correct, sampled, 1.0, -1.0, lr=0.01)
    assert torch.allclose(dz, -0.01 * zz.grad, atol=1e-15)


def _coupling(q_pos_probs, q_neg_probs, sampled_ids, s_r_sign_positive):
    """A policy where the unsampled coupling's sign is set by which unsampled pool is concentrated."""
    p = torch.tensor([q_pos_probs + q_neg_probs], dtype=F64)
    correct = torch.tensor([True] * len(q_pos_probs) + [False] * len(q_neg_probs))
    return mass_balance(p, correct, torch.tensor([sampled_ids]), 1.0, -1.0, 1e-3)


def test_unsampled_coupling_hurts_when_unsampled_correct_mass_is_concentrated():
    # Reward-positive batch (S_R > 0): a sampled correct token of 0.3; the unsampled correct mass
    # sits on one token of 0.5 (concentrated), the unsampled incorrect mass is spread thinly.
    mb = _coupling([0.3, 0.5], [0.02] * 10, [0], True)
    assert mb.s_r.item() > 0
    assert mb.term_unsampled.item() < 0


def test_unsampled_coupling_helps_when_unsampled_incorrect_mass_is_concentrated():
    # Same S_R > 0 batch, but now the big unsampled token is incorrect: the coupling is positive.
    mb = _coupling([0.3] + [0.02] * 10, [0.5], [0], True)
    assert mb.s_r.item() > 0
    assert mb.term_unsampled.item() > 0


def test_unsampled_coupling_flips_sign_with_a_reward_negative_batch():
    # S_R < 0 (a sampled incorrect token of 0.3): concentrated unsampled correct mass now helps.
    mb = _coupling([0.5] + [0.02] * 10, [0.3], [11], False)
    assert mb.s_r.item() < 0
    assert mb.term_unsampled.item() > 0


def test_lemma2_closed_form_matches_monte_carlo_within_three_standard_errors():
    gen = torch.Generator().manual_seed(7)
    trials = 100_000
    for prob, rollouts in ((0.05, 20), (0.2, 3), (0.01, 100)):
        # X ~ Bin(N, p) as the number of N uniforms below p; S = p^2 1{X = 0}.
        x = (torch.rand(trials, rollouts, generator=gen) < prob).sum(-1)
        samples = prob ** 2 * (x == 0).to(F64)
        closed = expected_unsampled_second_moment(torch.tensor(prob, dtype=F64), rollouts).item()
        assert closed == pytest.approx(prob ** 2 * (1 - prob) ** rollouts)
        se = samples.std().item() / math.sqrt(trials)
        assert abs(samples.mean().item() - closed) <= 3 * se


def test_corollary3_expected_unsampled_moment_decreases_in_n():
    p = torch.softmax(torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=F64), -1)
    totals = [expected_unsampled_second_moment(p, n).sum().item() for n in (1, 4, 16, 512, 51200)]
    assert all(a > b for a, b in zip(totals, totals[1:]))
