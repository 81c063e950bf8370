"""Serve flows as scheduled Prefect deployments (Prefect 3 `serve` of `flow.to_deployment`).

    python -m commands.deploy --params params/prorl.yaml --train-cron "0 2 * * *" \
        --evaluate-interval 3600

registers one deployment per served flow with the server at $PREFECT_API_URL and runs their flow
runs as child processes until Ctrl-C; stopping pauses the schedules. `make serve` starts a local
server first (`commands/server.py`). Each deployment is named after the params file
(`train/prorl`) and its parameters are that file, the deployment's own folders
(`scheduled_overrides`: a served flow never writes into, or resumes, a DVC stage's outputs) and
the `-S` overrides, validated here so that a typo fails now, not at 2 AM: the params, the
schedules' shape (`check_schedules`) and the server at $PREFECT_API_URL are checked before
prefect loads, so a bad one answers in about a second. A flow module is imported only when
served, so the table may name flows that a checkout lacks; serving one of those fails with a
clear message.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from typing import Any

from brorl.params import ParamsError, load_params
from commands.entry import environment, prefect_api_error

# Served flows: deployment prefix -> (flow "module:function", default schedule).
# A schedule is ("cron", "MIN HOUR DAY MONTH WEEKDAY") or ("interval", seconds).
SERVED: dict[str, tuple[str, tuple[str, str | float]]] = {
    "train":    ("flows.train:train",       ("cron", "0 2 * * *")),   # nightly at 02:00
    "evaluate": ("flows.evaluate:evaluate", ("cron", "0 6 * * *")),   # daily, after training
    "simulate": ("flows.simulate:simulate", ("cron", "0 3 * * 0")),   # Sundays at 03:00
}
DEFAULT_FLOWS = ("train", "evaluate")
SCHEDULED_DIR = "outputs/scheduled"
"""Where served flows write: `<SCHEDULED_DIR>/<flow>/<params stem>/`, beside the pipeline's stage
outputs, never in them (a nightly train into `outputs/prorl` would resume and change the `prorl`
stage's finished run behind DVC's back)."""


def scheduled_overrides(name: str, params: str | Path) -> list[str]:
    """The `-S` overrides that give deployment `<name>/<params stem>` folders of its own: its
    outputs, DVC-style metrics and plots and, for `train`, its run and checkpoints. The command
    line's `-S` overrides come after these, so a user's choice wins. `evaluate` still reads the
    params' own run (`train.run_dir`): it scores, never writes there."""
    folder = f"{SCHEDULED_DIR}/{name}/{Path(params).stem}"
    own = [f"tracking.output_dir={folder}", f"tracking.metrics_dir={folder}/metrics",
           f"tracking.plots_dir={folder}/plots"]
    if name == "train":
        own += [f"train.run_dir={folder}/run", f"train.checkpoint_dir={folder}/run/checkpoints"]
    return own


def deployment_overrides(name: str, args: argparse.Namespace) -> list[str]:
    """Every override deployment `name` runs with: its own folders, then the command line's."""
    return [*scheduled_overrides(name, args.params), *args.overrides]


class DeployError(RuntimeError):
    """A served flow cannot be built (missing module, bad schedule)."""


def load_flow(name: str) -> Any:
    """Import the flow `name` of SERVED; a module this checkout lacks raises DeployError."""
    module_name, _, function = SERVED[name][0].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        raise DeployError(f"flow {name!r} is not available: no module {module_name} "
                          f"({module_name.replace('.', '/')}.py) in this checkout.") from None
    return getattr(module, function)


