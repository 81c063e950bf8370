"""The checks every command runs before its expensive start, and its one way to fail.

`check` loads the params, checks every file the stage reads (`brorl.runs.preflight.check_inputs`)
and, when `PREFECT_API_URL` is set, that a server answers there (`prefect_api_error`);
`check_study` does the same for a study's mode. A bad one prints one `error:` line and exits
with code 2 (`fail`) within about a second, before any Prefect server, model or MLflow run
starts: nothing here imports prefect, mlflow or torch. `environment` applies the environment
defaults (`brorl.system.environment`). The `brorl` command (`commands/cli.py`) runs these before it
imports a flow; `commands.server`, `commands.deploy` and `commands.pools` share `environment`
and `prefect_api_error`. Every command works in the checkout it is started in
(`brorl.system.checkout`: `$BRORL_ROOT`, else the folder from the working directory up that holds
dvc.yaml and params/); outside one it stops with one `error:` line saying so (`environment`).
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request
from typing import Any, NoReturn

from brorl.system.checkout import CheckoutError, find_root
from brorl.system.environment import apply_defaults

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
    from brorl.runs.preflight import InputError, check_inputs

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


STUDY_MODES = ("warmup", "pool", "plan", "start", "report")
"""The study's flows other than `--run RUN` (`brorl study`, flows/study.py's docstring)."""


def check_study(params_path: str, overrides: list[str], mode: str, run: str | None) -> None:
    """Load the study's params and check the files `mode` reads (`STUDY_MODES` or `run`, the
    run `run`; the study's plan, `brorl.study.plan`, is light) and the Prefect server; on
    failure print one `error:` line and exit with code 2."""
    from brorl.model.checks import check_checkpoint
    from brorl.params import ParamsError, load_params
    from brorl.runs.preflight import InputError, check_inputs, check_split
    from brorl.study.frozen import check as frozen
    from brorl.study.plan import find_run, plan_runs, run_params, warmup_dir, warmup_params
    from brorl.study.progress import will_resume

    try:
        params, root = load_params(params_path, overrides), find_root()
        if mode == "warmup" and not frozen(params, root, "warmup"):  # the data, the base policy
            check_inputs(warmup_params(params), "train", root)
        if mode == "pool":  # the train split and the study's warm-up policy
            check_split(root / params.data.path, "train")
            check_checkpoint(root / warmup_dir(params) / "policy", "the study's warm-up policy")
        if mode in ("run", "start"):  # the pool and the warm-up policy (or the run's checkpoint)
            chosen = find_run(params.study, run) if run else plan_runs(params.study)[0]
            # a folder of other params or a finished run starts over: no checkpoint to check
            resume = bool(run) and will_resume(params, root, chosen.id)
            check_inputs(run_params(params, chosen), "train", root, resume=resume)
    except (ParamsError, InputError, ValueError, CheckoutError) as err:
        fail(str(err))
    if error := prefect_api_error():
        fail(error)
