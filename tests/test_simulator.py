"""The token-level simulator (BroRL §4.1): its pieces against slow versions, and the paper's claims."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from brorl.params import SimulateParams
from brorl.theory.sampling import (
    Scratch,
    draw_by_rejection,
    draw_from_cdf,
    draw_tokens,
    segment_sums,
)
from brorl.theory.simulator import (
    SimConfig,
    SimulationResult,
    _row_bytes,
    seed_batches,
    simulate,
    surrogate_grad,
)


def _config(**changes) -> SimConfig:
    """The schema's simulator settings (the paper's, BroRL §4.1) with `changes`."""
    return replace(SimConfig.from_params(SimulateParams()), **changes)


SMALL = _config(vocab_size=8000, num_correct=600, steps=300, log_every=50)


@pytest.mark.parametrize("lumped", [False, True])
def test_initial_q_pos_matches_the_seeded_closed_form(lumped):
    # Our arithmetic from BroRL §4.1's seeding (the paper states no value): Q_pos(0) =
    # 10000 e^3 / (10000 e^3 + 117999 + e^5) = 0.6296 at the paper's size.
    from brorl.theory.simulator import _Columns, _Recorder

    cfg = _config()
    cols = _Columns(cfg, 1, lumped, torch.float64)
    rec = _Recorder(1, cfg)
    rec.policy(0, cols.policy()[0], cols)
    expected = 10000 * math.exp(3) / (10000 * math.exp(3) + 117_999 + math.exp(5))
    assert rec.rows["q_pos"][0].item() == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.6296, abs=5e-5)


@pytest.mark.parametrize("rollouts", [7, 400])  # few draws, and more draws than tokens
def test_surrogate_grad_equals_autograd_of_the_linear_surrogate(rollouts):
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 500, generator=gen, dtype=torch.float64)
    rewards = torch.where(torch.rand(3, 500, generator=gen) < 0.3, 1.0, -1.0).double()
    draws = torch.multinomial(torch.softmax(z, -1), rollouts, replacement=True, generator=gen)
    tau = 0.7
    zz = z.clone().requires_grad_(True)
    p = torch.softmax(zz / tau, -1)
    r_draw = rewards.gather(1, draws)  # R_j of each draw; the baseline is their mean
    loss = -((r_draw - r_draw.mean(-1, keepdim=True)) * p.gather(1, draws)).sum() / rollouts
    loss.backward()
    grad = surrogate_grad(torch.softmax(z / tau, -1), draws, rewards, tau)
    assert torch.allclose(grad, zz.grad, atol=1e-14)


@pytest.mark.parametrize("rollouts", [100_000, 1_000])  # guide table; binary search (N < V/8)
def test_draw_tokens_follows_the_distribution_and_never_draws_zero_probability_tokens(rollouts):
    vocab = 5 if rollouts > 1000 else 10_000
    p = torch.zeros(2, vocab)
    p[0, :5] = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    p[1, 4] = 1.0
    gens = [np.random.default_rng(i) for i in range(2)]
    draws = draw_tokens(p, rollouts, gens)
    freq = torch.zeros(2, vocab).scatter_add_(1, draws, torch.ones(2, rollouts)) / rollouts
    # binomial std of a frequency at p=0.5 is 0.5/sqrt(draws); allow 4 std
    assert torch.allclose(freq, p, atol=4 * 0.5 / rollouts ** 0.5)
    assert freq[0, 1] == 0 and freq[0, 4] == 0 and freq[0, 5:].sum() == 0


def test_draw_tokens_handles_a_peaked_distribution_that_needs_the_search_fallback():
    # Many tiny tokens packed into one guide slice force walks longer than the 3 fast steps.
    p = torch.cat([torch.full((1, 999), 1e-6), torch.ones(1, 1)], -1)
    p = p / p.sum()
    gen = np.random.default_rng(1)
    draws = draw_tokens(p, 200_000, [gen])
    tiny_share = (draws < 999).double().mean().item()
    expected = (999e-6 / (1 + 999e-6))  # ~1e-3; std over 2e5 draws ~7e-5
    assert tiny_share == pytest.approx(expected, abs=4e-4)


def test_a_seed_gives_the_same_curves_alone_or_in_a_batch():
    cfg = _config(vocab_size=2000, num_correct=150, steps=40, log_every=10)
    batch = simulate(cfg, 64, [0, 1, 2])
    alone = SimulationResult.concat([simulate(cfg, 64, [s]) for s in (0, 1, 2)])
    for name, curve in batch.curves.items():
        assert torch.allclose(curve, alone.curves[name], equal_nan=True), name


@pytest.mark.parametrize("lumped", [False, True])
def test_seeds_in_cache_sized_batches_give_the_curves_of_one_batch(lumped):
    cfg = _config(vocab_size=2000, num_correct=150, steps=30, log_every=10)
    seeds = [4, 0, 3, 1, 2]
    per_seed = _row_bytes(cfg, 64, lumped, torch.float32)
    assert seed_batches(cfg, 64, seeds, lumped, budget=3 * per_seed) == [[4, 0, 3], [1, 2]]
    one = simulate(cfg, 64, seeds, lumped=lumped, budget=10 * per_seed)
    split = simulate(cfg, 64, seeds, lumped=lumped, budget=2 * per_seed)  # [4, 0] [3, 1] [2]
    assert split.seeds == one.seeds == tuple(seeds)
    for name, curve in one.curves.items():
        assert torch.equal(curve.nan_to_num(), split.curves[name].nan_to_num()), name


def test_seed_batches_are_the_fewest_that_fit_and_as_even_as_possible():
    cfg = _config()
    per_seed = _row_bytes(cfg, 512, False, torch.float32)
    assert per_seed > 4_000_000  # the paper's V: about 4.6 MB a seed at N = 512
    seeds = list(range(8))
    assert seed_batches(cfg, 512, seeds, False) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # 24 MiB
    assert seed_batches(cfg, 512, seeds, False, budget=8 * per_seed) == [seeds]
    assert [len(b) for b in seed_batches(cfg, 512, seeds, False, budget=3 * per_seed)] == [3, 3, 2]
    assert seed_batches(cfg, 512, seeds, False, budget=1) == [[s] for s in seeds]
    assert seed_batches(cfg, 16, seeds, True) == [seeds]  # lumped: few columns


def test_logged_steps_and_step_zero_shows_no_change_and_no_theorem_terms():
    cfg = _config(vocab_size=1000, num_correct=100, steps=20, log_every=5)
    result = simulate(cfg, 16, [0])
    assert result.steps.tolist() == [0, 5, 10, 15, 20]
    assert result.curves["pct_improved"][0, 0] == 0
    assert result.curves["worst_drop"][0, 0] == 0
    assert torch.isnan(result.curves["term_unsampled"][0, 0])
    assert not torch.isnan(result.curves["term_unsampled"][0, 1:]).any()


@pytest.fixture(scope="module")
def sweep():
    return {n: simulate(SMALL, n, [0, 1, 2]) for n in (4, 16, 3200)}


def test_final_correct_mass_rises_with_n(sweep):
    finals = [sweep[n].final("q_pos").mean().item() for n in (4, 16, 3200)]
    assert finals[0] < finals[1] < finals[2]


def test_share_of_correct_tokens_improved_rises_with_n(sweep):
    shares = [sweep[n].final("pct_improved").mean().item() for n in (4, 16, 3200)]
    assert shares[0] < shares[1] <= shares[2]
    assert shares[0] < 60  # small N leaves many correct tokens worse off than at step 0


def test_no_correct_token_loses_probability_at_the_largest_n(sweep):
    # N = 3200 draws over V = 8,000 is the paper's N/V = 51,200/128,000 = 0.4.
    assert (sweep[3200].final("worst_drop") > 0).all()
    assert (sweep[3200].final("pct_improved") == 100).all()
    assert (sweep[4].final("worst_drop") < 0).all()  # knowledge shrinkage at small N


def _expanded(cols, p, draws):
    """The dense policy `[S, V]` a `_Columns` state stands for: each token column, then each
    bulk's members; with the correct mask and the draws as dense token ids."""
    rows = []
    for r in range(p.shape[0]):
        w = cols.weights[r].long()
        tokens = (w == 1).nonzero().squeeze(1)
        where = torch.full((cols.width,), -1, dtype=torch.long)
        where[tokens] = torch.arange(len(tokens))
        bulk = torch.arange(cols.width)[cols.BULK]
        members = bulk.repeat_interleave(w[cols.BULK])
        order = torch.cat([tokens, members])
        rows.append((p[r, order], cols.correct[r, order], where[draws[r]]))
    dense_p, correct, dense_draws = (torch.stack(t) for t in zip(*rows))
    assert (dense_draws >= 0).all()  # every draw landed in a token column
    return dense_p, correct, dense_draws


