"""Verifiers: one per problem family behind the `Verifier` Protocol, and `verify_batch`.

`verify_batch` is the single entry point for reward (training) and evaluation alike: it groups a
batch by `problem.family`, runs each family's verifier, and scatters the verdicts back in order.
A verifier failure of any kind becomes reward 0 with a recorded reason; it never raises.

- math (`brorl.verifiers.math`): `math_verify.parse` + `verify`, binary, per-call time limit;
- code (`brorl.verifiers.code`): fraction of test snippets passed in a sandbox (`sandbox.py`);
- reasoning (`brorl.verifiers.reasoning`): the reasoning-gym dataset's own `score_answer`.

`Verdict` and the `Verifier` Protocol live in `brorl.verifiers.verdict` (re-exported here), so
the family modules never import this package back.

Deliberately ignored: STEM and instruction following (not among the scored families here),
DeepScaleR's own math grader (math-verify alone). Paper: ProRL (arXiv 2505.24864) App. E,
Table 4.
"""

from __future__ import annotations

from collections.abc import Sequence

from brorl.types import Family, Problem
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.verdict import (
    REASONS,
    Verdict,
    Verifier,
    error_verdict,
    verdict_for_score,
)

__all__ = ["REASONS", "Verdict", "Verifier", "VerifyConfig", "error_verdict", "make_verifier",
           "verdict_for_score", "verify_batch"]


def make_verifier(family: Family, config: VerifyConfig) -> Verifier:
    """The verifier for `family`, judging with `config`'s workers, time limit and sandbox."""
    match family:
        case "math":
            from brorl.verifiers.math import MathVerifier

            return MathVerifier(config)
        case "code":
            from brorl.verifiers.code import CodeVerifier

            return CodeVerifier(config)
        case "reasoning":
            from brorl.verifiers.reasoning import ReasoningVerifier

            return ReasoningVerifier(config)
    raise ValueError(f"unknown family {family!r}: expected one of 'math', 'code', 'reasoning'")


def verify_batch(problems: Sequence[Problem], responses: Sequence[str],
                 config: VerifyConfig = VerifyConfig()) -> list[Verdict]:
    """One verdict per (problem, response) pair, in input order; never raises.

    `config`: the workers per family, the time limit per item and the code sandbox's limits
    (the run's `VerifyConfig.from_params`; the schema's defaults without one). A length
    mismatch is the caller's bug and does raise.
    """
    if len(problems) != len(responses):
        raise ValueError(
            f"verify_batch got {len(problems)} problems but {len(responses)} responses: "
            "pass one response per problem (repeat a problem for each of its rollouts)"
        )
    # Verifiers are deterministic: judge each distinct (problem, response) pair once. At large N
    # a tiny policy repeats itself often, and the code sandbox costs a process per judgement.
    first: dict[tuple[str, str], int] = {}
    source = [first.setdefault((p.id, r), i) for i, (p, r) in enumerate(zip(problems, responses))]
    verdicts: list[Verdict | None] = [None] * len(problems)
    by_family: dict[str, list[int]] = {}
    for i, problem in enumerate(problems):
        if source[i] == i:
            by_family.setdefault(problem.family, []).append(i)
    for family, indices in by_family.items():
        family_verdicts = _verify_family(family, indices, problems, responses, config)
        for i, verdict in zip(indices, family_verdicts):
            verdicts[i] = verdict
    out = [verdicts[j] for j in source]
    return [v if v is not None else Verdict(0.0, "error:missing verdict") for v in out]


def _verify_family(family, indices, problems, responses, config: VerifyConfig) -> list[Verdict]:
    """Verdicts for the items at `indices`, all of `family`; a failure rewards each with 0."""
    try:
        verifier = make_verifier(family, config)
        out = verifier.verify([problems[i] for i in indices], [responses[i] for i in indices])
        if len(out) != len(indices):
            raise RuntimeError(f"{family} verifier returned {len(out)} verdicts for {len(indices)}")
        return out
    except Exception as exc:  # noqa: BLE001 - a verifier must never stop the run
        return [error_verdict(exc)] * len(indices)
