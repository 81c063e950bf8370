"""The mass-balance analysis of one RLVR step on a categorical policy (BroRL §2, App. C).

Everything here works on a batch of categorical policies: probabilities `p [..., V]` in float64, a
correct-token mask `correct [..., V]` (or `[V]`, broadcast), and the ids of the N sampled tokens
`sampled [..., N]`, repeats allowed. The token sets A (sampled correct), B (sampled incorrect) and U
(unsampled) are *sets*: a token drawn twice counts once (BroRL App. C.1), while the prefactor eta/N
uses the number of draws N. Notation follows BroRL §2: Q_pos, Q_neg, P_pos, P_neg, A_2, B_2,
U_pos,2, U_neg,2, S_R.

What it deliberately ignores: clipping, KL and multi-token sequences. It is the paper's one-step,
linear-in-p surrogate analysis of a single categorical distribution (BroRL §2), nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MassBalance:
    """BroRL §2 quantities and the Theorem-1 terms for each policy in the batch. Shapes `[...]`."""

    q_pos: Tensor
    """Q_pos: total probability of correct tokens."""
    q_neg: Tensor
    """Q_neg = 1 - Q_pos."""
    p_pos: Tensor
    """P_pos: probability of the sampled correct tokens (set A)."""
    p_neg: Tensor
    """P_neg: probability of the sampled incorrect tokens (set B)."""
    a2: Tensor
    """A_2 = sum_{i in A} p_i^2."""
    b2: Tensor
    """B_2 = sum_{i in B} p_i^2."""
    u_pos2: Tensor
    """U_pos,2 = sum_{i in U, correct} p_i^2."""
    u_neg2: Tensor
    """U_neg,2 = sum_{i in U, incorrect} p_i^2."""
    s_r: Tensor
    """S_R = R_c P_pos + R_w P_neg, the batch "mood"."""
    term_sampled_correct: Tensor
    """(eta/N) (R_c - S_R) Q_neg A_2 >= 0."""
    term_sampled_wrong: Tensor
    """(eta/N) (S_R - R_w) Q_pos B_2 >= 0."""
    term_unsampled: Tensor
    """(eta/N) S_R (Q_pos U_neg,2 - Q_neg U_pos,2), the unsampled coupling, either sign."""

    @property
    def delta_q_pos(self) -> Tensor:
        """Theorem 1: the first-order change of Q_pos, the sum of the three terms."""
        return self.term_sampled_correct + self.term_sampled_wrong + self.term_unsampled


def sampled_mask(sampled: Tensor, vocab_size: int) -> Tensor:
    """Boolean `[..., V]`: which tokens were drawn at least once among `sampled [..., N]`."""
    mask = torch.zeros(*sampled.shape[:-1], vocab_size, dtype=torch.bool, device=sampled.device)
    return mask.scatter_(-1, sampled, True)


def mass_balance(p: Tensor, correct: Tensor, sampled: Tensor, reward_correct: float,
                 reward_wrong: float, lr: float) -> MassBalance:
    """All BroRL §2 quantities and the three Theorem-1 terms (BroRL App. C.1, eq. 1).

    Args:
        p: `[..., V]` probabilities (rows sum to 1).
        correct: `[..., V]` or `[V]` bool, the set P.
        sampled: `[..., N]` int64 token ids of the N draws (repeats allowed).
        reward_correct, reward_wrong: R_c and R_w (the theorem's standard setting is R_c >= 0 >= R_w).
        lr: eta.
    """
    pos = correct.expand_as(p).to(p.dtype)
    drawn = sampled_mask(sampled, p.shape[-1]).to(p.dtype)
    p2 = p * p
    q_pos = (p * pos).sum(-1)
    p_drawn, p2_drawn = p * drawn, p2 * drawn
    p_pos = (p_drawn * pos).sum(-1)
    p_neg = p_drawn.sum(-1) - p_pos
    a2 = (p2_drawn * pos).sum(-1)
    b2 = p2_drawn.sum(-1) - a2
    # U's second moments are the class totals minus the sampled parts (clamped: rounding only).
    sq_pos = (p2 * pos).sum(-1)
    u_pos2 = (sq_pos - a2).clamp_min(0.0)
    u_neg2 = (p2.sum(-1) - sq_pos - b2).clamp_min(0.0)
    return from_moments(q_pos, p_pos, p_neg, a2, b2, u_pos2, u_neg2, reward_correct, reward_wrong,
                        lr, sampled.shape[-1])


def from_moments(q_pos: Tensor, p_pos: Tensor, p_neg: Tensor, a2: Tensor, b2: Tensor,
                 u_pos2: Tensor, u_neg2: Tensor, reward_correct: float, reward_wrong: float,
                 lr: float, rollouts: int) -> MassBalance:
    """Theorem 1 from the partial masses and second moments (BroRL App. C.1, eq. 1), shapes
    `[...]`."""
    q_neg = 1.0 - q_pos
    s_r = reward_correct * p_pos + reward_wrong * p_neg
    scale = lr / rollouts
    return MassBalance(
        q_pos=q_pos, q_neg=q_neg, p_pos=p_pos, p_neg=p_neg, a2=a2, b2=b2,
        u_pos2=u_pos2, u_neg2=u_neg2, s_r=s_r,
        term_sampled_correct=scale * (reward_correct - s_r) * q_neg * a2,
        term_sampled_wrong=scale * (s_r - reward_wrong) * q_pos * b2,
        term_unsampled=scale * s_r * (q_pos * u_neg2 - q_neg * u_pos2),
    )


def token_rewards(correct: Tensor, drawn: Tensor, reward_correct: float, reward_wrong: float) -> Tensor:
    """R_i per token `[..., V]`: R_c or R_w for drawn tokens by class, 0 for unsampled ones."""
    r = torch.where(correct, reward_correct, reward_wrong).to(torch.float64)
    return torch.where(drawn, r, torch.zeros((), dtype=r.dtype))


def logit_update(p: Tensor, correct: Tensor, sampled: Tensor, reward_correct: float,
                 reward_wrong: float, lr: float) -> Tensor:
    """The one-step logit update dz_j = (eta/N) p_j (R_j - S_R) (BroRL §2, App. C.1), shape
    `[..., V]`.

    This is gradient descent with step eta on L = -(1/N) sum_{i in A u B u U} R_i p_i.
    """
    correct = correct.expand_as(p)
    drawn = sampled_mask(sampled, p.shape[-1])
    r = token_rewards(correct, drawn, reward_correct, reward_wrong)
    s_r = (r * p).sum(-1, keepdim=True)
    return (lr / sampled.shape[-1]) * p * (r - s_r)


def exact_delta_q_pos(logits: Tensor, correct: Tensor, dz: Tensor) -> Tensor:
    """Exact change of Q_pos when logits move by `dz`, computed without cancellation.

    p'_i - p_i = p_i * expm1(dz_i - dlogZ), with dlogZ = log1p(sum_j p_j expm1(dz_j)), so changes
    far below float64's resolution of Q_pos itself are still exact to relative precision.
    """
    p = torch.softmax(logits, dim=-1)
    dlogz = torch.log1p((p * torch.expm1(dz)).sum(-1, keepdim=True))
    change = p * torch.expm1(dz - dlogz)
    return (change * correct.expand_as(p)).sum(-1)


def expected_unsampled_second_moment(p: Tensor, rollouts: int | Tensor) -> Tensor:
    """Lemma 2 per token, E[p^2 1{X=0}] = p^2 (1-p)^N, for X ~ Bin(N, p). Same shape as `p`.

    Summed over tokens it is Corollary 3's E[U_2] = sum_i p_i^2 (1-p_i)^N, decreasing in N.
    """
    return p * p * torch.exp(rollouts * torch.log1p(-p))