@pytest.mark.parametrize("lumped", [False, True])
def test_logged_metrics_equal_the_dense_mass_balance_reference(lumped):
    from brorl.theory.mass_balance import mass_balance
    from brorl.theory.simulator import METRICS, _Columns, _Recorder

    cfg = _config(vocab_size=500, num_correct=60, reward_correct=1.0, reward_wrong=-0.5, lr=0.01)
    gens = [np.random.default_rng(s) for s in range(3)]
    cols = _Columns(cfg, 3, lumped, torch.float64)
    for _ in range(3):  # a few updates, so columns differ from their bulk and from step 0
        if lumped:
            cols.reserve(40)
        p, cdf = cols.policy()
        draws = draw_from_cdf(cdf, cols.width, 40, gens, cols.scratch)  # 40 draws of 500: repeats
        draws = cols.split(draws, p, gens) if lumped else draws
        surrogate_grad(p, draws, cols.rewards, 1.0, out=cols.grad)
        cols.update()
    if lumped:
        cols.reserve(40)
    p, cdf = cols.policy()
    draws = draw_from_cdf(cdf, cols.width, 40, gens, cols.scratch)
    draws = cols.split(draws, p, gens) if lumped else draws
    assert torch.equal(cols.weights.sum(-1), torch.full((3,), 500.0, dtype=torch.float64))
    assert bool((cols.weights[:, cols.BULK] > 1).all()) == lumped
    rec = _Recorder(3, cfg)
    rec.policy(1, p, cols)
    rec.theorem(p, draws, cols)
    dense_p, correct, dense_draws = _expanded(cols, p, draws)
    assert torch.allclose(dense_p.sum(-1), torch.ones(3, dtype=torch.float64), atol=1e-12)
    dense = mass_balance(dense_p, correct, dense_draws, 1.0, -0.5, 0.01)
    assert torch.allclose(rec.rows["q_pos"][0], dense.q_pos, rtol=1e-12)
    for name in METRICS[3:]:
        assert torch.allclose(rec.rows[name][0], getattr(dense, name), rtol=1e-9, atol=1e-20), name


