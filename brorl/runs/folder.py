"""A run's checkpoint folder as files, read without torch: layout, `latest` pointer, params record.

`<checkpoint_dir>/` holds `step_000012/` folders (complete once `trainer_state.json`, written
last, is there; `.tmp-step_000012/` while being written), the `latest` pointer naming the newest,
and `params.json`: the resolved params of the run writing there (`record_params`, when
`brorl.train.Run.open` opens the run), which `brorl.train.checkpoint.commit` copies into each step
folder, so every checkpoint names the params that made it. `brorl.train.checkpoint` writes this
layout (with torch: weights, optimizer, RNG states); `brorl.runs.preflight` reads it before anything
loads.

A resume continues the checkpoint's run, so it must be the same run: `changed_params` lists the
keys whose values differ between a checkpoint's record and the new params, except
`RESUMABLE_KEYS`, the knobs that decide how long the run goes and when it evaluates, saves and
records, none of which changes what a step does. Keys that only one side has (a knob added to or
removed from the schema since the checkpoint was written) are not compared.

A checkpoint without `params.json` has nothing to compare and resumes as before
(`brorl.runs.legacy.params_unrecorded`).

Beside a run's folder, never inside it (what DVC hashes must not change when a rerun gives the
same weights): `<run_dir>.timings.json` (`brorl.runs.timings`) and `<run_dir>.mlflow_run.json`
(`mlflow_marker`), the id of the run's MLflow run, new in every fresh run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from brorl.runs.files import atomic_write_text
from brorl.runs.legacy import params_unrecorded

STATE_FILE = "trainer_state.json"
LATEST_FILE = "latest"
PARAMS_FILE = "params.json"
MLFLOW_SUFFIX = ".mlflow_run.json"
"""What `mlflow_marker` appends to a run folder's name (listed in .gitignore and .dvcignore)."""
STEP_DIGITS = 6
MAX_STEPS = 10**STEP_DIGITS - 1
"""The most steps a run can count: step folders are `step_` and six digits, and their names
sort in step order only while they have the same width (pruning removes the first names)."""

RESUMABLE_KEYS = (
    "train.steps", "train.max_rollouts", "train.min_steps", "train.max_seconds",
    "train.plateau_patience", "train.eval_every", "train.checkpoint_every",
    "train.keep_checkpoints", "train.save_rollouts", "train.run_dir", "train.checkpoint_dir",
    "tracking", "compare",
)
"""What may differ between a checkpoint's params and a run resuming it: the stop rules (steps,
rollout and time budgets, the steps past a budget, plateau), the evaluation and checkpoint
schedules, which rollouts are kept on disk, where the run's folders are (a moved run), where
results are recorded (the `tracking` section), and the `compare` section, which a run never
reads (an arm of a comparison carries its comparison's). A key names itself and every key
under it."""


class CheckpointError(ValueError):
    """The checkpoint folder cannot say what a resume would read; the message says why."""


def step_name(step: int) -> str:
    return f"step_{step:0{STEP_DIGITS}d}"


def mlflow_marker(run_dir: str | Path) -> Path:
    """`<run_dir>.mlflow_run.json`: which MLflow run records the run (`tracking.train_record`)."""
    run_dir = Path(run_dir)
    return run_dir.with_name(run_dir.name + MLFLOW_SUFFIX)


def staging_dir(root: str | Path, step: int) -> Path:
    """The temporary folder all ranks write step `step` into (same name on every rank)."""
    return Path(root) / f".tmp-{step_name(step)}"


def is_complete(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file()


def pointed(root: str | Path) -> str | None:
    """The folder name the `latest` pointer of `root` holds, None without a pointer."""
    pointer = Path(root) / LATEST_FILE
    return pointer.read_text().strip() if pointer.is_file() else None


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`: the `latest` pointer's, else the highest
    complete step (a pointer naming a missing or incomplete folder falls back to it); None when
    there is no checkpoint. CheckpointError when the pointer names a checkpoint that is not there
    and none other is complete: the run's progress is gone, and starting again from step 0
    without a word would hide that."""
    root = Path(root)
    name = pointed(root)
    if name and is_complete(root / name):
        return root / name
    done = sorted(p for p in root.glob("step_*") if p.is_dir() and is_complete(p))
    if done:
        return done[-1]
    if name is not None:
        raise CheckpointError(
            f"{root / LATEST_FILE} names {name or '(nothing)'}, which is not a complete "
            f"checkpoint, and no other checkpoint in {root} is complete: the run cannot resume. "
            f"Restore {root / (name or 'step_XXXXXX')}, or start over in a new "
            "train.checkpoint_dir (python -m brorl.train: --fresh).")
    return None


def read_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / STATE_FILE).read_text())


def policy_to_evaluate(run_dir: str | Path, checkpoint_dir: str | Path,
                       init_checkpoint: str | Path) -> Path:
    """A run's final policy (`<run_dir>/policy`), else its newest checkpoint's policy, else its
    starting point: what an evaluation of the run scores by default."""
    final = Path(run_dir) / "policy"
    if (final / "config.json").is_file():
        return final
    latest = latest_checkpoint(checkpoint_dir)
    return latest / "policy" if latest else Path(init_checkpoint)


def record_params(checkpoint_dir: str | Path, params: Mapping[str, Any]) -> None:
    """Write `params` (resolved, JSON-ready: `model_dump(mode="json")`) as the record of the run
    writing into `checkpoint_dir`; each checkpoint committed after this carries a copy."""
    atomic_write_text(Path(checkpoint_dir) / PARAMS_FILE,
                      json.dumps(params, indent=1, sort_keys=True) + "\n")


def recorded_params(folder: Path) -> dict[str, Any] | None:
    """The params record of a checkpoint folder (None: it has none, `brorl.runs.legacy`);
    CheckpointError when the file is not a JSON mapping."""
    path = folder / PARAMS_FILE
    if params_unrecorded(path):
        return None
    try:
        record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(record, dict):
        raise CheckpointError(f"{path}: not a params record (a {type(record).__name__})")
    return record


def _flat(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _resumable(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)


def changed_params(recorded: Mapping[str, Any],
                   current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, recorded value, current value) of every key both hold with different values,
    `RESUMABLE_KEYS` excepted, in key order."""
    old, new = dict(_flat(recorded)), dict(_flat(current))
    return [(key, old[key], new[key]) for key in sorted(old.keys() & new.keys())
            if old[key] != new[key] and not _resumable(key)]
