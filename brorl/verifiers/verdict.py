"""The verdict of one response and the `Verifier` Protocol every family's verifier implements.

A module of its own so that the family verifiers (`math`, `code`, `reasoning`) and `workers`
import it without importing the package that dispatches to them (`brorl.verifiers`): the
dependencies point one way, from the dispatcher to the families to this module.

Deliberately ignored: anything a verifier does; this module only defines what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from brorl.types import Problem

REASONS = (
    "correct", "wrong", "partial", "no_answer", "syntax_error", "timeout", "runtime_error",
    "stalled",
)
"""Every verdict reason, besides `error:<message>` for a verifier's own failure. `timeout`: the
check ran past its time limit (wall time less its waits for a CPU: `brorl.verifiers.clock`);
`stalled`: a machine too loaded ended it at the wall-clock ceiling first (reward 0 either way)."""


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one response.

    `reward` in [0, 1] (binary for math; fraction of tests for code; the dataset's score for
    reasoning). `reason` is one of `REASONS` or `error:<message>`.
    """

    reward: float
    reason: str


class Verifier(Protocol):
    """Judges responses to problems of one family (`make_verifier` picks it by the family);
    `verify` returns one verdict per pair."""

    def verify(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]: ...


def verdict_for_score(score: float) -> Verdict:
    """A verdict from a score in [0, 1]: `correct` at 1, `wrong` at 0, else `partial`."""
    score = min(max(float(score), 0.0), 1.0)
    reason = "correct" if score == 1.0 else "wrong" if score == 0.0 else "partial"
    return Verdict(score, reason)


def error_verdict(exc: BaseException) -> Verdict:
    """Reward 0 for a verifier's own failure, with the exception in the reason."""
    return Verdict(0.0, f"error:{type(exc).__name__}: {exc}"[:200])