def test_lumped_and_dense_runs_agree_within_their_seed_spread():
    # Same dynamics, different bookkeeping (and so different random streams): across 16 seeds
    # the two means must agree within 4 standard errors of their difference.
    cfg = _config(vocab_size=4000, num_correct=300, steps=200, log_every=50)
    seeds = range(16)
    lumped, dense = (simulate(cfg, 8, seeds, lumped=m) for m in (True, False))
    for metric in ("q_pos", "pct_improved", "worst_drop"):
        a, b = lumped.final(metric), dense.final(metric)
        se = (a.var() / len(a) + b.var() / len(b)).sqrt().item()
        assert abs(a.mean().item() - b.mean().item()) <= 4 * se + 1e-12, metric
    assert (lumped.curves["pct_improved"][:, -1] > 0).all()  # something happened


@pytest.mark.parametrize("vocab", [1, 255, 256, 1000, 4097])
def test_blocked_row_cumsum_equals_plain_cumsum(vocab):
    from brorl.theory.sampling import row_cumsum

    x = torch.rand(3, vocab, generator=torch.Generator().manual_seed(vocab))
    assert torch.allclose(row_cumsum(x), x.double().cumsum(-1), rtol=1e-13, atol=0)


def test_the_dense_run_is_the_formulas_as_written_in_float64_draw_for_draw():
    # The speed benchmark's plain numpy reference (Generator.choice, the gradient and AdamW as the
    # formulas read) consumes the same uniforms as the simulator's binary-search draws (N < V/8),
    # so with float64 probabilities the two runs agree to rounding, not just in distribution
    # (a dense run draws by rejection unless told otherwise: inverse CDF here).
    from benchmarks.simulate_speed import numpy_simulate

    cfg = _config(vocab_size=3000, num_correct=200, steps=60, log_every=30)
    for seed in (0, 1):
        q_ref, improved_ref = numpy_simulate(cfg, 32, seed)
        run = simulate(cfg, 32, [seed], policy_dtype=torch.float64, lumped=False,
                       rejection=False)
        assert run.final("q_pos").item() == pytest.approx(q_ref, rel=1e-10)
        assert run.final("pct_improved").item() == pytest.approx(improved_ref, abs=1e-9)


