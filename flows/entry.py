"""The one command-line shape of every flow module: `python -m flows.NAME --params FILE [-S k=v ...]`.

DVC stages and the Makefile call flows this way, so all share the params loading and its errors.
The params and every file the flow's stage reads (`brorl.preflight.check_inputs`) are checked
before the flow starts (no Prefect server, model or MLflow run yet): a bad one prints one
`error:` line and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from brorl.params import ParamsError, load_params
from brorl.preflight import InputError, check_inputs
from flows import prefect_settings
from tasks import tracking


def run_flow_cli(flow: Callable[..., Any], argv: list[str] | None = None) -> Any:
    """Parse `--params FILE` and repeated `-S key=value`, then call `flow(params_path, overrides)`."""
    parser = argparse.ArgumentParser(prog=f"python -m flows.{flow.__name__}")
    parser.add_argument("--params", required=True, help="YAML params file under params/")
    parser.add_argument("-S", "--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override one params key, e.g. simulate.steps=200")
    args = parser.parse_args(argv)
    try:
        check_inputs(load_params(args.params, args.overrides), flow.__name__, tracking.ROOT)
    except (ParamsError, InputError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    with prefect_settings():  # no heartbeat thread joined at the end of each flow run
        return flow(params_path=args.params, overrides=list(args.overrides))
