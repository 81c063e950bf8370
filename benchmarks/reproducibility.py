"""How far `make run`'s results move with the machine: the tiny pipeline under other kernel paths
and thread counts, each in a fresh clone of this checkout's last commit, one at a time.

Every condition runs `dvc repro compare` as `make run` does (one Prefect server, one MLflow store
in the clone), with torch's intra-op threads and the variables that choose the CPU's kernel paths
(`brorl/system/environment.py` pins MKL's `MKL_CBWR=AVX2,STRICT` and torch's `ATEN_CPU_CAPABILITY=avx2`
on x86 unless set) given per condition; `MKL_ENABLE_INSTRUCTIONS=SSE4_2` stands in for a CPU
without AVX2. The table gives the headline metrics (the base model's math score, the ProRL
warm-up's rollouts until its plateau, the comparison's paired delta and its interval) and whether
the clone's `dvc.lock`, `metrics/` and `plots/` came out equal to the committed ones (`git
status` clean). The naive baseline is the committed run itself (`make run`'s own condition).

Deliberately ignored: wall-clock figures (they do not decide a result); the simulator stage.
Usage: python benchmarks/reproducibility.py [--conditions pinned-1,unpinned-1,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.record import Table, save, show  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACKED = ("dvc.lock", "metrics", "plots")
"""What `make run` writes that git tracks."""
CONDITIONS: dict[str, tuple[str, dict[str, str]]] = {
    "pinned-1": ("pinned kernel paths, 1 thread (make run)", {"RUN_THREADS": "1"}),
    "pinned-2": ("pinned kernel paths, 2 threads", {"RUN_THREADS": "2"}),
    "unpinned-1": ("the CPU's own kernel paths, 1 thread",
                   {"RUN_THREADS": "1", "MKL_CBWR": "AUTO", "ATEN_CPU_CAPABILITY": "avx512"}),
    "unpinned-2": ("the CPU's own kernel paths, 2 threads",
                   {"RUN_THREADS": "2", "MKL_CBWR": "AUTO", "ATEN_CPU_CAPABILITY": "avx512"}),
    "sse4_2": ("MKL held to SSE4.2 (as a CPU without AVX2), 1 thread",
               {"RUN_THREADS": "1", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}),
}
"""Name -> (what it stands for, its variables; RUN_THREADS sets OMP and MKL threads)."""


def run_condition(commit: str, variables: dict[str, str], folder: Path) -> list:
    """The headline metrics of the pipeline run in a fresh clone of `commit` under `variables`,
    and whether the tracked files it writes equal the committed ones."""
    clone = folder / "repo"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(clone)], check=True,
                   timeout=300)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True, timeout=300)
    threads = variables.get("RUN_THREADS", "1")
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env |= {k: v for k, v in variables.items() if k != "RUN_THREADS"}
    env |= {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONPATH": str(clone),
            "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "BRORL_PYTHON": sys.executable,
            "MLFLOW_TRACKING_URI": f"sqlite:///{clone / 'mlflow.db'}"}
    subprocess.run([sys.executable, "-m", "commands.server", "--pipeline", "--",
                    str(bin_dir / "dvc"), "repro", "compare"], cwd=clone, env=env, check=True,
                   stdout=subprocess.DEVNULL, timeout=3600)
    metrics = {name: json.loads((clone / "metrics" / f"{name}.json").read_text())
               for name in ("base", "prorl_warmup", "compare")}
    changed = subprocess.run(["git", "status", "--porcelain", "--", *TRACKED], cwd=clone,
                             capture_output=True, text=True, check=True).stdout.strip()
    c = metrics["compare"]
    return [metrics["base"]["math"], int(metrics["prorl_warmup"]["rollouts"]), c["delta"],
            f"{c['ci_low']} to {c['ci_high']}", "yes" if not changed else "no"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--conditions", default=",".join(CONDITIONS),
                        help=f"comma-separated, of {', '.join(CONDITIONS)}")
    args = parser.parse_args(argv)
    names = args.conditions.split(",")
    unknown = [n for n in names if n not in CONDITIONS]
    if unknown:
        parser.error(f"unknown condition(s) {unknown}; choose from {', '.join(CONDITIONS)}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()
    rows = []
    for name in names:
        what, variables = CONDITIONS[name]
        with tempfile.TemporaryDirectory(prefix="brorl-repro-") as tmp:
            rows.append([what, *run_condition(commit, variables, Path(tmp))])
        print(*rows[-1], sep=" | ", flush=True)
    tables = [Table(
        f"make run's headline metrics by kernel path and thread count (commit {commit})",
        ["condition", "base math", "warm-up rollouts", "compare delta", "delta 95% CI",
         "lock, metrics, plots as committed"], rows,
        ["each condition in a fresh clone of the commit, one at a time; the committed run is "
         "make run's own condition (pinned kernel paths, 1 thread)"])]
    show(tables)
    save("reproducibility", tables)


if __name__ == "__main__":
    main()
