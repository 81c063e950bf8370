"""The checkout an entry point works in: the folder whose params/, outputs/, metrics/, plots/, dvc
files, `.cache` and `mlflow.db` it reads and writes.

The rule: `$BRORL_ROOT` when set, else the nearest folder, from the working directory up, that
holds `dvc.yaml` and `params/`. Never the folder the code was imported from: one virtualenv
(its editable install pointing at one clone) serves every clone, and each command works in
the clone it was started in. Paths given on a command line (`--params FILE`) are taken from
the working directory as usual; the relative paths inside params files are taken from here.
What ships with the code (a package's own files) stays relative to `__file__`.
Outside any checkout a command that needs one stops with `CheckoutError`, whose message says
the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT_VARIABLE = "BRORL_ROOT"
"""The environment variable naming the checkout explicitly (any working directory)."""
MARKERS = ("dvc.yaml", "params")
"""What makes a folder a checkout: the pipeline file and the params folder (study/, which has
a dvc.yaml of its own, has no params/)."""


class CheckoutError(RuntimeError):
    """No checkout here: the message names the folder searched and the fix."""


def is_checkout(folder: Path) -> bool:
    """Whether `folder` holds `dvc.yaml` and `params/`."""
    return (folder / MARKERS[0]).is_file() and (folder / MARKERS[1]).is_dir()


def find_root(environ: Mapping[str, str] | None = None, start: Path | None = None) -> Path:
    """The checkout (absolute): `$BRORL_ROOT` of `environ` (default: this process's), else the
    nearest folder from `start` (default: the working directory) up that is one."""
    environ = os.environ if environ is None else environ
    if named := environ.get(ROOT_VARIABLE, "").strip():
        root = Path(named).expanduser().resolve()
        if not is_checkout(root):
            raise CheckoutError(f"{ROOT_VARIABLE}={named} is not a brorl checkout (it needs "
                                "dvc.yaml and params/): point it at a checkout, or unset it and "
                                "run from inside one.")
        return root
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if is_checkout(folder):
            return folder
    raise CheckoutError(f"{here} is not inside a brorl checkout (no folder from it up holds "
                        f"dvc.yaml and params/): cd into your checkout, or set "
                        f"{ROOT_VARIABLE}=/path/to/checkout.")


def in_checkout(path: str | Path, environ: Mapping[str, str] | None = None) -> Path:
    """`path` from a params file: an absolute one as it is, a relative one under the checkout
    (so an absolute path needs no checkout)."""
    path = Path(path)
    return path if path.is_absolute() else find_root(environ) / path
