"""Run a command beside CPU burners: the suite's determinism under load.

    python -m tests.burner [--burners K] -- COMMAND...

Starts K processes (default: one per core) that spin on the CPU for as long as COMMAND runs,
then stops them and exits with COMMAND's exit code. `make stability` runs the resume tests five
times in a row this way: a result that depends on timing or load shows up as a failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

SPIN = "while True: pass"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.burner")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 1)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    burners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.burners)]
    try:
        return subprocess.run(command).returncode
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


if __name__ == "__main__":
    raise SystemExit(main())
