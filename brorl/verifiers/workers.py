"""Run a check over many items in forked worker processes with a time limit per item.

Used by the math and reasoning verifiers, whose library calls (sympy inside math-verify, some
reasoning-gym scorers) can hang and cannot be interrupted from a thread. Each worker is a forked
child that handles its share of the items one at a time and sends each result back at once; the
parent kills a worker whose current item runs past `timeout_s`, records that item as timed out,
and forks a fresh worker for the rest of its share. The limit counts the item's time on the
worker's `clock.RunClock` (wall time less the time the worker waited for a CPU), so a busy
machine never turns an answer into a timeout; a worker starved past the wall-clock ceiling
(`clock.CEILING_FACTOR` times the limit) records its item as `stalled`. A worker that dies
records its current item as an error. Fork (not spawn) so that workers start in milliseconds
with the parent's imports and the callable need not be picklable.

Deliberately ignored: platforms without `fork` (brorl verifies on Linux), and the usual caveat of
forking a multi-threaded parent (a worker that deadlocks on an inherited lock only costs its
item's time limit, then is killed).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from brorl.types import Problem
from brorl.verifiers.clock import CEILING_FACTOR, CHECK_S, STALLED, RunClock
from brorl.verifiers.verdict import Verdict, error_verdict

Outcome = tuple[str, Any]
"""`("ok", value)`, `("timeout", None)`, `("stalled", None)` or `("error", message)`."""


def default_workers() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def outcome_verdict(outcome: Outcome) -> Verdict:
    """The verdict for an outcome whose `ok` value is already a `Verdict`."""
    status, value = outcome
    if status == "ok":
        return value
    if status in ("timeout", STALLED):
        return Verdict(0.0, status)
    return error_verdict(RuntimeError(str(value)))


def judge_answers(check: Callable[[tuple[Problem, str]], Verdict], problems: Sequence[Problem],
                  answers: Sequence[str | None], *, workers: int | None,
                  timeout_s: float) -> list[Verdict]:
    """One verdict per (problem, extracted answer), in order: `no_answer` where the answer is
    None, without a worker; otherwise `check((problem, answer))` once per distinct (problem id,
    answer) pair, under `map_with_deadline`.

    Extraction is a regex the parent runs itself; only a library's judgement of an answer can
    hang and needs a forked worker with a deadline. Forking is what a small batch costs (about
    20 ms a worker beside a loaded policy, most of an N=16 step's verification), and most of a
    weak policy's responses hold no answer; many distinct responses also share one answer.
    """
    slots: dict[tuple[str, str], int] = {}
    todo: list[tuple[Problem, str]] = []
    where: list[int | None] = []
    for problem, answer in zip(problems, answers, strict=True):
        if answer is None:
            where.append(None)
            continue
        key = (problem.id, answer)
        if key not in slots:
            slots[key] = len(todo)
            todo.append((problem, answer))
        where.append(slots[key])
    verdicts = [outcome_verdict(o) for o in
                map_with_deadline(check, todo, workers=workers, timeout_s=timeout_s)] if todo else []
    return [Verdict(0.0, "no_answer") if i is None else verdicts[i] for i in where]


def map_with_deadline(
    check: Callable[[Any], Any], items: Sequence[Any], *, workers: int | None, timeout_s: float
) -> list[Outcome]:
    """`check(item)` for every item, in order, each bounded by `timeout_s` seconds of its
    worker's time (`clock.RunClock`: wall time less the waits for a CPU) and by a wall-clock
    ceiling of `clock.CEILING_FACTOR` times that (`stalled`).

    `workers` forked processes share the items (None: the available cores).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s} must be positive: it bounds each check's time")
    outcomes: list[Outcome | None] = [None] * len(items)
    n_workers = max(1, min(workers or default_workers(), len(items)))
    shares = [list(range(w, len(items), n_workers)) for w in range(n_workers)]
    running = [_Worker(check, items, share, timeout_s) for share in shares if share]
    ceiling = CEILING_FACTOR * timeout_s
    while running:
        # an item's time grows no faster than the wall clock: none can run out sooner
        soonest = min(min(timeout_s - w.clock.elapsed(), ceiling - w.clock.wall())
                      for w in running)
        wait([w.conn for w in running], timeout=max(CHECK_S, soonest))
        for worker in running:
            worker.poll(outcomes)
            if worker.share and worker.clock.over(timeout_s):
                worker.fail(outcomes, ("timeout", None))
            elif worker.share and worker.clock.wall() > ceiling:
                worker.fail(outcomes, (STALLED, None))
        for worker in running:
            if not worker.share:
                worker.stop()
        running = [w for w in running if w.share]
    return [o if o is not None else ("error", "no outcome") for o in outcomes]


class _Worker:
    """One forked child working through `share` (item indices, in order) and its pipe."""

    def __init__(self, check: Callable, items: Sequence[Any], share: list[int], timeout_s: float):
        self.check, self.items, self.share, self.timeout_s = check, items, share, timeout_s
        self._fork()

    def _fork(self) -> None:
        parent_conn, child_conn = mp.Pipe(duplex=False)
        args = (self.check, self.items, list(self.share), child_conn)
        self.process = mp.get_context("fork").Process(target=_work, args=args)
        self.process.start()
        child_conn.close()
        self.conn = parent_conn
        pid = self.process.pid
        self.clock = RunClock(lambda: (pid,))
        """The time of the item in progress (restarted at each result)."""

    def poll(self, outcomes: list) -> None:
        """Record every result the child has sent; a child that died fails its current item."""
        try:
            while self.share and self.conn.poll():
                index, outcome = self.conn.recv()
                outcomes[index] = outcome
                self.share.remove(index)
                self.clock.restart()
        except (EOFError, OSError):
            self.fail(outcomes, ("error", "worker process died"))

    def fail(self, outcomes: list, outcome: Outcome) -> None:
        """Kill the child, record `outcome` for its current item, fork anew for the rest."""
        self.stop()
        outcomes[self.share.pop(0)] = outcome
        if self.share:
            self._fork()

    def stop(self) -> None:
        """Kill the child (if still running) and reap it."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


def _work(check: Callable, items: Sequence[Any], share: list[int], conn: Connection) -> None:
    """Child body: check each item of the share and send `(index, outcome)` at once."""
    for index in share:
        try:
            outcome: Outcome = ("ok", check(items[index]))
        except Exception as exc:  # noqa: BLE001 - reported to the parent as the item's outcome
            outcome = ("error", f"{type(exc).__name__}: {exc}"[:200])
        conn.send((index, outcome))
    conn.close()
