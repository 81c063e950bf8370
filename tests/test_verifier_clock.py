"""The verifiers' time limit does not depend on load (`brorl.verifiers.clock`): a check or a
candidate starved of CPU by other processes keeps its verdict; sleeping still counts; the CPU
limit is a timeout; a run a stalled machine never lets finish ends at the wall-clock ceiling as
`stalled`, not `timeout`.

Load is made by busy processes pinned to one core beside the check (or candidate), which pins
itself there too, so it waits on that core's run queue most of its wall time: several times its
CPU time, past a limit its CPU time is far below. Each busy process leads a session of its own,
as the sandboxed candidate does, so the check's share of the core is about a sixth whether or
not the kernel groups tasks by session (autogroups). The check runs at the default priority: a
lower one (`os.nice`) would make its share depend on what else runs in its own session, and
starve it past the wall-clock ceiling, where the run ends as `stalled`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from brorl.families import verify_batch
from brorl.types import Problem
from brorl.verifiers import VerifyConfig, clock
from brorl.verifiers.config import SandboxLimits
from brorl.verifiers.sandbox import run_tests
from brorl.verifiers.workers import map_with_deadline

LIMIT_S = 1.0
WORK_S = 0.3
"""CPU seconds the starved check spends, under a third of the limit; starved, it takes several
times the limit of wall time (asserted, so the test shows the starvation it relies on)."""
HOGS = 5
"""Busy processes on the shared core: the check gets at most a sixth of it, so its wall time
(about 6 * `WORK_S`) lies between the limit and the ceiling (`clock.CEILING_FACTOR * LIMIT_S`)."""

pytestmark = pytest.mark.skipif(not clock.available() or not hasattr(os, "sched_setaffinity"),
                                reason="no run delays (/proc/<pid>/schedstat) or no affinity")

STARVED_CANDIDATE = f"""
import os, time
os.sched_setaffinity(0, {{0}})
start = time.process_time()
while time.process_time() - start < {WORK_S}:
    pass
def f(x):
    return x + 3
"""


@pytest.fixture
def hog() -> Iterator[None]:
    """`HOGS` busy processes pinned to core 0, each in a session of its own, while the test
    runs."""
    processes = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"],
                                  preexec_fn=lambda: os.sched_setaffinity(0, {0}),
                                  start_new_session=True) for _ in range(HOGS)]
    time.sleep(0.2)
    try:
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait()


def _starved_check(item: int) -> float:
    """In a worker: spend `WORK_S` CPU seconds on core 0; the wall time."""
    os.sched_setaffinity(0, {0})
    started, cpu = time.monotonic(), time.process_time()
    while time.process_time() - cpu < WORK_S:
        pass
    return time.monotonic() - started


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_starved_check_is_not_timed_out(hog):
    [(status, wall)] = map_with_deadline(_starved_check, [0], workers=1, timeout_s=LIMIT_S)
    assert status == "ok"  # a wall-clock limit would have timed it out
    assert wall > LIMIT_S, f"the check was not starved ({wall:.2f} s): the test shows nothing"


def test_a_wait_in_progress_is_not_taken_for_the_runs_own_time(monkeypatch):
    """The kernel adds a wait to the run delay when the wait ends, so a process starved in
    stretches longer than its limit (a niced session beside busy ones) looks over its limit while
    it waits. Past the limit, a process that stays runnable without running is waiting: not over;
    one that runs, or sleeps (sleeping counts), is over."""
    monkeypatch.setattr(clock, "run_delay", lambda pid: 0.0)  # no wait has ended yet
    run = clock.RunClock(lambda: [1])
    run.started -= 2.0  # two seconds of wall time
    assert run.elapsed() > 1.0
    monkeypatch.setattr(clock, "progress", lambda pid: ("R", 5, 0))  # runnable, never runs
    assert not run.over(1.0) and not run.over(3.0)
    ran = iter(range(10**6))
    monkeypatch.setattr(clock, "progress", lambda pid: ("R", next(ran), 0))  # running
    assert run.over(1.0) and not run.over(3.0)
    monkeypatch.setattr(clock, "progress", lambda pid: ("S", 5, 0))  # sleeping
    assert run.over(1.0)


def test_a_starved_correct_program_keeps_its_reward(hog):
    result = run_tests(STARVED_CANDIDATE, ["assert f(1) == 4"], timeout_s=LIMIT_S)
    assert (result.status, result.passed) == ("ok", 1)
    assert result.elapsed_s > LIMIT_S, f"not starved ({result.elapsed_s:.2f} s): shows nothing"


def test_sleeping_counts_towards_the_limit():
    started = time.monotonic()
    assert map_with_deadline(_sleep, [300.0], workers=1, timeout_s=0.5) == [("timeout", None)]
    result = run_tests("import time\ntime.sleep(300)\ndef f(x):\n    return x + 3",
                       ["assert f(1) == 4"], timeout_s=0.5)
    assert result.status == "timeout"
    # each ended near its limit, not its sleep; the bound only tells the two apart (a loaded
    # machine may take seconds to end a run)
    assert time.monotonic() - started < 120


def test_the_cpu_limit_is_a_timeout():
    # RLIMIT_CPU (1 s) ends the candidate long before the 30 s time limit
    result = run_tests("while True:\n    pass", ["assert f(1) == 4"], timeout_s=30.0,
                       limits=SandboxLimits(cpu_s=1))
    assert result.status == "timeout"
    assert result.elapsed_s < 15


def test_the_wall_clock_ceiling_ends_a_run_as_stalled(monkeypatch):
    # as if the process waited for a CPU all the time: its time never grows
    monkeypatch.setattr(clock, "run_delay", lambda pid: time.monotonic())
    timeout_s = 0.2  # ceiling: CEILING_FACTOR * 0.2 = 2.4 s
    started = time.monotonic()
    assert map_with_deadline(_sleep, [300.0], workers=1, timeout_s=timeout_s) == \
        [(clock.STALLED, None)]
    result = run_tests("import time\ntime.sleep(300)", ["assert f(1) == 4"],
                       timeout_s=timeout_s)
    assert result.status == clock.STALLED
    assert time.monotonic() - started < 120  # at the ceiling, not at the end of the sleep
    problem = Problem("p", "code", "p", "?", tests=("assert f(1) == 4",))
    [verdict] = verify_batch([problem], ["```python\nimport time\ntime.sleep(30)\n```"],
                             VerifyConfig(workers=1, timeout_s=timeout_s))
    assert (verdict.reward, verdict.reason) == (0.0, clock.STALLED)


def test_the_clock_subtracts_run_delays_only(monkeypatch):
    delays = iter([1.0, 1.0, 3.0])
    monkeypatch.setattr(clock, "run_delay", lambda pid: next(delays))
    run = clock.RunClock(lambda: [123])  # first sample: 1.0
    run.started -= 5.0  # five seconds of wall time have passed
    assert 4.9 < run.elapsed() < 5.1  # no delay accrued
    assert 2.9 < run.elapsed() < 3.1  # two seconds of it were spent waiting for a CPU
