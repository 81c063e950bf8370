"""Where benchmark figures live: one JSON file per benchmark, the latest run per machine.

Every benchmark script ends with `show(tables)` (printed as Markdown) and `save(name, tables)`:
the tables, with the command that produced them, the machine (CPU model, cores, GPU if any) and
the date, written atomically to `benchmarks/results/<name>.json` under the machine's key,
replacing that machine's previous run. `python benchmarks/docs.py` renders every results file
into `docs/benchmarks.md`, so a figure in the docs always stands beside the command, machine and
date that gave it; older runs live in git history only.

Deliberately ignored: keeping several runs per machine (rerun the benchmark to update its row),
statistics across machines.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RESULTS_ENV = "BRORL_BENCHMARK_RESULTS"
"""Set to a folder, benchmarks record there instead of `RESULTS` (a self-check's figures, which
must not replace a machine's recorded ones)."""


def results_folder() -> Path:
    """Where `save` records: `RESULTS`, or the folder `RESULTS_ENV` names."""
    return Path(os.environ[RESULTS_ENV]) if os.environ.get(RESULTS_ENV) else RESULTS
"""Folder of the results files (committed: docs/benchmarks.md is generated from it)."""


@dataclass
class Table:
    """One printed table: a title, its column names and rows (numbers or strings)."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)
    """Lines printed under the table (what a figure means, the load while it ran)."""


def show(tables: list[Table]) -> None:
    """Print tables as Markdown, each with its title above and its notes below."""
    for table in tables:
        print(f"\n{table.title}\n| " + " | ".join(table.columns) + " |")
        print("|" + "|".join("---" for _ in table.columns) + "|")
        print("\n".join("| " + " | ".join(str(v) for v in row) + " |" for row in table.rows))
        for note in table.notes:
            print(note)


def announce(settings: str) -> str:
    """Print the run's CPU count, affinity and `settings`, then the load average before it
    starts (other processes skew the figures); returns that load average line."""
    print(f"cpu_count={os.cpu_count()} affinity={len(os.sched_getaffinity(0))} {settings}")
    before = Path("/proc/loadavg").read_text().strip()
    print("loadavg before:", before)
    return before


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else `platform.processor()`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_model() -> str | None:
    """The first CUDA device's name, or None (torch imported only if a benchmark already did)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu_model()}


def machine_key(info: dict[str, Any]) -> str:
    """The key of a machine in a results file: its GPU if any, else its CPU and core count."""
    return info["gpu"] or f"{info['cpu']} x{info['cores']}"


def command(argv: list[str] | None = None) -> str:
    """The command line that ran the benchmark, as a user would type it from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    try:
        argv[0] = str(script.resolve().relative_to(RESULTS.parents[1]))
    except ValueError:
        pass
    return "python " + shlex.join(argv)


def save(name: str, tables: list[Table], *, argv: list[str] | None = None,
         results: Path | None = None) -> Path:
    """Record this run of benchmark `name` (replacing the same machine's previous one) in
    `results` (default: `results_folder()`)."""
    results = results_folder() if results is None else results
    info = machine()
    path = results / f"{name}.json"
    runs = json.loads(path.read_text()) if path.is_file() else {}
    runs[machine_key(info)] = {
        "machine": info,
        "date": datetime.date.today().isoformat(),
        "command": command(argv),
        "load": _loadavg(),
        "tables": [asdict(t) for t in tables],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(json.dumps(runs, indent=1, sort_keys=True) + "\n")
    os.replace(f.name, path)
    print(f"recorded in {path.relative_to(results.parents[1]) if results == RESULTS else path}"
          " (python benchmarks/docs.py renders docs/benchmarks.md)")
    return path


def _loadavg() -> str | None:
    """The 1, 5 and 15 minute load averages when the run ended (other work skews figures)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return None
