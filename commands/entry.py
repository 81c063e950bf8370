"""The one command-line shape of every flow module: `python -m flows.NAME --params FILE [-S k=v ...]`.

DVC stages and the Makefile call flows this way, so all share the params loading and its errors.
Each flow module opens with

    if __name__ == "__main__":
        from commands.entry import main
        main("NAME")

so that `main` runs before the module's own imports (prefect, mlflow, torch): it applies the
environment defaults (`brorl.environment`), parses the arguments, loads the params, checks every
file the flow's stage reads (`brorl.preflight.check_inputs`) and, when `PREFECT_API_URL` is set,
that a server answers there. A bad one prints one `error:` line and exits with code 2 within
about a second, before any Prefect server, model or MLflow run starts; only then is the flow
module imported and its flow run. The `brorl` command (`commands/cli.py`) runs the same `check`.
`python -m flows.study` takes a mode instead (`--warmup`, `--run RUN`, ...): `study_main`.
Every command works in the checkout it is started in (`brorl.checkout`: `$BRORL_ROOT`, else the
folder from the working directory up that holds dvc.yaml and params/); outside one it stops
with one `error:` line saying so (`environment`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
import urllib.error
import urllib.request
from typing import Any, NoReturn

from brorl.checkout import CheckoutError, find_root
from brorl.environment import apply_defaults
from brorl.servers import interrupts

API_TIMEOUT_S = 3.0
"""How long `prefect_api_error` waits for an answer (a refused connection answers at once)."""


def prefect_api_error(environ: dict[str, str] | None = None,
                      timeout_s: float = API_TIMEOUT_S) -> str | None:
    """Why no Prefect server answers at `PREFECT_API_URL` (one line), None when one does or the
    variable is unset (each flow then starts its own). Any HTTP reply counts as an answer (a
    server that wants a key still is one); only a connection that fails does not."""
    url = (os.environ if environ is None else environ).get("PREFECT_API_URL", "").strip()
    if not url:
        return None
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, socket.timeout):
            reason = f"no reply within {timeout_s:g} s"
        return (f"PREFECT_API_URL = {url}: no Prefect server answers there ({reason}); start "
                "one (`python -m commands.server --port PORT`, `make serve`) and point "
                "PREFECT_API_URL at it, or unset PREFECT_API_URL so that the flow starts its own.")


def check(params_path: str, overrides: list[str], stage: str | None = None, *,
          api: bool = False, **inputs: Any) -> None:
    """Load the params, check the files `stage` reads (`check_inputs`, `inputs` its keywords)
    and, with `api`, the Prefect server: on failure print one `error:` line and exit with code 2;
    print the checks' notes as `note:` lines."""
    from brorl.params import ParamsError, load_params
    from brorl.preflight import InputError, check_inputs

    try:
        params = load_params(params_path, overrides)
        notes = check_inputs(params, stage, find_root(), **inputs) if stage else []
    except (ParamsError, InputError, CheckoutError) as err:
        fail(str(err))
    if api and (error := prefect_api_error()):
        fail(error)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def environment() -> None:
    """`apply_defaults()`, or, outside any checkout, one `error:` line and exit code 2."""
    try:
        apply_defaults()
    except CheckoutError as err:
        fail(str(err))


EXAMPLES: dict[str, tuple[str, str]] = {
    "simulate": ("params/simulate_ci.yaml", "simulate.steps=200"),
    "data": ("params/tiny_ci.yaml", "data.math_per_task=50"),
    "model": ("params/tiny_ci.yaml", "model.hidden_size=64"),
    "base": ("params/tiny_ci.yaml", "base.max_steps=50"),
    "train": ("params/prorl.yaml", "train.run_dir=outputs/mine"),
    "evaluate": ("params/prorl.yaml", "train.eval_samples=2"),
    "compare": ("params/compare.yaml", "compare.budget_rollouts=1024"),
}
"""Each flow's `--help` example: a params file it runs on and an override of a key it reads
(tests/test_help_examples.py loads each pair)."""


