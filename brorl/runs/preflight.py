"""Checks of every file a stage reads, before the stage starts anything expensive.

Each entry point (the `brorl` command, `python -m brorl.train`) validates
its params (`brorl.params.load_params`), then calls `check_inputs(params, stage)`: the problem
splits the stage reads (the folder, the split, its columns, at least one row, Arrow files read
to their end), the checkpoints it starts from (a `config.json` that parses, weights whose
safetensors header reads and whose every tensor has the shape `config.json` implies, a
tokenizer), for a training run its length (`train.steps` within what a run can count) and
folders it can write, and, for a run that would resume, its newest checkpoint: the `latest`
pointer, the trainer state, the params that wrote it (the same run, `brorl.runs.folder`), policy,
reference, and the optimizer and RNG files DeepSpeed and torch will load (whole zip archives).
A failure is one `InputError` line naming the file and the fix; the entry point prints it and
exits with code 2, before any Prefect server, model or MLflow run starts and before anything is
written.

Torch-free by design, like everything it imports (pyarrow reads the splits, `brorl.model.checks`
the checkpoint folders, `zipfile` reads the archives): a bad input is refused in about a second,
before the libraries of the expensive start load (tests/test_layering.py keeps it so).

Deliberately ignored: checking that a checkpoint's tokenizer matches the data's alphabet (the
first generation shows it), files a stage writes before reading them (the pipeline's own), and
the bytes inside the optimizer archives (their structure and sizes are checked, not their CRCs:
reading gigabytes would cost what the check saves).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from brorl.model.checks import InputError, check_checkpoint, first_line
from brorl.runs import folder as run_files

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

COLUMNS = ("id", "family", "task", "prompt", "answer", "tests", "metadata")
"""The columns of a saved split (`brorl.data.records.problems_to_dataset`)."""
ARROW_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The end-of-stream marker closing an Arrow IPC stream (how `datasets` saves a split)."""


def check_split(folder: str | Path, split: str) -> int:
    """The number of rows of `split` in the saved splits at `folder`; InputError otherwise."""
    folder = Path(folder)
    rebuild = ("build it with `brorl data --params FILE` (the same params file), or point "
               "data.path at a data stage's output")
    if not (folder / "dataset_dict.json").is_file():
        raise InputError(f"{folder}: no problem splits here (no dataset_dict.json); {rebuild}.")
    try:
        splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        state = json.loads((folder / split / "state.json").read_text()) if split in splits else {}
        files = state["_data_files"] if split in splits else []
        names = [str(entry["filename"]) for entry in files]
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise InputError(f"{folder}: the problem splits cannot be read ({first_line(err)}); "
                         f"{rebuild}.") from None
    if split not in splits:
        raise InputError(f"{folder}: no {split!r} split (it has {sorted(splits)}); {rebuild}.")
    read = [_read_arrow(folder / split / name, rebuild) for name in names]
    rows = sum(n for n, _ in read)
    missing = [c for c in COLUMNS if c not in read[0][1]] if read else []
    if missing:
        raise InputError(f"{folder}/{split}: no column {', '.join(missing)} (a split needs "
                         f"{', '.join(COLUMNS)}); {rebuild}.")
    if rows == 0:  # an empty split is saved without data files
        raise InputError(f"{folder}/{split}: the split has no rows; rebuild the data with more "
                         "problems per task (data.*_per_task) by `brorl data --params FILE`.")
    return rows


