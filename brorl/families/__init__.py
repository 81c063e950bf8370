"""Problem families: one module each, registered by name, read by everything family-specific.

A family (`ProblemFamily`) holds all that differs between math, code, Reasoning Gym and
instruction following: its params subsection (`FamilyParams`, under `data.families.<name>`), how
its problems are built, the instruction appended to a chat prompt and its worked example, how the
answer is read from a response, the ideal response of the supervised warm-up, its verifier and
its headline quantity. Data building (`brorl.data`), prompts (`brorl.families.prompts`), verification
(`verify_batch`), scoring, the comparison's Table 1 and the study read the registry; none of
them names a family.

- `family(name)`: the registered family; a built-in one (`BUILTIN`) is imported from
  `brorl.families.<name>` on first use.
- `load(name, module)`: import `module` and register its `FAMILY` under `name`; the data section
  does it for `data.families.<name>.module`, so a family living outside brorl is one module and
  one params subsection (docs/families.md).
- `verify_batch`: one verdict per (problem, response), each judged by its family's verifier.

The families' shared infrastructure stays where it is: the code sandbox, its zygote and harness
(`brorl.verifiers`), the splits and their storage (`brorl.data`).
Paper: BroRL Table 1 and ProRL (arXiv 2505.24864) §3.1 (Math, Code, STEM, logic puzzles,
instruction following).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from brorl.params.section import Section
from brorl.types import Problem
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.verdict import Verdict, Verifier, error_verdict

Headline = Literal["pass_at_1", "reward_mean"]
"""A family's score: binary pass@1, or the mean continuous verifier reward."""

BUILTIN = ("math", "code", "reasoning", "instruction")
"""The families brorl ships, in the order tables list them."""

PAPER = ("math", "code", "reasoning")
"""The BroRL paper's three scored families (BroRL Table 1): a data section's default."""


class FamilyParams(Section):
    """One family's params subsection (`data.families.<name>`); each family extends it."""

    module: str | None = None
    """The module that defines the family (its `FAMILY`); None: `brorl.families.<name>`."""

    def size(self) -> int:
        """Upper bound on the problems the family generates (memory and time estimates)."""
        return 0


@dataclass(frozen=True)
class ProblemFamily:
    """Everything one problem family defines; its module exposes it as `FAMILY`."""

    name: str
    """The name problems carry (`Problem.family`) and the key of its params subsection."""
    title: str
    """Its column in tables ("Math", "Reasoning Gym")."""
    params: type[FamilyParams]
    """Its params subsection's schema, with the defaults."""
    build: Callable[[Any, int], list[Problem]]
    """`build(section, seed)`: every problem the section asks for, deterministic for a seed."""
    instruction: str
    """Appended to the prompt under a chat template: how to write the answer."""
    example: tuple[str, str]
    """A worked example (question, ideal reply) shown before the problem when asked for
    (`data.chat_example`); it must lie outside the generated sets."""
    extract: Callable[[str], str | None]
    """The answer in a response (stripped), None when absent or empty."""
    target: Callable[[Problem], str]
    """The ideal response for the supervised warm-up, in exactly the format `extract` reads."""
    verifier: Callable[[VerifyConfig], Verifier]
    """Its verifier, judging with the config's workers, time limit and sandbox."""
    headline: Headline
    """Which quantity is the family's score (ProRL (arXiv 2505.24864) §3.4)."""


_REGISTRY: dict[str, ProblemFamily] = {}


def load(name: str, module: str | None = None) -> ProblemFamily:
    """Import `module` (None: `brorl.families.<name>`) and register its `FAMILY` under `name`;
    a ValueError saying what is missing when it cannot."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    path = module or (f"brorl.families.{name}" if name in BUILTIN else None)
    if path is None:
        raise ValueError(f"family {name!r} is not one of brorl's {list(BUILTIN)}; name the module "
                         f"that defines it in data.families.{name}.module.")
    try:
        found = getattr(importlib.import_module(path), "FAMILY", None)
    except ImportError as err:
        raise ValueError(f"family {name!r}: cannot import {path!r} ({err}); give an importable "
                         f"module in data.families.{name}.module.") from None
    if not isinstance(found, ProblemFamily) or found.name != name:
        raise ValueError(f"family {name!r}: module {path!r} defines no FAMILY named "
                         f"{name!r}; define `FAMILY = ProblemFamily(name={name!r}, ...)` there.")
    _REGISTRY[name] = found
    return found


def family(name: str) -> ProblemFamily:
    """The family of that name: registered already, or built in."""
    return _REGISTRY.get(name) or load(name)


def ordered(names: Sequence[str] | set[str]) -> list[str]:
    """`names` in table order: the built-in families first in `BUILTIN`'s order, then the rest
    alphabetically."""
    rank = {n: i for i, n in enumerate(BUILTIN)}
    return sorted(set(names), key=lambda n: (rank.get(n, len(rank)), n))


def make_verifier(name: str, config: VerifyConfig) -> Verifier:
    """The verifier of family `name`, judging with `config`'s workers, time limit and sandbox."""
    return family(name).verifier(config)


def verify_batch(problems: Sequence[Problem], responses: Sequence[str],
                 config: VerifyConfig = VerifyConfig()) -> list[Verdict]:
    """One verdict per (problem, response) pair, in input order; never raises.

    The single entry point for reward (training) and evaluation alike: it groups a batch by
    `problem.family`, runs each family's verifier, and scatters the verdicts back in order. A
    verifier failure of any kind becomes reward 0 with a recorded reason. `config`: the workers
    per family, the time limit per item and the code sandbox's limits (the run's
    `VerifyConfig.from_params`; the schema's defaults without one). A length mismatch is the
    caller's bug and does raise.
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
    for name, indices in by_family.items():
        for i, verdict in zip(indices, _verify_family(name, indices, problems, responses, config)):
            verdicts[i] = verdict
    out = [verdicts[j] for j in source]
    return [v if v is not None else Verdict(0.0, "error:missing verdict") for v in out]


def _verify_family(name, indices, problems, responses, config: VerifyConfig) -> list[Verdict]:
    """Verdicts for the items at `indices`, all of family `name`; a failure rewards each with 0."""
    try:
        verifier = make_verifier(name, config)
        out = verifier.verify([problems[i] for i in indices], [responses[i] for i in indices])
        if len(out) != len(indices):
            raise RuntimeError(f"{name} verifier returned {len(out)} verdicts for {len(indices)}")
        return out
    except Exception as exc:  # noqa: BLE001 - a verifier must never stop the run
        return [error_verdict(exc)] * len(indices)
