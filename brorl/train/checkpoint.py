"""Checkpoint folders of an RL run: written under a temporary name, renamed when complete, pruned.

Layout of `<checkpoint_dir>/step_000012/`:
- `policy/`: the policy as a Hugging Face folder (model + tokenizer): any later stage, vLLM or
  `from_pretrained` loads it as is;
- `reference/`: the KL reference policy (HF folder);
- `deepspeed/`: DeepSpeed's engine checkpoint (optimizer partitions per rank, LR scheduler);
- `rng_rank<r>.pt`: each rank's torch / numpy / python RNG states;
- `trainer_state.json`: step, data cursor, metric history. Written last: a folder without it is
  incomplete and ignored.

All ranks write into `.tmp-step_000012/`; after a barrier rank 0 renames it to `step_000012/`,
replaces the `latest` pointer file atomically and removes the oldest folders beyond `keep`. A
crash at any point leaves the previous checkpoint and `latest` intact.

Deliberately ignored: remote storage, asynchronous saving, keeping the best-by-metric checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.json"
LATEST_FILE = "latest"


def step_name(step: int) -> str:
    return f"step_{step:06d}"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary sibling and `os.replace`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def staging_dir(root: str | Path, step: int) -> Path:
    """The temporary folder all ranks write step `step` into (same name on every rank)."""
    return Path(root) / f".tmp-{step_name(step)}"


def is_complete(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file()


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`: the `latest` pointer, else the highest step."""
    root = Path(root)
    pointer = root / LATEST_FILE
    if pointer.is_file():
        folder = root / pointer.read_text().strip()
        if is_complete(folder):
            return folder
    done = sorted(p for p in root.glob("step_*") if p.is_dir() and is_complete(p))
    return done[-1] if done else None


def policy_to_evaluate(run_dir: str | Path, checkpoint_dir: str | Path,
                       init_checkpoint: str | Path) -> Path:
    """A run's final policy (`<run_dir>/policy`), else its newest checkpoint's policy, else its
    starting point: what an evaluation of the run scores by default."""
    final = Path(run_dir) / "policy"
    if (final / "config.json").is_file():
        return final
    latest = latest_checkpoint(checkpoint_dir)
    return latest / "policy" if latest else Path(init_checkpoint)


def commit(root: str | Path, step: int, keep: int) -> Path:
    """Rank 0, after every rank wrote `staging_dir(root, step)`: rename, point `latest`, prune."""
    root = Path(root)
    staged, final = staging_dir(root, step), root / step_name(step)
    if not is_complete(staged):
        raise RuntimeError(f"{staged} has no {STATE_FILE}: the checkpoint was not fully written.")
    if final.exists():  # a rerun of the same step after a resume: replace it
        shutil.rmtree(final)
    staged.rename(final)
    atomic_write_text(root / LATEST_FILE, final.name + "\n")
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[: max(len(done) - keep, 0)]:
        shutil.rmtree(old)
    return final


def write_state(folder: Path, state: dict[str, Any]) -> None:
    """The trainer state JSON (the completion marker), atomically."""
    atomic_write_text(folder / STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")


def read_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / STATE_FILE).read_text())


def rng_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate()}


def save_rng(folder: Path, rank: int) -> None:
    torch.save(rng_states(), folder / f"rng_rank{rank}.pt")


def load_rng(folder: Path, rank: int) -> None:
    """Restore this rank's RNG states (a missing file, e.g. after a world-size change, is skipped)."""
    path = folder / f"rng_rank{rank}.pt"
    if not path.is_file():
        return
    states = torch.load(path, weights_only=False)
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
