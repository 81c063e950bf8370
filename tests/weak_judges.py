"""Deliberately weak judges: the positive control of the hostile corpus (tests/test_hostile.py).

A reward hack that scores 0 under the real judge proves nothing if it would score 0 anyway (a
hack with a bug of its own). Each judge here makes one mistake a code verifier can make, and
every program of `HACKS` (tests/hostile_programs.py) must earn reward from the judge it names:

- `candidate_compares`: the real sandbox, but each test's whole comparison (`f(0) == 3`) is
  evaluated in the candidate's process and the judge trusts the value it sends back (truthy:
  passed), so the candidate's `__eq__`, its built-ins and its forged report lines decide;
- `candidate_reports`: the tests run as `assert` statements beside the candidate's code, in its
  process, and the judge trusts the process's own report: a test passes when a line `T<i> 1`
  says so on stdout (fd 3 included, without a nonce), or when no line `T<i> 0` says it failed
  (the run ended before reporting any failure).

Both run inside the real sandbox (`run_code`), so no hostile program ever runs unconfined: only
the judgement is weak, the isolation is not.
"""

from __future__ import annotations

import ast

from brorl.verifiers.sandbox import MISSING, run_code

TIMEOUT_S = 3.0

REPORTING_JUDGE = r'''
import atexit, os, sys
os.dup2(1, 3)  # its report channel is stdout: no nonce
TESTS = {tests!r}
payload = {{"tests": TESTS}}


def emit(tag, value=""):
    sys.stdout.write("%s %s\n" % (tag, value))
    sys.stdout.flush()


scope = {{"__name__": "__main__"}}
exec({code!r}, scope)
for i, test in enumerate(TESTS):
    try:
        exec(test, scope)
        emit("T%d" % i, 1)
    except Exception:
        emit("T%d" % i, 0)
emit("DONE")
atexit._run_exitfuncs()  # what the interpreter would do at a normal exit
'''


def candidate_compares(code: str, tests: tuple[str, ...]) -> float:
    """The fraction of tests whose comparison, evaluated beside the candidate, came back truthy."""
    comparisons = [ast.unparse(ast.parse(test).body[0].test) for test in tests]
    values = run_code(code, comparisons, timeout_s=TIMEOUT_S).values
    return sum(1 for v in values if v is not MISSING and bool(v)) / len(tests)


def candidate_reports(code: str, tests: tuple[str, ...]) -> float:
    """The fraction of tests the candidate's process reported passed or never reported failed."""
    result = run_code(REPORTING_JUDGE.format(code=code, tests=list(tests)), [],
                      timeout_s=TIMEOUT_S)
    lines = set(result.stdout.splitlines())
    passed = [f"T{i} 1" in lines or f"T{i} 0" not in lines for i in range(len(tests))]
    return sum(passed) / len(tests)


WEAK_JUDGES = {"candidate_compares": candidate_compares, "candidate_reports": candidate_reports}
"""By the name `HACKS` gives."""
