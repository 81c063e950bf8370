"""Wall-clock figures kept out of what DVC tracks: the `<out>.timings.json` file beside an output.

A stage's DVC output (a folder or file `<out>`) holds only what its inputs decide, so a rerun
that reproduces the same weights gives the same bytes and leaves every downstream stage up to
date. What the clock decides (seconds, throughputs, a run's orchestration share) goes to the
stage's MLflow run and to `<out>.timings.json` beside the output (`outputs/base.timings.json`
for `outputs/base`, `outputs/study/runs/prorl_s0.timings.json` for that run's folder), never
inside it. `.gitignore` and `.dvcignore` both list `*.timings.json`: git never commits the
file, and DVC leaves it out of every output and dependency hash, even inside a folder another
stage depends on (study/dvc.yaml's `runs`). Readers of a run (`brorl.evaluation.protocol.read_run`) merge it
back when it is there; a checkout that only pulled the outputs has none, and its reports say
NaN for the times.

A key names a wall-clock figure (`is_timing`) when it starts with `time/`, holds `seconds` or
ends in `_per_s`: the names docs/metrics.md gives every timing metric.

The files git tracks (`metrics/*.json`, `plots/*/eval.csv`, declared `cache: false`) hold no
timing either: a rerun that gives the same results leaves the checkout clean.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from brorl.runs.files import atomic_write_text

SUFFIX = ".timings.json"
"""What `timings_path` appends to an output's name (listed in .gitignore and .dvcignore)."""


def is_timing(key: str) -> bool:
    """Whether a metric or record key names a wall-clock figure (module docstring)."""
    return key.startswith("time/") or "seconds" in key or key.endswith("_per_s")


def split_timings(record: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the keys of `record` that are not timings, the timing keys), both in `record`'s order."""
    stable = {k: v for k, v in record.items() if not is_timing(k)}
    return stable, {k: v for k, v in record.items() if is_timing(k)}


def timings_path(out: str | Path) -> Path:
    """`<out>.timings.json`: beside the output `out`, never inside it."""
    out = Path(out)
    return out.with_name(out.name + SUFFIX)


def write_timings(out: str | Path, record: Mapping[str, Any]) -> Path:
    """Write `record` (JSON-ready) as the timings of output `out`, atomically; its path."""
    path = timings_path(out)
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def read_timings(out: str | Path) -> dict[str, Any]:
    """The timings of output `out`; {} when it has none (or the file is not a JSON object)."""
    path = timings_path(out)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def run_timings(history: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The timing part of a run's per-step metrics (one dict per step, in order) and of its
    evaluation rows (`step`, `split` and the row's timing keys: its training `seconds`)."""
    return {"history": [split_timings(m)[1] for m in history],
            "evals": [{"step": r["step"], "split": r.get("split"), **split_timings(r)[1]}
                      for r in rows]}


def merge_run_timings(history: list[dict[str, Any]], rows: list[dict[str, Any]],
                      timings: Mapping[str, Any]) -> None:
    """Put `run_timings`' record back (in place): each step's timing metrics by position, each
    row's by (step, split); a row it does not cover gets `seconds` NaN (not measured)."""
    for metrics, clock in zip(history, timings.get("history", [])):
        metrics.update(clock)
    by_row = {(t["step"], t.get("split")): t for t in timings.get("evals", [])}
    for row in rows:
        clock = by_row.get((row["step"], row.get("split")), {})
        row.update({k: v for k, v in clock.items() if is_timing(k)})
        row.setdefault("seconds", math.nan)