def schedule_of(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """`to_deployment` keyword for the flow's schedule: the command line's, else the table's."""
    cron, interval = getattr(args, f"{name}_cron"), getattr(args, f"{name}_interval")
    if cron is not None:
        return {"cron": cron}
    if interval is not None:
        return {"interval": interval}
    kind, value = SERVED[name][1]
    return {kind: value}


CRON_FIELD = re.compile(r"[0-9A-Za-z*?/,#-]+")
"""What a field of a cron expression is made of (numbers, names, `* ? / , - # L W`)."""


def check_schedules(args: argparse.Namespace) -> None:
    """DeployError for a schedule option that cannot be one: a cron expression without 5 to 7
    fields of cron characters (an `@daily` style name passes), an interval that is not positive.
    Prefect's own check (`build_deployments`) still runs on what passes."""
    for name in SERVED:
        cron, interval = getattr(args, f"{name}_cron"), getattr(args, f"{name}_interval")
        fields = (cron or "").split()
        if cron is not None and not cron.strip().startswith("@") and not (
                5 <= len(fields) <= 7 and all(CRON_FIELD.fullmatch(f) for f in fields)):
            raise DeployError(f"{name}: {cron!r} is not a cron expression (five fields: minute "
                              f"hour day month weekday); give --{name}-cron a cron expression "
                              f"(e.g. '0 2 * * *') or --{name}-interval seconds.")
        if interval is not None and not interval > 0:
            raise DeployError(f"{name}: --{name}-interval {interval:g} is not a positive number "
                              "of seconds.")


def build_deployments(args: argparse.Namespace) -> list[Any]:
    """One RunnerDeployment per flow in `args.flow`, parameters checked against the schema."""
    for name in args.flow or DEFAULT_FLOWS:
        load_params(args.params, deployment_overrides(name, args))
    from prefect.types.entrypoint import EntrypointType  # after the check: a typo fails fast

    params_path = str(Path(args.params).resolve())  # flow runs start in the serving process's cwd
    deployments = []
    for name in args.flow or DEFAULT_FLOWS:
        flow = load_flow(name)
        try:
            deployments.append(flow.to_deployment(
                name=Path(args.params).stem, **schedule_of(name, args),
                parameters={"params_path": params_path,
                            "overrides": deployment_overrides(name, args)},
                tags=["brorl"], description=f"{name} with {args.params}",
                entrypoint_type=EntrypointType.MODULE_PATH))  # `flows.train.train`, any cwd
        except ValueError as err:  # an invalid cron string or interval
            errors = getattr(err, "errors", None)  # pydantic's, one per bad field
            why = errors()[0]["msg"] if callable(errors) else str(err).splitlines()[0]
            raise DeployError(f"{name}: {why.removeprefix('Value error, ')}; give --{name}-cron "
                              f"a cron expression (e.g. '0 2 * * *') or --{name}-interval "
                              "seconds.") from None
    return deployments


def parser() -> argparse.ArgumentParser:
    """The command line: which flows, their params and one schedule option pair per SERVED row."""
    p = argparse.ArgumentParser(prog="python -m commands.deploy",
                                description=__doc__.split("\n")[0])
    p.add_argument("--params", required=True,
                   help="YAML params file passed to every served flow, e.g. params/prorl.yaml")
    p.add_argument("-S", "--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override one params key, e.g. train.steps=5")
    p.add_argument("--flow", action="append", choices=sorted(SERVED), metavar="NAME",
                   help=f"serve this flow (repeatable; default: {' and '.join(DEFAULT_FLOWS)}); "
                        f"one of {', '.join(SERVED)}")
    p.add_argument("--check", action="store_true",
                   help="check the params and schedules, then exit (`make serve` and `brorl "
                        "serve` run this before they start the server)")
    p.add_argument("--limit", type=int, default=1,
                   help="most flow runs at once (default 1: the CPU flows would share the cores)")
    for name, (_, (kind, value)) in SERVED.items():
        group = p.add_mutually_exclusive_group()
        group.add_argument(f"--{name}-cron", metavar="EXPR",
                           help=f"cron schedule of {name} (default {kind} {value})")
        group.add_argument(f"--{name}-interval", type=float, metavar="SECONDS",
                           help=f"interval schedule of {name}, in seconds")
    return p


def main(argv: list[str] | None = None) -> None:
    environment()
    args = parser().parse_args(argv)
    try:
        for name in args.flow or DEFAULT_FLOWS:
            load_params(args.params, deployment_overrides(name, args))
        check_schedules(args)
        if args.check:
            return
        if error := prefect_api_error():
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2)
        from flows import prefect_home

        prefect_home()
        deployments = build_deployments(args)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except DeployError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    from prefect import serve

    try:
        serve(*deployments, limit=args.limit)
    finally:
        pause(deployments)


def pause(deployments: list) -> None:
    """Pause the served schedules, however serving ended (Ctrl-C, SIGTERM, an error).

    Prefect's runner also pauses on a clean shutdown, but a SIGTERM that lands while a flow run
    is in flight can end the process before that pause reaches the server; this one is ours.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for served in deployments:
            try:
                found = client.read_deployment_by_name(f"{served.flow_name}/{served.name}")
            except ObjectNotFound:  # serving ended before it was registered
                continue
            client.pause_deployment(found.id)


if __name__ == "__main__":
    main()
