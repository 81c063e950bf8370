"""Checks of every file a stage reads, before the stage starts anything expensive.

Each entry point (`python -m flows.NAME`, the `brorl` command, `python -m brorl.train`) validates
its params (`brorl.params.load_params`), then calls `check_inputs(params, stage)`: the problem
splits the stage reads (the folder, the split, its columns, at least one row, readable Arrow
files), the checkpoints it starts from (a `config.json` that parses, weights whose safetensors
header reads and whose every tensor has the shape `config.json` implies, a tokenizer) and, for a
run that would resume, its newest checkpoint (trainer state, optimizer partitions, reference).
A failure is one `InputError` line naming the file and the fix; the entry point prints it and
exits with code 2, before any Prefect server, model or MLflow run starts and before anything is
written.

Deliberately ignored: checking that a checkpoint's tokenizer matches the data's alphabet (the
first generation shows it), and files a stage writes before reading them (the pipeline's own).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

COLUMNS = ("id", "family", "task", "prompt", "answer", "tests", "metadata")
"""The columns of a saved split (`brorl.data.records.problems_to_dataset`)."""


class InputError(ValueError):
    """A file a stage reads is missing or unusable; the message names it and the fix."""


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]


def check_split(folder: str | Path, split: str) -> int:
    """The number of rows of `split` in the saved splits at `folder`; InputError otherwise."""
    folder = Path(folder)
    rebuild = "rebuild it with `dvc repro data` (or point data.path at a data stage's output)"
    if not (folder / "dataset_dict.json").is_file():
        raise InputError(f"{folder}: no problem splits here (no dataset_dict.json); {rebuild}.")
    try:  # an empty split is saved without data files, which load_from_disk cannot read
        splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        state = json.loads((folder / split / "state.json").read_text()) if split in splits else {}
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise InputError(f"{folder}: the problem splits cannot be read ({_first_line(err)}); "
                         f"{rebuild}.") from None
    if state.get("_data_files") == []:
        raise InputError(f"{folder}/{split}: the split has no rows; rebuild the data with more "
                         "problems per task (data.*_per_task) by `dvc repro data`.")
    from datasets import load_from_disk

    try:
        tables = load_from_disk(str(folder))
    except Exception as err:  # noqa: BLE001 - any failure to read is the file's, named here
        raise InputError(f"{folder}: the problem splits cannot be read ({_first_line(err)}); "
                         f"{rebuild}.") from None
    if split not in tables:
        raise InputError(f"{folder}: no {split!r} split (it has {sorted(tables)}); {rebuild}.")
    table = tables[split]
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise InputError(f"{folder}/{split}: no column {', '.join(missing)} (a split needs "
                         f"{', '.join(COLUMNS)}); {rebuild}.")
    try:
        rows = len(table)
        if rows:
            table[rows - 1]  # reads through to the last row: a truncated Arrow file fails here
    except Exception as err:  # noqa: BLE001
        raise InputError(f"{folder}/{split}: the Arrow data cannot be read ({_first_line(err)}); "
                         f"{rebuild}.") from None
    if rows == 0:
        raise InputError(f"{folder}/{split}: the split has no rows; rebuild the data with more "
                         "problems per task (data.*_per_task) by `dvc repro data`.")
    return rows


def check_checkpoint(folder: str | Path, field: str) -> None:
    """A Hugging Face checkpoint folder whose config, weights and tokenizer load; InputError
    naming `field` (the params key that points here) otherwise."""
    folder = Path(folder)
    fix = f"point {field} at a folder written by the base stage or save_pretrained"
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise InputError(f"{field} = {folder}: not a checkpoint folder (no config.json); {fix}.")
    try:
        json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{config_path}: not valid JSON ({_first_line(err)}); {fix}.") from None
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise InputError(f"{field} = {folder}: no model.safetensors (one safetensors file is "
                         f"what brorl writes and reads); {fix}.")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (folder / name).is_file():
            raise InputError(f"{field} = {folder}: no {name}; {fix}.")
    found = _safetensors_shapes(weights, fix)
    expected = _expected_shapes(folder, fix)
    missing = sorted(set(expected) - set(found))
    if missing:
        raise InputError(f"{weights}: no tensor {missing[0]} (and {len(missing) - 1} more) of the "
                         f"model config.json describes; the weights belong to another model: {fix}.")
    for name, shape in sorted(found.items()):
        if name in expected and tuple(expected[name]) != tuple(shape):
            raise InputError(f"{weights}: tensor {name} has shape {list(shape)}, config.json "
                             f"implies {list(expected[name])}; the weights belong to another "
                             f"model: {fix}.")


def _safetensors_shapes(path: Path, fix: str) -> dict[str, list[int]]:
    """Tensor name -> shape from the file's header (read once); InputError when it is not
    safetensors or is shorter than its header says."""
    try:
        with path.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if header_len > path.stat().st_size:
                raise ValueError(f"header length {header_len} beyond the file")
            header = json.loads(f.read(header_len))
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        shapes = {name: list(v["shape"]) for name, v in tensors.items()}
        end = max((v["data_offsets"][1] for v in tensors.values()), default=0)
    except Exception as err:  # noqa: BLE001 - any failure to read is the file's
        raise InputError(f"{path}: truncated or not a safetensors file ({_first_line(err)}); "
                         f"{fix}.") from None
    if path.stat().st_size < 8 + header_len + end:
        raise InputError(f"{path}: truncated ({path.stat().st_size} bytes, its header describes "
                         f"{8 + header_len + end}); {fix}.")
    return shapes


def _expected_shapes(folder: Path, fix: str) -> dict[str, list[int]]:
    """Parameter name -> shape of the model `config.json` describes (built on the meta device:
    no memory, no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as err:  # noqa: BLE001
        raise InputError(f"{folder / 'config.json'}: describes no model transformers can build "
                         f"({_first_line(err)}); {fix}.") from None
    tied = set()
    if getattr(config, "tie_word_embeddings", False):
        tied = {"lm_head.weight"}  # saved once, as the embedding
    return {name: list(t.shape) for name, t in model.state_dict().items() if name not in tied}


def check_resume(checkpoint_dir: str | Path) -> Path | None:
    """The checkpoint a run in `checkpoint_dir` would resume from (None: it starts fresh), every
    file the resume reads present; InputError otherwise."""
    from brorl.train import checkpoint as ckpt

    folder = ckpt.latest_checkpoint(checkpoint_dir)
    if folder is None:
        return None
    fix = (f"remove {folder} to resume from the checkpoint before it, or pass --fresh (or a new "
           "train.checkpoint_dir) to start over")
    try:
        state = ckpt.read_state(folder)
        int(state["step"])
        dict(state["sampler"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise InputError(f"{folder / ckpt.STATE_FILE}: not a trainer state "
                         f"({_first_line(err)}); {fix}.") from None
    check_checkpoint(folder / "policy", f"the resumed checkpoint {folder.name}'s policy")
    check_checkpoint(folder / "reference", f"the resumed checkpoint {folder.name}'s reference")
    states = folder / "deepspeed" / "state"
    if not list(states.glob("*optim_states.pt")) or not list(states.glob("*model_states.pt")):
        raise InputError(f"{states}: no optimizer state (*optim_states.pt, *model_states.pt): "
                         f"the run cannot resume exactly; {fix}.")
    return folder


def check_inputs(params: ExperimentParams, stage: str, root: str | Path = ".", *,
                 resume: bool = True, checkpoint: str | None = None) -> None:
    """Every input `stage` reads, checked up front (relative paths from `root`).

    Stages: `data`, `simulate`, `study` (params only, or files that earlier stages of the same
    pipeline write), `model` (its source: `brorl.model.check_source`), `compare` (each arm's
    params file: a `ParamsError` names it), `base` (the splits and the model stage's
    checkpoint), `train` (the splits, the start checkpoint
    and, with `resume`, the checkpoint it resumes), `evaluate` (the test split and
    `checkpoint`, else the run's policy, `checkpoint.policy_to_evaluate`).
    """
    root = Path(root)
    data = root / params.data.path
    if stage == "compare":
        from brorl.params import load_params

        for path in params.compare.arms.values():
            load_params(root / path)  # a ParamsError names the arm's file
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
        for split in sorted({"train", *params.train.eval_splits}):
            check_split(data, split)
        if not (resume and check_resume(root / params.train.checkpoint_dir)):
            check_checkpoint(root / params.train.init_checkpoint, "train.init_checkpoint")
    elif stage == "evaluate":
        from brorl.train.checkpoint import policy_to_evaluate

        check_split(data, "test")
        if checkpoint is not None:
            check_checkpoint(root / checkpoint, "--checkpoint")
        else:
            t = params.train
            check_checkpoint(policy_to_evaluate(root / t.run_dir, root / t.checkpoint_dir,
                                                root / t.init_checkpoint),
                             "the run's policy (train.run_dir, checkpoint_dir, init_checkpoint)")
