"""Frozen records passed between pipeline stages. Shapes: B prompts, N rollouts per prompt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Family = Literal["math", "code", "reasoning"]
"""The paper's three scored families (spec §5): Math, Code, Reasoning Gym."""


@dataclass(frozen=True)
class Problem:
    """One verifiable problem, the same record for every family.

    `answer` is the reference answer (math, reasoning); `tests` are code test cases, each a
    Python snippet of asserts run after the candidate's code. `metadata` is JSON-serialisable
    (reasoning-gym's scorer needs its entry's metadata).
    """

    id: str
    family: Family
    task: str
    prompt: str
    answer: str = ""
    tests: tuple[str, ...] = ()
    metadata: dict = field(default_factory=dict)