def parser(name: str) -> argparse.ArgumentParser:
    params, override = EXAMPLES[name]
    p = argparse.ArgumentParser(prog=f"python -m flows.{name}")
    p.add_argument("--params", required=True, help=f"YAML params file, e.g. {params}")
    p.add_argument("-S", "--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help=f"override one params key, e.g. {override}")
    if name == "train":
        p.add_argument("--allow-changed-params", action="store_true",
                       help="resume a checkpoint written under other params (by default only "
                            "the stop rules and schedules may change: brorl/run_files.py)")
    return p


def run_flow_cli(name: str, argv: list[str] | None = None) -> Any:
    """Parse `--params FILE` and repeated `-S key=value`, check them, then import `flows.<name>`
    and call its flow `<name>(params_path, overrides)`; returns the flow's summary."""
    environment()
    args = parser(name).parse_args(argv)
    allow = {"allow_changed_params": args.allow_changed_params} if name == "train" else {}
    check(args.params, args.overrides, name, api=True, **allow)
    from flows import prefect_settings

    # interrupts: SIGTERM leaves as Ctrl-C does, through the exit that stops the temporary
    # Prefect server a flow run starts when no PREFECT_API_URL is set
    with prefect_settings(), interrupts():  # prefect_settings: no heartbeat thread to join
        flow = getattr(importlib.import_module(f"flows.{name}"), name)
        return flow(params_path=args.params, overrides=list(args.overrides))


def main(name: str) -> NoReturn:
    """`python -m flows.<name>`: run the flow (`run_flow_cli`, `study_main` for the study), then
    exit with code 0."""
    if name == "study":
        study_main()
    else:
        run_flow_cli(name)
    raise SystemExit(0)


STUDY_MODES = ("warmup", "pool", "plan", "start", "report")
"""The study's flows other than `--run RUN` (flows/study.py's docstring)."""


def study_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flows.study",
                                description="The flows of a study (docs/study.md).")
    p.add_argument("--params", required=True,
                   help="the study's params file, e.g. params/study_ci.yaml")
    p.add_argument("-S", "--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override one params key, e.g. study.margin=0.05")
    mode = p.add_mutually_exclusive_group(required=True)
    for name in STUDY_MODES:
        mode.add_argument(f"--{name}", action="store_true", help=f"the study-{name} flow")
    mode.add_argument("--run", metavar="RUN", help="train one run, e.g. prorl_s0")
    return p


def check_study(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the study's arguments, load the params and check the files the mode reads (the
    study's plan, `brorl.study.plan`, is light); on failure print one `error:` line and exit
    with code 2."""
    from brorl.model.checks import check_checkpoint
    from brorl.params import ParamsError, load_params
    from brorl.preflight import InputError, check_inputs, check_split
    from brorl.study.frozen import check as frozen
    from brorl.study.plan import find_run, plan_runs, run_params, warmup_dir, warmup_params
    from brorl.study.progress import will_resume

    args = study_parser().parse_args(argv)
    try:
        params, root = load_params(args.params, args.overrides), find_root()
        if args.warmup and not frozen(params, root, "warmup"):  # the data and the base policy
            check_inputs(warmup_params(params), "train", root)
        if args.pool:  # the train split and the study's warm-up policy
            check_split(root / params.data.path, "train")
            check_checkpoint(root / warmup_dir(params) / "policy", "the study's warm-up policy")
        if args.run or args.start:  # the pool and the warm-up policy (or the run's checkpoint)
            run = find_run(params.study, args.run) if args.run else plan_runs(params.study)[0]
            # a folder of other params or a finished run starts over: no checkpoint to check
            resume = bool(args.run) and will_resume(params, root, run.id)
            check_inputs(run_params(params, run), "train", root, resume=resume)
    except (ParamsError, InputError, ValueError, CheckoutError) as err:
        fail(str(err))
    if error := prefect_api_error():
        fail(error)
    return args


def study_main(argv: list[str] | None = None) -> Any:
    """`python -m flows.study`: apply the environment defaults, check (`check_study`), then
    import `flows.study` and run the mode's flow; returns its summary."""
    environment()
    args = check_study(argv)
    from flows import prefect_settings

    study = importlib.import_module("flows.study")  # prefect, mlflow, torch: after the checks
    started = os.environ.get("BRORL_STUDY_STARTED")  # epoch seconds, set by `make study`
    with prefect_settings(), interrupts():  # as run_flow_cli
        if args.run:
            return study.study_run(args.params, args.run, args.overrides,
                                   float(started) if started else None)
        flows = {"warmup": study.study_warmup, "pool": study.study_pool,
                 "plan": study.study_plan, "start": study.study_start,
                 "report": study.study_report}
        name = next(m for m in STUDY_MODES if getattr(args, m))
        return flows[name](args.params, args.overrides)
