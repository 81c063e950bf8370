"""Verifier throughput: problems verified per second per family, on a generated batch.

Each family gets `--per-family` (problem, response) pairs, half right and half wrong answers:
math (fractions, the right half written as decimals or `\\frac`), reasoning (reasoning-gym
`chain_sum`, `spell_backward`, `leg_counting`) and code (linear functions with four assert
tests). It prints, per family, the pairs, seconds, pairs per second, the mean reward and how many
verdicts disagree with the intended right/wrong label (reasoning-gym's continuous scorers may
give a wrong answer partial credit: `spell_backward` scores by similarity), then the core count
and /proc/loadavg (the machine is shared: read the figures with the load beside them).

Usage:
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/verifier_throughput.py --per-family 200

Deliberately ignored: long responses and slow sympy cases (a best-case throughput for short
answers, like the tiny policy's), warm-up runs.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import reasoning_gym

from brorl.types import Problem
from brorl.verifiers import verify_batch
from brorl.verifiers.workers import default_workers

GYM_TASKS = ("chain_sum", "spell_backward", "leg_counting")


def math_batch(n: int, rng: random.Random) -> list[tuple[Problem, str, float]]:
    """`n` fraction problems with answers p/q (q in 2, 4, 5, 8); even items right."""
    out = []
    for i in range(n):
        p, q = rng.randint(1, 9), rng.choice((2, 4, 5, 8))
        problem = Problem(f"m{i}", "math", "fractions", f"{p}/{q} = ?", answer=f"{p}/{q}")
        right = i % 2 == 0
        shown = (f"{p / q}" if i % 4 == 0 else f"\\frac{{{p}}}{{{q}}}") if right else f"{p / q + 1}"
        out.append((problem, f"<answer>{shown}</answer>", float(right)))
    return out


def reasoning_batch(n: int, seed: int) -> list[tuple[Problem, str, float]]:
    """`n` reasoning-gym items over `GYM_TASKS`; even items right, odd items a wrong answer."""
    per_task = -(-n // len(GYM_TASKS))
    entries = [(name, e) for name in GYM_TASKS
               for e in reasoning_gym.create_dataset(name, size=per_task, seed=seed)][:n]
    out = []
    for i, (name, e) in enumerate(entries):
        problem = Problem(f"r{i}", "reasoning", name, e["question"], answer=e["answer"],
                          metadata=e["metadata"])
        right = i % 2 == 0
        answer = e["answer"] if right else "wrong"
        out.append((problem, f"<answer>{answer}</answer>", float(right)))
    return out


def code_batch(n: int, rng: random.Random) -> list[tuple[Problem, str, float]]:
    """`n` problems f(x) = a*x + b with four tests; even items right, odd items b off by one."""
    out = []
    for i in range(n):
        a, b = rng.randint(1, 9), rng.randint(0, 9)
        tests = tuple(f"assert f({x}) == {a * x + b}" for x in (-2, 0, 3, 7))
        problem = Problem(f"c{i}", "code", "linear", f"f(x) = {a}x + {b}", tests=tests)
        right = i % 2 == 0
        code = f"def f(x):\n    return {a} * x + {b if right else b + 1}"
        out.append((problem, f"```python\n{code}\n```", float(right)))
    return out


def measure(batch, workers: int | None, timeout_s: float) -> tuple[float, float, int]:
    """(seconds, mean reward, verdicts disagreeing with the label) for one batch."""
    problems, responses, labels = zip(*batch)
    start = time.perf_counter()
    verdicts = verify_batch(list(problems), list(responses), workers=workers, timeout_s=timeout_s)
    seconds = time.perf_counter() - start
    rewards = [v.reward for v in verdicts]
    return seconds, sum(rewards) / len(rewards), sum(r != y for r, y in zip(rewards, labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-family", type=int, default=200, help="pairs per family")
    parser.add_argument("--workers", type=int, default=None, help="default: available cores")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="time limit per item")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    batches = {
        "math": math_batch(args.per_family, rng),
        "reasoning": reasoning_batch(args.per_family, args.seed),
        "code": code_batch(args.per_family, rng),
    }
    header = ("family", "pairs", "seconds", "pairs/s", "reward", "disagree")
    print(f"{header[0]:<10} " + " ".join(f"{h:>8}" for h in header[1:]))
    for family, batch in batches.items():
        seconds, mean_reward, disagree = measure(batch, args.workers, args.timeout_s)
        print(f"{family:<10} {len(batch):>8} {seconds:>8.2f} {len(batch) / seconds:>8.1f} "
              f"{mean_reward:>8.3f} {disagree:>8}")
    with open("/proc/loadavg") as f:
        load = f.read().strip()
    print(f"workers: {args.workers or default_workers()}  cores: {os.cpu_count()}  loadavg: {load}")


if __name__ == "__main__":
    main()
