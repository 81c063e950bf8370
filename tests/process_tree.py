"""The process tree as /proc shows it: what the sandbox tests check is gone after a run."""

from __future__ import annotations

import os
import time
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree (zombies included)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(int(entry))) is not None:
            parent[int(entry)] = int(fields[1])
    found, frontier = [], {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier}
        found += sorted(frontier)
    return found


def settled(probe, *, attempts: int = 50, pause_s: float = 0.1):
    """`probe()` once it is falsy, else its last value: a process that has just closed its last
    descriptor takes a moment to leave /proc; one that stays is really left behind."""
    value = probe()
    for _ in range(attempts):
        if not value:
            break
        time.sleep(pause_s)
        value = probe()
    return value