@pytest.mark.parametrize("rejection", [False, True])  # total from running sums, or segment sums
def test_float32_policy_sums_to_one_at_the_papers_vocabulary(rejection):
    # torch.softmax in float32 sums 128,000 terms in float32: its p totals 1 - 2.7e-5 here, a
    # shift every correct token shares. The simulator divides by a float64 total instead.
    from brorl.theory.simulator import _Columns

    cols = _Columns(_config(), 2, lumped=False, rejection=rejection)
    cols.logits[:, 4:] += torch.randn(2, cols.width - 4, generator=torch.Generator().manual_seed(0),
                                      dtype=torch.float64) * 1e-3  # distinct logits, as after a step
    p, _ = cols.policy()
    assert p.dtype == torch.float32
    assert torch.allclose(p.double().sum(-1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-6)
    reference = torch.softmax(cols.logits, -1)
    assert torch.allclose(p.double(), reference, rtol=1e-6, atol=0)


def test_update_is_torchs_fused_adamw_step():
    from brorl.theory.simulator import _Columns

    cfg = _config(vocab_size=600, num_correct=50, lr=0.01)
    cols = _Columns(cfg, 2, lumped=False)
    param = torch.nn.Parameter(cols.logits.clone())
    opt = torch.optim.AdamW([param], lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay, fused=True)
    gens = [np.random.default_rng(s) for s in range(2)]
    for _ in range(3):
        p, _ = cols.policy()
        draws = draw_tokens(p, 40, gens)
        surrogate_grad(p, draws, cols.rewards, 1.0, out=cols.grad)
        param.grad = cols.grad.clone()
        cols.update()
        opt.step()
        assert torch.equal(cols.logits, param.detach())


def _uneven_rows() -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Two rows of 4096 columns: an anchor column, two ranges of uneven p, an empty tail; row 1's
    second range has a few tall columns (acceptance below `MIN_ACCEPTANCE`: inverse CDF)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.zeros(2, 4096)
    p[:, 3] = 0.02
    p[:, 4:1004] = torch.rand(2, 1000, generator=gen) * 0.6 + 0.4
    p[:, 1004:4000] = torch.rand(2, 2996, generator=gen) * 0.3 + 0.7
    p[1, 1004:1020] = 2000.0
    return p / p.sum(-1, keepdim=True), [(4, 1004), (1004, 4000), (3, 4)]


def _assert_follows(draws: torch.Tensor, p: torch.Tensor, block: int = 64) -> None:
    """Draw counts per block of columns within 4.5 binomial standard deviations of N p, and the
    sum of squared z-scores within 5 standard deviations of its expectation (blocks with mass)."""
    n = draws.shape[1]
    counts = torch.zeros_like(p, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones(draws.shape, dtype=torch.float64))
    c = counts.view(p.shape[0], -1, block).sum(-1)
    q = p.double().view(p.shape[0], -1, block).sum(-1)
    has = q > 0
    z = (c - n * q)[has] / (n * q * (1 - q))[has].sqrt()
    assert (c[~has] == 0).all()
    assert z.abs().max() < 4.5
    k = int(has.sum())
    assert abs(float((z ** 2).sum()) - k) < 5 * (2 * k) ** 0.5


def test_draw_by_rejection_follows_the_distribution_and_returns_p_at_each_draw():
    p, segments = _uneven_rows()
    gens = [np.random.default_rng(i) for i in range(2)]
    draws = draw_by_rejection(p, segments, 200_000, gens, Scratch())
    assert torch.equal(draws.p, p.gather(1, draws.cols).double())
    _assert_follows(draws.cols, p)
    for row, counts in enumerate(draws.counts):  # grouped by range, also the inverse-CDF row
        assert counts.sum() == 200_000
        bounds = np.cumsum(np.concatenate([[0], counts]))
        for (start, stop), a, b in zip(segments, bounds[:-1], bounds[1:]):
            cols = draws.cols[row, a:b]
            assert bool(((cols >= start) & (cols < stop)).all())


def test_draw_by_rejection_is_exact_when_rounds_fall_short(monkeypatch):
    # With too few proposals every round falls short and later rounds fill the rest.
    import brorl.theory.sampling as sampling

    monkeypatch.setattr(sampling, "MARGIN_SD", -6.0)
    p, segments = _uneven_rows()
    calls = []
    round_ = sampling._rejection_round
    monkeypatch.setattr(sampling, "_rejection_round", lambda *a: calls.append(1) or round_(*a))
    draws = draw_by_rejection(p[:1], segments, 100_000, [np.random.default_rng(5)], Scratch())
    assert len(calls) > len(segments)  # some range took more than one round
    _assert_follows(draws.cols, p[:1])


def test_draw_by_rejection_gives_a_row_the_same_draws_alone_or_in_a_batch():
    p, segments = _uneven_rows()
    batch = draw_by_rejection(p, segments, 5000, [np.random.default_rng(s) for s in (7, 8)],
                              Scratch())
    for row, seed in enumerate((7, 8)):
        alone = draw_by_rejection(p[row:row + 1], segments, 5000, [np.random.default_rng(seed)],
                                  Scratch())
        assert torch.equal(alone.cols[0], batch.cols[row])


def test_segment_sums_equal_float64_sums():
    x = torch.rand(3, 2048, generator=torch.Generator().manual_seed(1))
    segments = [(0, 1), (3, 300), (300, 2047), (256, 512), (1000, 1001)]
    expected = torch.stack([x[:, a:b].double().sum(-1) for a, b in segments], 1)
    assert torch.allclose(segment_sums(x, segments), expected, rtol=1e-6, atol=0)


def test_dense_runs_by_rejection_and_by_inverse_cdf_agree_within_their_seed_spread():
    cfg = _config(vocab_size=3000, num_correct=200, steps=60, log_every=30)
    seeds = list(range(8))
    rejection, inverse = (simulate(cfg, 256, seeds, lumped=False, rejection=r) for r in (True, False))
    for metric in ("q_pos", "pct_improved"):
        a, b = rejection.final(metric), inverse.final(metric)
        spread = 4 * float(torch.cat([a, b]).std()) / len(seeds) ** 0.5 + 1e-9
        assert abs(float(a.mean() - b.mean())) < spread, metric


@pytest.mark.parametrize("rejection", [True, False])
def test_the_draws_weights_give_the_surrogates_gradient(rejection):
    from brorl.theory.simulator import _Columns, grad_from_weights

    cfg = _config(vocab_size=5000, num_correct=400)
    cols = _Columns(cfg, 3, lumped=False, rejection=rejection)
    cols.logits[:, 4:] += torch.randn(3, cols.width - 4, generator=torch.Generator().manual_seed(2),
                                      dtype=torch.float64) * 0.3
    p, cdf = cols.policy()
    draws, drawn_p, weighted = cols.draw(p, cdf, 3000, [np.random.default_rng(s) for s in range(3)])
    assert torch.equal(drawn_p, p.gather(1, draws).double())
    expected = surrogate_grad(p, draws, cols.rewards, 0.7)
    assert torch.allclose(grad_from_weights(p, draws, weighted, 0.7), expected, rtol=1e-12, atol=0)
