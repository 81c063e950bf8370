"""Wall time of the paper's simulator sweep in brorl, against a plain numpy version, in one run.

brorl runs every N with all seeds at once (rows of one tensor in cache-sized batches,
closed-form gradient; at N = 512 and 51,200 rejection draws within each class of tokens, at
small N the tokens never drawn share one bulk column per class). The numpy reference below is
the simulator written the obvious way: one N and one seed at a time, `Generator.choice` for the
draws, the surrogate's gradient and AdamW as the formulas read. Both run here, one N at a time,
brorl's seeds then numpy's one seed; the script prints the sweep's wall time (brorl's seconds
summed over N), the speed-up per run, and checks that numpy's final Q_pos and % improved lie
within brorl's seed spread for every N.

Run: `python benchmarks/simulate_speed.py` (the full paper sweep, 8 seeds; about half a minute) or with
`--steps 200 --seeds 4` for a quick look.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # brorl and benchmarks.record
from benchmarks.record import Table, save, show  # noqa: E402
from brorl.params import load_params  # noqa: E402
from brorl.theory.simulator import SimConfig, simulate  # noqa: E402


def numpy_simulate(cfg: SimConfig, rollouts: int, seed: int) -> tuple[float, float]:
    """One (N, seed) run, formulas as written; returns final Q_pos and % correct tokens improved."""
    rng = np.random.default_rng(seed)
    vocab = cfg.vocab_size
    correct = np.zeros(vocab, dtype=bool)
    correct[1:1 + cfg.num_correct] = True  # params/simulate.yaml: P = ids 1..|P|, anchor incorrect
    reward = np.where(correct, cfg.reward_correct, cfg.reward_wrong)
    z = np.where(correct, cfg.correct_logit, 0.0)
    z[0] = cfg.anchor_logit
    m, v = np.zeros(vocab), np.zeros(vocab)
    b1, b2 = cfg.adam_beta1, cfg.adam_beta2

    def softmax(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max())
        return e / e.sum()

    p0 = softmax(z / cfg.temperature)
    for t in range(1, cfg.steps + 1):
        p = softmax(z / cfg.temperature)
        y = rng.choice(vocab, size=rollouts, p=p)
        r = reward[y] - reward[y].mean()                      # centred rewards r~_j
        # d/dz of -(1/N) sum_j r~_j p_{y_j}, with dp_k/dz_i = p_k (delta_ki - p_i) / tau
        weighted = np.bincount(y, weights=r * p[y], minlength=vocab)
        grad = -(weighted - p * (r * p[y]).sum()) / (rollouts * cfg.temperature)
        grad[0] = 0.0                                          # anchor frozen
        z = z * (1 - cfg.lr * cfg.weight_decay)                # AdamW: decoupled weight decay
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        z = z - cfg.lr * m_hat / (np.sqrt(v_hat) + cfg.adam_eps)
        z[0] = cfg.anchor_logit
    p = softmax(z / cfg.temperature)
    return float(p[correct].sum()), float(100.0 * (p[correct] > p0[correct]).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params/simulate.yaml")
    parser.add_argument("--steps", type=int, default=None, help="override simulate.steps")
    parser.add_argument("--seeds", type=int, default=None, help="override simulate.num_seeds")
    args = parser.parse_args()
    over = [f"simulate.steps={args.steps}", f"simulate.report_steps=[{args.steps}]"] if args.steps else []
    over += [f"simulate.num_seeds={args.seeds}"] if args.seeds else []
    sim = load_params(args.params, over).simulate
    cfg = SimConfig.from_params(sim)
    seeds = list(range(sim.seed, sim.seed + sim.num_seeds))
    print(f"threads={torch.get_num_threads()} cores={os.cpu_count()} "
          f"loadavg={open('/proc/loadavg').read().split()[:3]}")
    print(f"V={cfg.vocab_size} |P|={cfg.num_correct} steps={cfg.steps} N={sim.rollouts_per_prompt} "
          f"seeds={len(seeds)}")

    # One N at a time, brorl then numpy: both sides of an N run within seconds of each other, so
    # a slow or fast spell of the machine (they last tens of seconds on a shared VM) falls on both.
    rows, ours_s, numpy_s, agree = [], {}, {}, True
    for n in sim.rollouts_per_prompt:
        start = time.perf_counter()
        result = simulate(cfg, n, seeds)
        ours_s[n] = time.perf_counter() - start
        start = time.perf_counter()
        q_np, imp_np = numpy_simulate(cfg, n, seed=sim.seed)
        numpy_s[n] = time.perf_counter() - start
        q, imp = result.final("q_pos"), result.final("pct_improved")
        ok_q = _within(q_np, q)
        ok_i = _within(imp_np, imp)
        agree &= ok_q and ok_i
        rows.append([n, f"{q.mean():.6f} ± {q.std():.6f}", f"{q_np:.6f} {'ok' if ok_q else 'OUT'}",
                     f"{imp.mean():.1f} ± {imp.std():.1f}", f"{imp_np:.1f} {'ok' if ok_i else 'OUT'}",
                     round(ours_s[n], 2), round(numpy_s[n], 2)])
    sweep_s, numpy_total = sum(ours_s.values()), sum(numpy_s.values())
    runs = len(seeds) * len(ours_s)
    per_run_ours = sweep_s / runs
    per_run_numpy = numpy_total / len(numpy_s)
    per_n = Table(f"Final Q_pos and % correct tokens improved per N (brorl: mean ± std over "
                  f"{len(seeds)} seeds; numpy: seed {sim.seed}, 'ok' when inside brorl's seed "
                  "spread)", ["N", "brorl Q_pos", "numpy Q_pos", "brorl % improved",
                              "numpy % improved", f"brorl s ({len(seeds)} seeds)", "numpy s/run"],
                  rows)
    summary = Table("The sweep (every N, every seed) against the plain numpy version",
                    ["runs", "brorl sweep s", "brorl s/run", "numpy s/run", "speed-up per run",
                     "numpy within brorl's spread"],
                    [[runs, round(sweep_s, 1), round(per_run_ours, 3), round(per_run_numpy, 2),
                      f"{per_run_numpy / per_run_ours:.1f}x", agree]],
                    [f"threads {torch.get_num_threads()}; V = {cfg.vocab_size}, |P| = "
                     f"{cfg.num_correct}, {cfg.steps} steps, N = {sim.rollouts_per_prompt}"])
    show([per_n, summary])
    save("simulate_speed", [per_n, summary])


def _within(value: float, samples: torch.Tensor) -> bool:
    """Inside the seeds' range widened by 3 standard deviations (and a float32 rounding floor)."""
    lo, hi, std = samples.min().item(), samples.max().item(), samples.std().item()
    slack = 3 * std + 1e-6 * max(1.0, abs(value))
    return lo - slack <= value <= hi + slack


if __name__ == "__main__":
    main()
