"""The verifiers' time limit: the wall time a check's processes ran or slept, without the time
they waited for a CPU, so that a verdict does not depend on what else the machine runs.

A wall-clock limit gives a correct answer "timeout" when the machine is busy (the trainer's
threads, another run, another user): the reward, and with it every later step, would depend on
load. `RunClock` counts instead `wall - run_delay`, where `run_delay` is the time the processes
spent runnable but waiting on a run queue (the second field of `/proc/<pid>/schedstat`, which
Linux keeps for every task). What is left is what the check would take on an idle machine: its
CPU time, and any time it slept or blocked (a `time.sleep(60)` still counts, as ProRL's 5 s
limit counts it). So the verdict depends on the program, its input and the CPU's speed only.

`CEILING_FACTOR`: a wall-clock ceiling of `CEILING_FACTOR * limit` still ends a run that is
starved for that long (or where the kernel keeps no run delays), as a guard against a stalled
machine; such an end is reported as its own reason, `stalled` (reward 0), never as `timeout`,
so that a run's verdict counts show it.

Where `/proc/<pid>/schedstat` cannot be read (a kernel without schedstats; `available()`), the
clock counts wall time, as before: `brorl.run_environment` records which clock a run had.

The kernel adds a wait to the run delay when it ends; a wait in progress therefore looks like
the run's own time until then, and a process starved in long stretches (a niced session beside
busy ones) could pass its limit inside one wait. `RunClock.over` decides only after seeing that
no process is waiting for a CPU at that moment.

Deliberately ignored: the run delay of threads other than each process's main thread (the
checks and sandboxed candidates here are single-threaded) and waits that are not CPU waits (a
page fault on a swapping machine counts as the check's own time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

CEILING_FACTOR = 12.0
"""The wall-clock ceiling of a run, as a multiple of its limit (5 s: a minute)."""

CHECK_S = 0.02
"""How far apart `RunClock.over` looks at a run's processes to see whether one is waiting for a CPU
(longer than a scheduler tick, in which a running process's CPU time grows)."""

STALLED = "stalled"
"""The verdict reason of a run ended at the wall-clock ceiling before its limit."""


def run_delay(pid: int) -> float | None:
    """Seconds process `pid`'s main thread has waited for a CPU since it started; None when the
    kernel does not say (no such process, or no schedstats)."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def progress(pid: int) -> tuple[str, int, int] | None:
    """Process `pid`'s main thread: its state letter (`R`: running or waiting for a CPU), and
    its nanoseconds on a CPU and waiting for one; None when the kernel does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0].decode()
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            ran, waited = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError, IndexError):
        return None
    return state, ran, waited


def children(pid: int) -> list[int]:
    """The child processes of `pid`'s main thread (`/proc/<pid>/task/<pid>/children`); []
    where that cannot be read."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def available() -> bool:
    """Whether this kernel keeps run delays (else `RunClock` counts wall time)."""
    import os

    return run_delay(os.getpid()) is not None


class RunClock:
    """The time-limit clock of one run: wall seconds since `restart`, less the seconds the
    processes `pids()` names waited for a CPU meanwhile. A process seen once is kept in the sum
    at its last delay after it ends; one that appears later counts from when it first shows."""

    def __init__(self, pids: Callable[[], Iterable[int]]):
        self.pids = pids
        self.restart()

    def restart(self) -> None:
        """Count from now (a worker's next item)."""
        self.started = time.monotonic()
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._sample()

    def _sample(self) -> float:
        """The run delay the processes accrued since `restart` (or since first seen)."""
        for pid in self.pids():
            delay = run_delay(pid)
            if delay is not None:
                self._first.setdefault(pid, delay)
                self._last[pid] = delay
        return sum(self._last[pid] - self._first[pid] for pid in self._last)

    def wall(self) -> float:
        """Wall seconds since `restart`."""
        return time.monotonic() - self.started

    def elapsed(self) -> float:
        """The limit's seconds since `restart`: wall time less CPU waits (never below 0)."""
        wall = self.wall()
        return max(wall - self._sample(), 0.0)

    def over(self, limit: float) -> bool:
        """Whether the run has used more than `limit` seconds. The kernel adds a wait to the run
        delay only when the wait ends, so a process starved for long stretches (its session
        niced, many busy processes) shows a wait in progress as its own time: past the limit,
        the processes are looked at twice `CHECK_S` apart, and a process that stayed runnable
        without running is waiting, so the verdict waits for the next look (the wall-clock
        ceiling still ends a run that never gets a CPU)."""
        if self.elapsed() <= limit:
            return False
        before = {pid: progress(pid) for pid in self.pids()}
        time.sleep(CHECK_S)
        for pid, first in before.items():
            now = progress(pid)
            if first is not None and now is not None and first[0] == now[0] == "R" \
                    and first[1:] == now[1:]:
                return False  # runnable, not run, no wait ended: waiting for a CPU now
        return self.elapsed() > limit