def _read_arrow(path: Path, rebuild: str) -> tuple[int, list[str]]:
    """Rows and columns of one saved Arrow stream file, read to its end-of-stream marker."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()
            found = table.num_rows, list(table.schema.names)
            del table  # its buffers are the mapped file's
        with path.open("rb") as f:  # a stream cut between two batches reads without error
            f.seek(max(path.stat().st_size - len(ARROW_END), 0))
            if f.read() != ARROW_END:
                raise ValueError("no end-of-stream marker: the file is cut short")
    except (OSError, ValueError, pa.ArrowException) as err:
        raise InputError(f"{path}: the Arrow data cannot be read ({first_line(err)}); "
                         f"{rebuild}.") from None
    return found


def check_resume(checkpoint_dir: str | Path, params: ExperimentParams | None = None, *,
                 allow_changed_params: bool = False) -> tuple[Path | None, list[str]]:
    """The checkpoint a run in `checkpoint_dir` would resume from (None: it starts fresh) and
    notes for the user; InputError when a file the resume reads is unusable, or when the
    checkpoint was written under other `params` (`brorl.runs.folder.changed_params`) unless
    `allow_changed_params`."""
    checkpoint_dir = Path(checkpoint_dir)
    try:
        folder = run_files.latest_checkpoint(checkpoint_dir)
    except run_files.CheckpointError as err:
        raise InputError(str(err)) from None
    if folder is None:
        return None, []
    notes = []
    name = run_files.pointed(checkpoint_dir)
    if name is not None and checkpoint_dir / name != folder:
        notes.append(f"{checkpoint_dir / run_files.LATEST_FILE} names {name or '(nothing)'}, "
                     f"which is not a complete checkpoint: resuming from {folder.name}, the "
                     "newest complete one.")
    fix = (f"remove {folder} to resume from the checkpoint before it, or start over in a new "
           "train.checkpoint_dir (python -m brorl.train: --fresh)")
    try:
        state = run_files.read_state(folder)
        int(state["step"])
        dict(state["sampler"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise InputError(f"{folder / run_files.STATE_FILE}: not a trainer state "
                         f"({first_line(err)}); {fix}.") from None
    if params is not None and not allow_changed_params:
        _check_same_run(folder, params)
    check_checkpoint(folder / "policy", f"the resumed checkpoint {folder.name}'s policy")
    check_checkpoint(folder / "reference", f"the resumed checkpoint {folder.name}'s reference")
    states = folder / "deepspeed" / "state"
    if not list(states.glob("*optim_states.pt")) or not list(states.glob("*model_states.pt")):
        raise InputError(f"{states}: no optimizer state (*optim_states.pt, *model_states.pt): "
                         f"the run cannot resume exactly; {fix}.")
    for path in sorted([*states.glob("*.pt"), *folder.glob("rng_rank*.pt")]):
        _check_archive(path, fix)
    return folder, notes


def _check_same_run(folder: Path, params: ExperimentParams) -> None:
    """InputError naming the keys when `folder` records other params than `params`."""
    try:
        recorded = run_files.recorded_params(folder)
    except run_files.CheckpointError as err:
        raise InputError(f"{err}; pass --allow-changed-params to resume without comparing, or "
                         "start over in a new train.checkpoint_dir.") from None
    changed = [] if recorded is None else run_files.changed_params(
        recorded, params.model_dump(mode="json"))
    if not changed:  # the same params, or none recorded (`brorl.runs.legacy`)
        return
    shown = ", ".join(f"{key} ({old!r} there, {new!r} now)" for key, old, new in changed[:4])
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    raise InputError(
        f"{folder}: written by a run with other params: {shown}{more}; resuming would continue "
        "that run under these. Start over in a new train.checkpoint_dir (python -m brorl.train: "
        "--fresh), or pass --allow-changed-params to resume it anyway (without it only "
        f"{', '.join(run_files.RESUMABLE_KEYS)} may change).")


def _check_archive(path: Path, fix: str) -> None:
    """A file `torch.save` wrote (a zip archive): present whole, every member inside the file;
    InputError naming it otherwise. The members' bytes are not read."""
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if member.header_offset + member.compress_size > size:
                    raise zipfile.BadZipFile(f"member {member.filename} ends beyond the file")
    except (OSError, zipfile.BadZipFile, ValueError) as err:
        raise InputError(f"{path}: truncated or not a checkpoint archive ({first_line(err)}); "
                         f"the run cannot resume from it; {fix}.") from None


