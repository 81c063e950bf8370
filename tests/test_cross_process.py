"""Two processes verify code at once: one the hostile corpus, the other correct and wrong
programs; every verdict of the second is right (issue 30, item 4).

Two study runs, two ranks, or a training run beside an evaluation share one machine. Each
process has its own zygote and each sandbox its own PID, mount and network namespaces, so the
corpus's signals (`kill(-1)`, every pid in a range, SIGSTOP), its bombs and its files reach no
sandbox of the other process. The hostile process runs as a child of this one; this process
verifies honest batches for as long as the corpus runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from brorl.families import verify_batch
from brorl.families.code import TEMPLATES, generated_problem
from brorl.types import Problem
from brorl.verifiers import VerifyConfig, zygote
from tests.hostile_programs import PROGRAMS

ROOT = Path(__file__).resolve().parents[1]

HOSTILE_PROCESS = """
import json
from brorl.families.code import generated_problem
from brorl.verifiers import zygote
from brorl.families.code import CodeVerifier
from brorl.verifiers.config import VerifyConfig
from tests.hostile_programs import PROGRAMS

problem = generated_problem("add", 3, "f")
names = sorted(PROGRAMS)
print(json.dumps({"zygote": zygote.current().pid}), flush=True)  # the corpus starts now
verdicts = CodeVerifier(VerifyConfig(workers=2, timeout_s=1.0)).verify(
    [problem] * len(names), ["```python\\n%s\\n```" % PROGRAMS[n] for n in names])
print(json.dumps({n: v.reward for n, v in zip(names, verdicts)}), flush=True)
"""


def honest_batch(round_: int) -> tuple[list[Problem], list[str], list[tuple[float, str]]]:
    """Per template: the solution, a wrong one, one that passes all but the first test, a syntax
    error and a top-level exception, each with its verdict worked out by hand."""
    problems, responses, expected = [], [], []
    for template in sorted(TEMPLATES):
        problem = generated_problem(template, 3, "f")
        solution = problem.metadata["solution"]
        arg = solution[len("def f("):solution.index(")")]
        first = problem.tests[0][len("assert "):problem.tests[0].index(" == ")]  # f(<input>)
        body = solution.splitlines()[1].strip()[len("return "):]
        cases = [
            (solution, (1.0, "correct")),
            (f"def f({arg}):\n    return None", (0.0, "wrong")),  # None equals no expected value
            (f"def f({arg}):\n    if {first[2:-1]} == {arg}:\n        return None\n"
             f"    return {body}", (2 / 3, "partial")),  # the first input's answer only is wrong
            (f"def f({arg}) return 1", (0.0, "syntax_error")),
            ("raise ValueError('top level')", (0.0, "runtime_error")),
        ]
        for code, verdict in cases:
            problems.append(problem)
            responses.append(f"```python\n{code}\n# round {round_}\n```")
            expected.append(verdict)
    return problems, responses, expected


def test_verdicts_stay_right_while_another_process_verifies_the_hostile_corpus():
    hostile = subprocess.Popen([sys.executable, "-c", HOSTILE_PROCESS], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    try:
        theirs = json.loads(hostile.stdout.readline())["zygote"]
        rounds, wrong = 0, []
        while hostile.poll() is None:
            problems, responses, expected = honest_batch(rounds)
            verdicts = verify_batch(problems, responses, VerifyConfig(workers=2, timeout_s=30.0))
            got = [(round(v.reward, 6), v.reason) for v in verdicts]
            want = [(round(r, 6), reason) for r, reason in expected]
            wrong += [(rounds, responses[i], g) for i, (g, w) in enumerate(zip(got, want)) if g != w]
            rounds += 1
        rewards = json.loads(hostile.stdout.read().splitlines()[-1])
    finally:
        hostile.kill()
        hostile.wait()
    assert hostile.returncode == 0
    assert sorted(rewards) == sorted(PROGRAMS) and set(rewards.values()) == {0.0}
    assert theirs != zygote.current().pid  # each process forks its sandboxes from its own zygote
    assert rounds >= 2  # whole honest batches were verified while the corpus ran
    assert wrong == []
