"""The one command line: `brorl <stage> --params FILE [-S key=value ...]`, and `brorl run | serve`.

A stage command (`simulate`, `data`, `model`, `base`, `train`, `evaluate`, `compare`, `study`)
applies the environment defaults (`brorl.system.environment`), parses its arguments, loads the params
and checks the files its stage reads and, when `PREFECT_API_URL` is set, that a Prefect server
answers there (`commands.entry.check`; the study's mode: `check_study`): a bad key, value, file
or server prints one `error:` line naming it and exits with code 2. Only then are the flow's
module, prefect, mlflow and torch imported and the flow run (heartbeats off:
`flows.prefect_settings`; SIGTERM leaves as Ctrl-C does), so `--help` and every error answer in
about a second, and a flow this checkout lacks fails only its own command. `study` takes a mode
(`--warmup`, `--pool`, `--plan`, `--start`, `--run RUN`, `--report`). The DVC stages, the
Makefile and the docs call these commands (`scripts/brorl` in dvc.yaml: the checkout's Python).
`run` is the whole pipeline (`dvc repro`, as `make run`) and `serve` the scheduled deployments on
a local Prefect server (as `make serve`).
Every command works in the checkout it is started in (`brorl.system.checkout`), not in the one the
script was installed from: one virtualenv serves every clone.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from brorl.system.servers import interrupts
from commands.entry import STUDY_MODES, check, check_study, environment, fail

app = typer.Typer(help="BroRL: simulate, train, compare and evaluate RLVR runs (Prefect flows).",
                  no_args_is_help=True, add_completion=False, rich_markup_mode=None)


def _params(example: str) -> Any:
    """The `--params` option, its help naming a file the command runs on."""
    return Annotated[str, typer.Option("--params", help=f"YAML params file, e.g. {example}")]


def _sets(example: str) -> Any:
    """The repeatable `-S` option, its help naming a key the command reads."""
    return Annotated[list[str] | None, typer.Option(
        "--set", "-S", metavar="KEY=VALUE",
        help=f"override one params key (repeatable), e.g. {example}")]


@app.callback()
def _environment() -> None:
    """Offline, project-local defaults for every command (`brorl.system.environment`): the caches of
    the checkout it runs in (`brorl.system.checkout`; outside one, one `error:` line, exit code 2)."""
    environment()


def _check(params: str, overrides: list[str], stage: str | None = None, **inputs: Any) -> None:
    """Validate the params (and the files `stage` reads, `brorl.runs.preflight.check_inputs`, and the
    Prefect server of PREFECT_API_URL) now: exit 2 with one line naming the bad key, value or
    file instead of a traceback later."""
    check(params, overrides, stage, api=stage is not None, **inputs)


def _flow(name: str, function: str) -> Any:
    """`flows.<name>.<function>`, or exit 1 saying this checkout does not have it yet."""
    module_name = f"flows.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        typer.echo(f"error: the {name} flow is not available: no flows/{name}.py in this checkout.",
                   err=True)
        raise typer.Exit(1) from None
    return getattr(module, function)


def _run(flow: str, function: str, **arguments: Any) -> Any:
    """Import `flows.<flow>` (prefect, mlflow, torch: after the checks) and run its flow
    `function`; print the flow's summary as JSON and return it (`app(..., standalone_mode=False)`
    hands it to a caller in the same process)."""
    from flows import prefect_settings

    # interrupts: SIGTERM leaves as Ctrl-C does, through the exit that stops the temporary
    # Prefect server a flow run starts when no PREFECT_API_URL is set
    with prefect_settings(), interrupts():  # prefect_settings: no heartbeat thread to join
        summary = _flow(flow, function)(**arguments)
    typer.echo(json.dumps(summary, indent=2, default=str))
    return summary


def _run_flow(name: str, params: str, overrides: list[str] | None, checks: dict | None = None,
              **extra: Any) -> Any:
    """Check, then run flow `name`; `checks` are `check_inputs` keywords the flow does not take."""
    overrides = list(overrides or [])
    _check(params, overrides, name, **extra, **(checks or {}))
    return _run(name, name, params_path=params, overrides=overrides, **extra)


def _dvc_set(params: str, override: str) -> str:
    """`FILE:KEY=VALUE` for `dvc exp run -S`; `FILE:+KEY=VALUE` when the file itself lacks the
    key (it may come from a file it `extends`): DVC only replaces keys a file already has."""
    import yaml

    key, _, value = override.partition("=")
    node = yaml.safe_load(Path(params).read_text(encoding="utf-8")) or {}
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return f"{params}:+{key}={value}"
        node = node[part]
    return f"{params}:{override}"


DEFAULT_STAGES = ("simulate", "compare")
"""What `brorl run` and `make run` reproduce: every stage up to the ProRL-vs-BroRL comparison and
the simulator; the study (`make study`, about two hours) only when named."""


@app.command()
def run(stages: Annotated[list[str] | None, typer.Argument(
            help="DVC stages to reproduce (default: simulate and compare, every stage but the "
                 "two-hour study's; `brorl run study/dvc.yaml:study_report` runs the study)")
        ] = None,
        params: Annotated[str | None, typer.Option(
            "--params", help="params file the -S overrides apply to (needed with -S), e.g. "
                             "params/prorl.yaml")] = None,
        overrides: _sets("train.steps=5") = None) -> None:
    """The default pipeline: `dvc repro simulate compare` (with -S: `dvc exp run -S FILE:KEY=VALUE`), every stage
    reporting to one Prefect server started for the run and stopped after it (as `make run`)."""
    overrides = list(overrides or [])
    if overrides and params is None:
        typer.echo("error: -S needs --params FILE: DVC sets a key in one params file.", err=True)
        raise typer.Exit(2)
    if params is not None:
        _check(params, overrides)
    from commands import server

    command = [sys.executable, "-m", "dvc"]
    if overrides:
        command += ["exp", "run", *(a for o in overrides for a in ("-S", _dvc_set(params, o)))]
    else:
        command += ["repro"]
    raise typer.Exit(server.main(["--pipeline", "--", *command, *(stages or DEFAULT_STAGES)]))


@app.command()
def simulate(params: _params("params/simulate_ci.yaml"),
             overrides: _sets("simulate.steps=200") = None) -> Any:
    """The paper's token-level simulator sweep (BroRL §4.1)."""
    return _run_flow("simulate", params, overrides)


