"""Seconds until a bad input is refused: every case of tests/test_bad_inputs.py as a cold process.

Each case (a corrupted copy of a tiny world of splits and a policy, a bad argument, a bad
override, an unreachable PREFECT_API_URL, a read-only run folder) runs as the command a user
types: the `brorl` script (`brorl <stage> ...`, `brorl study ...`), `python -m brorl.train ...`,
`python -m commands.deploy|server ...`, a fresh interpreter each time. The table gives each case's wall
seconds from start to exit (the exit code and message checked as the test checks them), the bar
(2 s) met or not, and beside it the naive order in the same run: a cold `python -c "import M"` of
the modules the entry point's work needs (its flow module: prefect, mlflow, torch; for `python -m
brorl.train` the run loop; for deploy prefect), which an entry point that imported first and
checked after paid before any error. Ratio: case seconds / naive seconds.

Usage:
    OMP_NUM_THREADS=1 python benchmarks/bad_inputs.py [--repeats 3] [--only NAME ...]

Deliberately ignored: warm runs (the page cache is warm after the first case; the interpreter and
its imports are not), the in-process variant of the cases (the tests run those).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import Table, save  # noqa: E402
from tests import test_bad_inputs as cases  # noqa: E402

BAR_S = 2.0
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
"""This checkout's packages first (the installed `brorl` script included), from any folder."""


def command_of(case: cases.Case, argv: list[str], folder: Path) -> list[str]:
    """What a user types for the case: the `brorl` script or `python -m MODULE`."""
    prefix = cases.read_only_prefix(folder / case.read_only) if case.read_only else []
    script = Path(sys.executable).parent / "brorl"
    argv = cases.entry_argv(case.entry, argv)
    if cases.module_of(case.entry) == "commands.cli" and script.exists():
        return [*prefix, str(script), *argv]
    return [*prefix, sys.executable, "-m", cases.module_of(case.entry), *argv]


def naive_modules(case: cases.Case, argv: list[str]) -> str:
    """The imports an entry point that checked after importing paid before any error."""
    if case.entry.startswith("flow:"):
        return f"flows.{case.entry.removeprefix('flow:')}"
    if case.entry == "cli":
        flows = {"simulate", "train", "compare", "evaluate"}
        return f"flows.{argv[0]}" if argv and argv[0] in flows else "commands.cli"
    return {"train": "brorl.train.run", "study": "flows.study", "deploy": "prefect",
            "server": "commands.server"}[case.entry]


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - started, done


def run_case(name: str, world: Path, tmp: Path, repeats: int) -> tuple[float, str, list[str]]:
    """Median seconds of the case (a fresh copy of the world per run), its verdict, its
    arguments."""
    case, seconds, verdict, argv = cases.CASES[name], [], "ok", []
    for k in range(repeats):
        folder = tmp / f"{name}-{k}" / "case"
        argv, cwd = cases.prepare(case, world, folder)
        took, done = timed(command_of(case, argv, folder), cwd, {**ENV, **case.env()})
        seconds.append(took)
        if case.read_only:
            (folder / case.read_only).chmod(0o755)
        try:
            cases.assert_one_clear_line(case, folder, done.returncode, done.stdout + done.stderr)
        except AssertionError:
            verdict = f"WRONG ANSWER (exit {done.returncode})"
        shutil.rmtree(folder.parent)
    return statistics.median(seconds), verdict, argv


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs per case (median)")
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME", help="these cases")
    args = parser.parse_args(argv)
    names = sorted(args.only or cases.CASES)
    with tempfile.TemporaryDirectory(prefix="bad-inputs-") as tmp_name:
        tmp = Path(tmp_name)
        world = cases.make_world(tmp / "world")
        naive: dict[str, float] = {}
        rows = []
        for name in names:
            case = cases.CASES[name]
            seconds, verdict, case_argv = run_case(name, world, tmp, args.repeats)
            module = naive_modules(case, case_argv)
            if module not in naive:
                naive[module] = statistics.median(
                    timed([sys.executable, "-c", f"import {module}"], ROOT, ENV)[0]
                    for _ in range(args.repeats))
            bar = "yes" if seconds <= BAR_S else "NO"
            rows.append([name, case.entry, round(seconds, 2), bar, module,
                         round(naive[module], 2), round(seconds / naive[module], 2), verdict])
            print(f"{name:42s} {case.entry:14s} {seconds:6.2f} s  <= {BAR_S:g} s: {bar:3s}  "
                  f"naive ({module}) {naive[module]:6.2f} s  ratio {seconds / naive[module]:.2f}"
                  f"  {verdict}", flush=True)
    over = [row[0] for row in rows if row[3] == "NO"]
    wrong = [row[0] for row in rows if row[7] != "ok"]
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    notes = [f"{len(rows)} cases, {len(rows) - len(over)} within {BAR_S:g} s; over: "
             f"{', '.join(over) or 'none'}; wrong answers: {', '.join(wrong) or 'none'}",
             f"median {statistics.median(r[2] for r in rows):.2f} s, max "
             f"{max(r[2] for r in rows):.2f} s; {os.cpu_count()} cores, load average at the end "
             f"{' '.join(load)}"]
    print(*notes, sep="\n")
    save("bad_inputs", [Table(
        "Seconds until a bad input is refused (cold process), beside importing first",
        ["case", "entry", "seconds", f"<= {BAR_S:g} s", "naive: import first", "naive seconds",
         "ratio", "answer"], rows, notes)])


if __name__ == "__main__":
    main()
