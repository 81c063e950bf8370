"""Verifier throughput: problems verified per second per family, on a generated batch.

Each family gets `--per-family` (problem, response) pairs, half right and half wrong answers:
math (fractions, the right half written as decimals or `\\frac`), reasoning (reasoning-gym
`chain_sum`, `spell_backward`, `leg_counting`) and code (linear functions with four assert
tests). It prints, per family, the pairs, seconds, pairs per second, the mean reward and how many
verdicts disagree with the intended right/wrong label (reasoning-gym's continuous scorers may
give a wrong answer partial credit: `spell_backward` scores by similarity), then the core count
and /proc/loadavg (the machine is shared: read the figures with the load beside them), and
records the table (`benchmarks/record.py`).

Usage:
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/verifier_throughput.py --per-family 200
    git worktree add --detach /tmp/old 8e346df
    python benchmarks/verifier_throughput.py --families math code --against /tmp/old

`--against TREE` (a checkout of another commit) times the same batches with that tree's `brorl`
and with this one's, in turns (other, this, other, this, ...; each a fresh process), and prints
each family's median pairs/s for both and the median of the per-round ratios this/other: below 1,
this tree is slower. `TARGETS` are the ratios this tree must reach against 8e346df, the last
commit before the code sandbox got its PID namespace and jail: the sandbox's isolation must not
cost code throughput (its set-up is paid once per process, by the zygote).

Each process pays its one-time set-up inside the timed batch (the code sandbox's zygote, the
math verifier's warm-up): a 200-pair batch carries it once, as a training run carries it once.

Deliberately ignored: long responses and slow sympy cases (a best-case throughput for short
answers, like the tiny policy's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import reasoning_gym

from brorl.families import verify_batch
from brorl.types import Problem
from brorl.verifiers import VerifyConfig
from brorl.verifiers.workers import default_workers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # brorl and benchmarks.record
from benchmarks.record import Table, save  # noqa: E402

GYM_TASKS = ("chain_sum", "spell_backward", "leg_counting")
TARGETS = {"code": 1.2}
"""family -> the ratio this/other that this tree must reach `--against` a checkout of 8e346df."""


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
    verdicts = verify_batch(list(problems), list(responses),
                            VerifyConfig(workers=workers, timeout_s=timeout_s))
    seconds = time.perf_counter() - start
    rewards = [v.reward for v in verdicts]
    return seconds, sum(rewards) / len(rewards), sum(r != y for r, y in zip(rewards, labels))


FAMILIES = ("math", "reasoning", "code")
ROOT = Path(__file__).resolve().parents[1]


def against(args: argparse.Namespace) -> None:
    """This tree's throughput against `args.against`'s, in alternating fresh processes."""
    command = [sys.executable, __file__, "--per-family", str(args.per_family), "--seed",
               str(args.seed), "--timeout-s", str(args.timeout_s), "--json",
               "--families", *args.families]
    if args.workers:
        command += ["--workers", str(args.workers)]
    rates: dict[str, dict[str, list[float]]] = {"other": {}, "this": {}}
    for _ in range(args.rounds):
        for name, tree in (("other", Path(args.against).resolve()), ("this", ROOT)):
            env = {**os.environ, "PYTHONPATH": str(tree)}
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            for family, rate in json.loads(out.stdout.splitlines()[-1]).items():
                rates[name].setdefault(family, []).append(rate)
    rows = []
    for family in args.families:
        this, other = rates["this"][family], rates["other"][family]
        rows.append([family, statistics.median(this), statistics.median(other),
                     statistics.median(a / b for a, b in zip(this, other)),
                     TARGETS.get(family, "")])
    notes = [f"pairs/s, medians of {args.rounds} alternating rounds, {args.per_family} pairs per "
             f"family, workers: {args.workers or default_workers()}; other = {args.against} "
             f"(commit {_commit(args.against)}); targets hold against 8e346df",
             f"cores: {os.cpu_count()}  loadavg: {_loadavg()}"]
    print(f"{'family':<10} {'this':>10} {'other':>10} {'this/other':>11} {'target':>7}")
    for family, this, other, ratio, target in rows:
        print(f"{family:<10} {this:>10.1f} {other:>10.1f} {ratio:>11.3f} {target!s:>7}")
    print("\n".join(notes))
    save("verifier_throughput", [Table("Verifier throughput against another tree",
                                       ["family", "this", "other", "this/other", "target"],
                                       rows, notes)])


def _commit(tree: str) -> str:
    out = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-family", type=int, default=200, help="pairs per family")
    parser.add_argument("--workers", type=int, default=None, help="default: available cores")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="time limit per item")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--against", metavar="TREE", default=None,
                        help="a checkout of another commit: time both, in turns")
    parser.add_argument("--rounds", type=int, default=5, help="with --against: rounds")
    parser.add_argument("--json", action="store_true", help="print {family: pairs/s} only")
    args = parser.parse_args()
    if args.against:
        return against(args)
    rng = random.Random(args.seed)
    builders = {
        "math": lambda: math_batch(args.per_family, rng),
        "reasoning": lambda: reasoning_batch(args.per_family, args.seed),
        "code": lambda: code_batch(args.per_family, rng),
    }
    batches = {family: builders[family]() for family in FAMILIES if family in args.families}
    header = ["family", "pairs", "seconds", "pairs/s", "reward", "disagree"]
    rates, rows = {}, []
    for family, batch in batches.items():
        seconds, mean_reward, disagree = measure(batch, args.workers, args.timeout_s)
        rates[family] = len(batch) / seconds
        rows.append([family, len(batch), seconds, len(batch) / seconds, mean_reward, disagree])
    if args.json:
        print(json.dumps(rates))
        return
    print(f"{header[0]:<10} " + " ".join(f"{h:>8}" for h in header[1:]))
    for family, pairs, seconds, rate, reward, disagree in rows:
        print(f"{family:<10} {pairs:>8} {seconds:>8.2f} {rate:>8.1f} {reward:>8.3f} {disagree:>8}")
    note = (f"workers: {args.workers or default_workers()}  cores: {os.cpu_count()}  "
            f"loadavg: {_loadavg()}")
    print(note)
    save("verifier_throughput", [Table("Verifier throughput", header, rows, [note])])


if __name__ == "__main__":
    main()