@app.command()
def data(params: _params("params/tiny_ci.yaml"),
         overrides: _sets("data.families.math.per_task=50") = None) -> Any:
    """Every family's problems (data.families) split train / validation / test at
    `data.path`, as the DVC `data` stage builds them."""
    return _run_flow("data", params, overrides)


@app.command()
def model(params: _params("params/tiny_ci.yaml"),
          overrides: _sets("model.hidden_size=64") = None) -> Any:
    """The starting checkpoint from the params' `model` source (a GGUF file, a local HF folder,
    or the tiny model built from config)."""
    return _run_flow("model", params, overrides)


@app.command()
def base(params: _params("params/tiny_ci.yaml"),
         overrides: _sets("base.max_steps=50") = None) -> Any:
    """The middling base checkpoint: the model stage's checkpoint warmed up on the data's
    train split (the `base` section)."""
    return _run_flow("base", params, overrides)


@app.command()
def train(params: _params("params/prorl.yaml"),
          overrides: _sets("train.run_dir=outputs/mine") = None,
          allow_changed_params: Annotated[bool, typer.Option(
              help="resume a checkpoint written under other params (by default only the stop "
                   "rules and schedules may change: brorl/runs/folder.py)")] = False) -> Any:
    """One RL run (a ProRL or BroRL arm); resumes from its newest checkpoint."""
    return _run_flow("train", params, overrides, {"allow_changed_params": allow_changed_params})


@app.command()
def compare(params: _params("params/compare.yaml"),
            overrides: _sets("compare.budget_rollouts=1024") = None) -> Any:
    """ProRL and BroRL from the same start at an equal budget, then the report."""
    return _run_flow("compare", params, overrides)


@app.command()
def evaluate(params: _params("params/prorl.yaml"),
             overrides: _sets("train.eval_samples=2") = None,
             checkpoint: Annotated[str | None, typer.Option(
                 help="checkpoint folder to evaluate (default: the params' own)")] = None) -> Any:
    """Held-out evaluation of a checkpoint (pass@k per family)."""
    return _run_flow("evaluate", params, overrides, checkpoint=checkpoint)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(ctx: typer.Context, params: _params("params/prorl.yaml"),
          overrides: _sets("train.steps=5") = None,
          port: Annotated[int, typer.Option(help="port of the local Prefect server")] = 4200) -> None:
    """Scheduled deployments on a local Prefect server (Ctrl-C stops both).

    Other options go to `python -m commands.deploy` (--flow NAME, --train-cron EXPR,
    --evaluate-interval SECONDS, --limit N; see `python -m commands.deploy --help`).
    """
    overrides = list(overrides or [])
    from commands import deploy, server

    options = ["--params", params, *(a for o in overrides for a in ("-S", o)), *ctx.args]
    deploy.main([*options, "--check"])  # params and schedules, before the server starts
    raise typer.Exit(server.main(["--port", str(port), "--", sys.executable, "-m",
                                  "commands.deploy", *options]))


@app.command()
def study(params: _params("params/study_ci.yaml"),
          overrides: _sets("study.margin=0.05") = None,
          warmup: Annotated[bool, typer.Option("--warmup", help="the study-warmup flow")] = False,
          pool: Annotated[bool, typer.Option("--pool", help="the study-pool flow")] = False,
          plan: Annotated[bool, typer.Option("--plan", help="the study-plan flow")] = False,
          start: Annotated[bool, typer.Option("--start", help="the study-start flow")] = False,
          report: Annotated[bool, typer.Option("--report", help="the study-report flow")] = False,
          run: Annotated[str | None, typer.Option(
              metavar="RUN", help="train one run (the study-run flow), e.g. prorl_s0")] = None,
          ) -> Any:
    """The flows of a study (docs/study.md): one mode of --warmup, --pool, --plan, --start,
    --run RUN, --report."""
    chosen = {"warmup": warmup, "pool": pool, "plan": plan, "start": start, "report": report,
              "run": run is not None}
    modes = [mode for mode, on in chosen.items() if on]
    if len(modes) != 1:
        fail(f"brorl study takes one mode of --{', --'.join(STUDY_MODES)}, --run RUN "
             f"(given: {', '.join(f'--{m}' for m in modes) or 'none'}).")
    overrides = list(overrides or [])
    check_study(params, overrides, modes[0], run)
    if run is not None:
        started = os.environ.get("BRORL_STUDY_STARTED")  # epoch seconds, set by `make study`
        return _run("study", "study_run", params_path=params, run=run, overrides=overrides,
             started=float(started) if started else None)
    else:
        return _run("study", f"study_{modes[0]}", params_path=params, overrides=overrides)


if __name__ == "__main__":  # `python -m commands.cli`, as scripts/brorl runs it
    app(prog_name="brorl")
