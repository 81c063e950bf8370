"""Torch-free checks of a Hugging Face checkpoint folder, before anything loads it.

`check_checkpoint` reads `config.json`, the safetensors header of `model.safetensors` (every
tensor's shape against the shapes `config.json` implies: `brorl.model.shapes`, and the file's length
against what its header describes) and the tokenizer files; a failure is one `InputError` line
naming the params key that points at the folder and the fix. Used by `brorl.runs.preflight` (every
stage's inputs) and by the model stage for an `hf` source (`brorl.model.make`).

Deliberately ignored: the tensors' bytes (reading gigabytes would cost what the check saves),
sharded or non-safetensors weights (brorl writes and reads one safetensors file).
"""

from __future__ import annotations

import json
from pathlib import Path

from brorl.model.shapes import expected_shapes


class InputError(ValueError):
    """A file a stage reads is missing or unusable; the message names it and the fix."""


def first_line(err: BaseException) -> str:
    """`Type: first line of the message`, at most 200 characters: an error quoted in one line."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]


def check_checkpoint(folder: str | Path, field: str) -> None:
    """A Hugging Face checkpoint folder whose config, weights and tokenizer load; InputError
    naming `field` (the params key that points here) otherwise."""
    folder = Path(folder)
    fix = f"point {field} at a folder written by the base stage or save_pretrained"
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise InputError(f"{field} = {folder}: not a checkpoint folder (no config.json); {fix}.")
    try:
        config = json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{config_path}: not valid JSON ({first_line(err)}); {fix}.") from None
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise InputError(f"{field} = {folder}: no model.safetensors (one safetensors file is "
                         f"what brorl writes and reads); {fix}.")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (folder / name).is_file():
            raise InputError(f"{field} = {folder}: no {name}; {fix}.")
    found = _safetensors_shapes(weights, fix)
    try:
        expected = expected_shapes(config)
    except (KeyError, TypeError, AttributeError) as err:
        raise InputError(f"{config_path}: describes no model brorl can load (missing or bad "
                         f"{first_line(err)}); {fix}.") from None
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
        raise InputError(f"{path}: truncated or not a safetensors file ({first_line(err)}); "
                         f"{fix}.") from None
    if path.stat().st_size < 8 + header_len + end:
        raise InputError(f"{path}: truncated ({path.stat().st_size} bytes, its header describes "
                         f"{8 + header_len + end}); {fix}.")
    return shapes