def check_writable(path: str | Path, field: str) -> None:
    """InputError unless a folder can be created or written at `path` (its nearest existing
    ancestor is a writable folder); nothing is created."""
    path = Path(path)
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{field} = {path}: {existing} is not a folder; point {field} at a "
                         "folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        why = "a read-only file system" if read_only else "no write permission there"
        raise InputError(f"{field} = {path}: cannot write in {existing} ({why}); point {field} "
                         "at a writable folder.")


def check_run_length(params: ExperimentParams) -> None:
    """InputError when `train.steps` is beyond what a run can count (`run_files.MAX_STEPS`)."""
    t, u = params.train, params.update
    if t.steps <= run_files.MAX_STEPS:
        return
    budget = ""
    if t.max_rollouts is not None:
        per_step = u.prompts_per_step * u.rollouts_per_prompt
        budget = (f"; the rollout budget (train.max_rollouts = {t.max_rollouts:,}, "
                  f"{per_step:,} rollouts per step) ends this run after about "
                  f"{max(t.max_rollouts // per_step, 1):,} steps")
    raise InputError(
        f"train.steps = {t.steps}: beyond the {run_files.MAX_STEPS:,} steps a run can count (its "
        f"checkpoints are step_000001 ... {run_files.step_name(run_files.MAX_STEPS)}){budget}; "
        f"give train.steps at most {run_files.MAX_STEPS}, and let train.max_rollouts or "
        "train.max_seconds end the run earlier.")


def check_inputs(params: ExperimentParams, stage: str, root: str | Path = ".", *,
                 resume: bool = True, checkpoint: str | None = None,
                 allow_changed_params: bool = False) -> list[str]:
    """Every input `stage` reads, checked up front (relative paths from `root`); returns notes
    to show the user (a resume that falls back past a broken `latest` pointer).

    Stages: `data`, `simulate`, `study` (params only, or files that earlier stages of the same
    pipeline write), `model` (its source: `brorl.model.check_source`), `compare` (the arms:
    `brorl.params.compare_arms`; their lengths), `base` (the splits and the model stage's
    checkpoint), `train` (the splits, the length, the run's folders writable, the start
    checkpoint and, with `resume`, the checkpoint it resumes, written by the same run unless
    `allow_changed_params`), `evaluate` (the test split and `checkpoint`, else the run's policy,
    `run_files.policy_to_evaluate`).
    """
    root = Path(root)
    data = root / params.data.path
    notes: list[str] = []
    if stage == "compare":
        from brorl.params import compare_arms

        try:  # a ParamsError names the arm's file or keys
            arms = compare_arms(params, root)
        except ValueError as err:
            raise InputError(str(err)) from None
        for arm in arms.values():
            check_run_length(arm)
    elif stage == "model":
        from brorl.model import ModelConfig, ModelSourceError, check_source

        try:
            check_source(ModelConfig.from_params(params.model), root)
        except ModelSourceError as err:
            raise InputError(str(err)) from None
    elif stage == "base":
        for split in ("train", "validation", "test"):
            check_split(data, split)
        check_checkpoint(root / params.model.checkpoint, "model.path (the model stage's output)")
    elif stage == "train":
        t = params.train
        check_run_length(params)
        check_writable(root / t.run_dir, "train.run_dir")
        check_writable(root / t.checkpoint_dir, "train.checkpoint_dir")
        for split in sorted({"train", *t.eval_splits}):
            check_split(data, split)
        resumed = None
        if resume:
            resumed, notes = check_resume(root / t.checkpoint_dir, params,
                                          allow_changed_params=allow_changed_params)
        if resumed is None:
            check_checkpoint(root / t.init_checkpoint, "train.init_checkpoint")
    elif stage == "evaluate":
        check_split(data, "test")
        if checkpoint is not None:
            check_checkpoint(root / checkpoint, "--checkpoint")
        else:
            t = params.train
            try:
                policy = run_files.policy_to_evaluate(root / t.run_dir, root / t.checkpoint_dir,
                                                      root / t.init_checkpoint)
            except run_files.CheckpointError as err:
                raise InputError(str(err)) from None
            check_checkpoint(policy,
                             "the run's policy (train.run_dir, checkpoint_dir, init_checkpoint)")
    return notes
