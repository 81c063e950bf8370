"""Frozen records passed between pipeline stages. Shapes: B prompts, N rollouts per prompt."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

@dataclass(frozen=True)
class Problem:
    """One verifiable problem, the same record for every family.

    `family` names its problem family (`brorl.families`). `answer` is the reference answer
    (math, reasoning); `tests` are code test cases, each one
    `assert` of a form the judge checks outside the sandbox (`assert f(2) == 5`,
    `brorl.verifiers.checks`). `metadata` is JSON-serialisable
    (reasoning-gym's scorer needs its entry's metadata).
    """

    id: str
    family: str
    task: str
    prompt: str
    answer: str = ""
    tests: tuple[str, ...] = ()
    metadata: dict = field(default_factory=dict)


FinishReason = Literal["stop", "length"]
"""Why a rollout ended: `stop` = it emitted EOS (included in its tokens), `length` = it hit
`max_response_tokens`."""


@dataclass(frozen=True)
class RolloutBatch:
    """B prompts x N rollouts from a rollout engine, flattened prompt-major: row i is rollout
    i % N of prompt i // N. T is the longest response; shorter rows are right-padded.

    `prompt_ids[b]` are prompt b's token ids (B entries, shared by its N rollouts).
    `response_ids` `[B*N, T]` long, padded with `pad_id`; `response_lengths` `[B*N]` long.
    `logprobs` `[B*N, T]` float32: log-probability of each sampled token under the sampling
    distribution (after temperature and top-p), 0 at padding. `texts` are the decoded responses
    without special tokens; `finish_reasons` one per row.
    """

    prompt_index: torch.Tensor
    prompt_ids: tuple[tuple[int, ...], ...]
    response_ids: torch.Tensor
    response_lengths: torch.Tensor
    logprobs: torch.Tensor
    texts: tuple[str, ...]
    finish_reasons: tuple[FinishReason, ...]
    rollouts_per_prompt: int
    pad_id: int = 0

    def __post_init__(self) -> None:
        rows = len(self.prompt_ids) * self.rollouts_per_prompt
        sizes = {
            "prompt_index": self.prompt_index.shape[0],
            "response_ids": self.response_ids.shape[0],
            "response_lengths": self.response_lengths.shape[0],
            "logprobs": self.logprobs.shape[0],
            "texts": len(self.texts),
            "finish_reasons": len(self.finish_reasons),
        }
        bad = {k: v for k, v in sizes.items() if v != rows}
        if bad:
            raise ValueError(
                f"RolloutBatch fields {bad} must all have B*N = {len(self.prompt_ids)}*"
                f"{self.rollouts_per_prompt} = {rows} rows; build it prompt-major from the engine."
            )
        if tuple(self.logprobs.shape) != tuple(self.response_ids.shape):
            raise ValueError(
                f"logprobs shape {tuple(self.logprobs.shape)} differs from response_ids shape "
                f"{tuple(self.response_ids.shape)}; both are [B*N, T]."
            )

    @property
    def num_prompts(self) -> int:
        """B, the number of distinct prompts."""
        return len(self.prompt_ids)

    @property
    def num_rollouts(self) -> int:
        """B*N, the number of rows."""
        return len(self.texts)


@dataclass(frozen=True)
class Timed(Generic[T]):
    """A stage's output and the seconds its brorl work took (`brorl.train.Run`'s stage methods
    return these, so orchestration's share of a step is its wall time minus the stages')."""

    value: T
    seconds: float


def timed(fn: Callable[..., T], *args: Any) -> Timed[T]:
    """`fn(*args)` with its seconds."""
    started = time.perf_counter()
    value = fn(*args)
    return Timed(value, time.perf_counter() - started)
