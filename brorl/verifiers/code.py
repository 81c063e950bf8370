"""Code verifier: the fraction of a problem's test snippets that the extracted code passes.

The candidate is the last fenced ```` ```python ```` block of the response
(`brorl.prompts.extract_answer`). A syntax error is caught in the parent without starting a
process; otherwise the candidate runs in one sandboxed process that evaluates each test's subject
(`f(3)`), and the judge compares the plain values it sends back against the expected ones here
(`sandbox.run_tests`, `checks`): the candidate never sees an expected value and none of its code
takes part in a comparison. Reward = passed / total (ProRL's continuous code reward), 0 when the
run times out (`timeout_s` bounds all tests together, ProRL's 5 s total, counted without the
time the run waited for a CPU: `clock`), when the candidate's top
level raises, or when the process dies before finishing. Sandboxes run concurrently from a thread
pool, one per available core (the threads only wait on their sandboxes, each forked by this
process's zygote: `zygote.py`). Where the OS does not give the sandbox its namespaces and jail
(`sandbox.capabilities`), the first verification in a process warns.

Deliberately ignored: stdin/stdout-style tests (APPS "input/output" pairs must be turned into assert
snippets by the data module) and per-test time limits. Paper: ProRL (arXiv 2505.24864) App. E,
Table 4 (Code: continuous, all test cases, syntax error or >5 s total timeout gives 0).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from brorl.prompts import extract_answer
from brorl.types import Problem
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.sandbox import SandboxResult, capabilities, run_tests
from brorl.verifiers.verdict import Verdict, error_verdict
from brorl.verifiers.workers import default_workers


class CodeVerifier:
    """Continuous reward: the fraction of test snippets passed in the sandbox."""

    def __init__(self, config: VerifyConfig = VerifyConfig()):
        self.config = config

    def verify(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """One verdict per pair, sandboxes run `workers` at a time."""
        _warn_if_partial()
        with ThreadPoolExecutor(max_workers=self.config.workers or default_workers()) as pool:
            return list(pool.map(self.verify_one, problems, responses))

    def verify_one(self, problem: Problem, response: str) -> Verdict:
        """The verdict for one response; never raises."""
        try:
            if not problem.tests:
                raise ValueError(f"code problem {problem.id!r} has no tests")
            code = extract_answer(response, "code")
            if code is None:
                return Verdict(0.0, "no_answer")
            try:
                compile(code, "<candidate>", "exec")
            except (SyntaxError, ValueError):
                return Verdict(0.0, "syntax_error")
            result = run_tests(code, problem.tests, timeout_s=self.config.timeout_s,
                               limits=self.config.limits)
            return verdict_of(result)
        except Exception as exc:  # noqa: BLE001 - a verifier must never stop the run
            return error_verdict(exc)


@functools.cache
def _warn_if_partial() -> None:
    """Warn once per process when the sandbox's isolation is incomplete here."""
    missing = [name for name, holds in capabilities().items() if not holds]
    if missing:
        warnings.warn(f"code sandbox isolation is partial on this machine (missing: "
                      f"{', '.join(missing)}): a hostile candidate may reach other processes or "
                      "files. Run the verifier as root, or where user namespaces are allowed.",
                      RuntimeWarning, stacklevel=3)


def verdict_of(result: SandboxResult) -> Verdict:
    """Reward passed/total for a finished run; 0 with the run's status otherwise."""
    if result.status != "ok":
        return Verdict(0.0, result.status)
    if result.passed == result.total:
        return Verdict(1.0, "correct")
    return Verdict(result.passed / result.total, "partial" if result.passed else "wrong")
