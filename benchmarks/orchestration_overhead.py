"""What orchestration costs per training step, and per DVC stage: brorl alone against the Prefect flow.

    python benchmarks/orchestration_overhead.py                    # default arms, 10 steps each
    python benchmarks/orchestration_overhead.py --steps 6 --arms prorl

For each arm (params/prorl.yaml, params/brorl.yaml: the CPU defaults), in one run: K steps bare
(`brorl.train.Run.train` with the in-place driver, as `python -m brorl.train`) and K steps as the
Prefect flow `train` (each step an `iteration` subflow of tasks, metrics to MLflow) against one
Prefect server started for the benchmark, from the same start (`--init`, default the pipeline's
warm-up policy) on the same data. Per step, the orchestration is the step's wall time (the
iteration plus observing it: MLflow logging in the flow) minus the seconds of brorl work measured
inside the stage methods (`time/<stage>`); its share is that over the step's wall time.

The fixed cost per DVC stage: `brorl data` at CI size (a stage whose work is under a
second) against the same work called in-process and the stage's imports alone, with the shared
server (as `make run` runs stages) and with none (a temporary server per process, as before).

Prints the thread count and /proc/loadavg beside the figures: a busy second core slows all of it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import Table, save, show  # noqa: E402
from brorl.runs.timings import read_timings  # noqa: E402
from brorl.system.environment import apply_defaults  # noqa: E402
from brorl.system.servers import run_in_session  # noqa: E402

apply_defaults()  # offline, project-local environment defaults, before prefect or mlflow load


def per_step(history: list[dict]) -> dict[str, list[float]]:
    """Wall seconds, brorl work, orchestration seconds and share of each trained step."""
    out: dict[str, list[float]] = {"wall": [], "work": [], "orchestration": [], "share": [],
                                   "on_step": []}
    for m in history:
        if "time/iteration" not in m:
            continue
        wall = m["time/iteration"] + m.get("time/on_step", 0.0)
        work = sum(v for k, v in m.items() if k.startswith("time/")
                   and k not in ("time/iteration", "time/on_step", "time/orchestration_share"))
        out["wall"].append(wall)
        out["work"].append(work)
        out["orchestration"].append(wall - work)
        out["share"].append((wall - work) / wall)
        out["on_step"].append(m.get("time/on_step", 0.0))
    return out


def overrides(out: Path, steps: int, data: str, init: str) -> list[str]:
    return [f"train.run_dir={out}", f"train.checkpoint_dir={out / 'checkpoints'}",
            f"train.steps={steps}", "train.max_rollouts=null", "train.plateau_patience=null",
            f"data.path={data}", f"train.init_checkpoint={init}",
            f"tracking.metrics_dir={out / 'metrics'}", f"tracking.plots_dir={out / 'plots'}"]


def run_arm(arm: str, steps: int, data: str, init: str, tmp: Path) -> dict[str, dict]:
    """K steps of one arm bare and as the flow; the per-step figures of each."""
    from brorl.params import load_params
    from brorl.train import Run
    from flows.train import train

    params_file = ROOT / "params" / f"{arm}.yaml"
    Run.open(load_params(params_file, overrides(tmp / f"{arm}-bare", steps, data, init)),
             ROOT, resume=False).train()
    train(str(params_file), overrides(tmp / f"{arm}-flow", steps, data, init))
    # each step's seconds live beside the run folder, not in its summary (brorl.runs.timings)
    return {kind: per_step(read_timings(tmp / f"{arm}-{kind}")["history"])
            for kind in ("bare", "flow")}


def stage_costs(tmp: Path, api_url: str | None) -> dict[str, float]:
    """Seconds of a CI-sized `data` stage process, its imports alone, and its work in-process."""
    from brorl.params import load_params

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PREFECT_API_URL", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    sets = [f"data.path={tmp / 'data' / 'problems'}", f"tracking.metrics_dir={tmp / 'data'}"]
    # what the stage imports, reasoning_gym included (brorl.data loads it only to generate)
    imports = [sys.executable, "-c",
               "import flows.data, tasks.data, brorl.data, reasoning_gym, prefect, mlflow"]
    started = time.perf_counter()
    subprocess.run(imports, cwd=ROOT, env=env, check=True, capture_output=True)
    import_s = time.perf_counter() - started
    stage = [sys.executable, "-m", "commands.cli", "data", "--params", "params/tiny_ci.yaml",
             *(a for s in sets for a in ("-S", s))]
    started = time.perf_counter()
    # without api_url the stage starts a temporary server: stopped with it on SIGTERM
    run_in_session(stage, cwd=ROOT, env=env, capture=True).check_returncode()
    stage_s = time.perf_counter() - started
    from brorl.data import DataConfig, make_splits, save_splits

    config = DataConfig.from_params(load_params(ROOT / "params/tiny_ci.yaml", sets).data)
    started = time.perf_counter()
    save_splits(make_splits(config), tmp / "data-inproc")
    work_s = time.perf_counter() - started
    return {"stage": stage_s, "imports": import_s, "work": work_s,
            "fixed": stage_s - import_s - work_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps per arm and mode "
                        "(medians of fewer steps move by 0.05 s between runs)")
    parser.add_argument("--arms", nargs="+", default=["prorl", "brorl"])
    parser.add_argument("--data", default=str(ROOT / "outputs/data/problems"))
    parser.add_argument("--init", default=str(ROOT / "outputs/prorl_warmup/policy"),
                        help="start checkpoint of every run (default: the pipeline's warm-up)")
    parser.add_argument("--skip-stage", action="store_true", help="skip the per-stage cost")
    args = parser.parse_args(argv)
    for path, what in ((args.data, "--data"), (args.init, "--init")):
        if not Path(path).exists():
            print(f"error: {what} {path} does not exist; run `make run` (or `dvc repro "
                  "prorl_warmup`) first, or pass another folder.", file=sys.stderr)
            return 2
    from brorl.system.servers import free_port
    from commands import server
    from commands.server import PIPELINE_SERVER

    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"loadavg {Path('/proc/loadavg').read_text().split()[:3]}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        with ExitStack() as stack:  # the server `make run` starts for a pipeline run
            settings = stack.enter_context(server.database(tmp / "prefect", tmp / "pg.log"))
            url = stack.enter_context(server.running(
                free_port(), tmp / "prefect", tmp / "server.log",
                settings={**settings, **PIPELINE_SERVER}))
            os.environ["PREFECT_API_URL"] = url
            results = {arm: run_arm(arm, args.steps, args.data, args.init, tmp)
                       for arm in args.arms}
            shared = None if args.skip_stage else stage_costs(tmp / "shared", url)
        os.environ.pop("PREFECT_API_URL")
        temporary = None if args.skip_stage else stage_costs(tmp / "temporary", None)
    def spread(values: list[float], percent: bool = False) -> str:
        scale, unit = (100, "%") if percent else (1, "")
        return " / ".join(f"{scale * v:.{1 if percent else 3}f}{unit}"
                          for v in (min(values), statistics.median(values), max(values)))

    steps = Table(f"Per training step, bare (brorl's loop alone) and as the Prefect flow with "
                  f"MLflow logging ({args.steps} steps each, first included): min / median / max",
                  ["arm", "mode", "step s", "orchestration s", "orchestration share",
                   "observing the step s"],
                  [[arm, mode, spread(f["wall"]), spread(f["orchestration"]),
                    spread(f["share"], percent=True), spread(f["on_step"])]
                   for arm, modes in results.items() for mode, f in modes.items()],
                  [f"{arm}: flow - bare, median step "
                   f"{statistics.median(m['flow']['wall']) - statistics.median(m['bare']['wall']):+.3f} s"
                   for arm, m in results.items()])
    tables = [steps]
    stages = [[name, round(c["stage"], 2), round(c["imports"], 2), round(c["work"], 2),
               round(c["fixed"], 2)] for name, c in (("shared server", shared),
                                                      ("temporary server", temporary)) if c]
    if stages:
        tables.append(Table("A DVC stage (`data`, CI size): the process's seconds",
                            ["Prefect server", "process", "imports", "work", "fixed"], stages))
    show(tables)
    save("orchestration_overhead", tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
