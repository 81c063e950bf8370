"""How a run's stages and steps are executed: `Driver` (the protocol), `Direct` (in place), and
`Timed` (a stage's output with its own seconds).

`brorl.train.run.Run` writes the loop once; a driver decides how each stage method and each
step runs (`flows/train.py`'s Prefect driver makes stages tasks and steps subflows). Since every
stage returns its own seconds, orchestration's share of a step is the step's wall time minus
the stages' seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from brorl.evals import SELECTION_METRIC

if TYPE_CHECKING:
    from brorl.train.run import Run

T = TypeVar("T")


@dataclass(frozen=True)
class Timed(Generic[T]):
    """A stage's output and the seconds its brorl work took."""

    value: T
    seconds: float


def timed(fn: Callable[..., T], *args: Any) -> Timed[T]:
    started = time.perf_counter()
    value = fn(*args)
    return Timed(value, time.perf_counter() - started)


class Driver(Protocol):
    """How the loop's stages and steps are run (see the module docstring)."""

    def stage(self, run: Run, name: str, *args: Any) -> Timed[Any]: ...

    def iteration(self, step: int, body: Callable[[], dict[str, float]]) -> dict[str, float]: ...

    def on_step(self, run: Run, metrics: dict[str, float]) -> None: ...


class Direct:
    """Runs every stage and step in place; `progress` prints one line per step."""

    def __init__(self, progress: Callable[[str], None] | None = None) -> None:
        self.progress = progress

    def stage(self, run: Run, name: str, *args: Any) -> Timed[Any]:
        return getattr(run, name)(*args)

    def iteration(self, step: int, body: Callable[[], dict[str, float]]) -> dict[str, float]:
        return body()

    def on_step(self, run: Run, metrics: dict[str, float]) -> None:
        if self.progress is not None and run.trainer.rank == 0:
            self.progress(progress_line(run.config.name, run.step_count, metrics))


def progress_line(name: str, step: int, m: dict[str, float]) -> str:
    """One human line per step: reward, pass rate, throughput, held-out scores when evaluated
    (test per family, validation mean)."""
    parts = [f"{name} step {step}"]
    if "generate/rollouts" in m:
        parts.append(f"{m['generate/rollouts_per_s']:.0f} rollouts/s "
                     f"({int(m['generate/rollouts'])} rollouts, "
                     f"{int(m['generate/rollouts_total'])} total)")
        parts.append(f"reward {m['verify/reward_mean']:.3f}")
        parts.append(f"pass rate {100 * m['filter/pass_rate']:.0f}%")
    scores = [f"{k.removeprefix('eval/score_')} {v:.2f}" for k, v in sorted(m.items())
              if k.startswith("eval/score_") and k != "eval/score_mean"]
    if scores:
        parts.append("test score " + " ".join(scores))
    if SELECTION_METRIC in m:
        parts.append(f"validation score {m[SELECTION_METRIC]:.3f}")
    if "time/iteration" in m:
        parts.append(f"{m['time/iteration']:.1f} s")
    return " | ".join(parts)
