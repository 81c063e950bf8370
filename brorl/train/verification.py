"""Verification overlapped with generation: each chunk of rollouts an engine hands over is
verified on a background thread while the engine decodes the next one (`ChunkVerifier`, passed
to the engine as its `on_chunk`).

The reward function sees every rollout once, chunk by chunk in row order, one call at a time on
one thread. A verdict depends only on its problem and its response, so the verdicts joined in
row order are those of one call over the whole batch: rewards, their order and every seed are
what they are without overlap. `result()` waits for what is still running, so the verify stage's
seconds are what is left to wait for after generation; `work_seconds` is how long the reward
function ran in all (`verify/work_seconds`).

Deliberately ignored: several verification threads (the verifiers spread their work over
processes themselves), cancelling a reward call already running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from brorl.types import Problem, RolloutBatch
from brorl.verifiers import Verdict

RewardFn = Callable[[Sequence[Problem], Sequence[str]], list[Verdict]]
"""(problems, responses) -> one verdict per pair, in order (`verify_batch` by default)."""


@dataclass
class _Chunk:
    problems: list[Problem]
    texts: list[str]
    verdicts: Future[list[Verdict]]


class ChunkVerifier:
    """Verifies the rows of one engine call, `n` rollouts per problem of `problems`, as the
    engine hands them over (`__call__` is the engine's `on_chunk`)."""

    def __init__(self, reward_fn: RewardFn, problems: Sequence[Problem], n: int) -> None:
        self.reward_fn, self.problems, self.n = reward_fn, list(problems), n
        self.work_seconds = 0.0
        """Seconds the reward function ran for this call (background and retries)."""
        self._chunks: list[_Chunk] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brorl-verify")

    def __call__(self, start: int, stop: int, texts: Sequence[str]) -> None:
        """Start verifying rows `start..stop-1` (prompt-major) with their response `texts`."""
        problems = [self.problems[row // self.n] for row in range(start, stop)]
        texts = list(texts)
        self._chunks.append(_Chunk(problems, texts, self._pool.submit(self._verify, problems,
                                                                      texts)))

    def _verify(self, problems: list[Problem], texts: list[str]) -> list[Verdict]:
        started = time.perf_counter()
        try:
            return self.reward_fn(problems, texts)
        finally:
            self.work_seconds += time.perf_counter() - started

    def result(self) -> list[Verdict]:
        """Every row's verdict in row order, waiting for chunks still being verified. A chunk
        whose background call raised is verified again here, in the caller's thread (its error
        then reaches the caller, and a retried verify stage runs it once more)."""
        verdicts: list[Verdict] = []
        try:
            for chunk in self._chunks:
                try:
                    part = chunk.verdicts.result()
                except Exception:
                    part = self._verify(chunk.problems, chunk.texts)
                    chunk.verdicts = _done(part)
                verdicts += part
        finally:
            self._pool.shutdown(wait=False)
        return verdicts

    def close(self) -> None:
        """Drop chunks not started yet and let the thread end (generation failed)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _done(value: list[Verdict]) -> Future[list[Verdict]]:
    future: Future[list[Verdict]] = Future()
    future.set_result(value)
    return future


@dataclass
class Generated:
    """What the generate stage hands to the verify stage: this rank's share of a draw (its
    problems, from draw position `first`), its rollouts and their verification under way.
    `batch` and `verifier` are None on a rank with no prompts in the draw."""

    problems: list[Problem]
    first: int
    batch: RolloutBatch | None = None
    verifier: ChunkVerifier | None = None
