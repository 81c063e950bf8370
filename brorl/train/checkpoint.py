"""Checkpoint folders of an RL run: written under a temporary name, renamed when complete, pruned.

Layout of `<checkpoint_dir>/step_000012/`:
- `policy/`: the policy as a Hugging Face folder (model + tokenizer): any later stage, vLLM or
  `from_pretrained` loads it as is;
- `reference/`: the KL reference policy (HF folder);
- `deepspeed/`: DeepSpeed's engine checkpoint (optimizer partitions per rank, LR scheduler);
- `rng_rank<r>.pt`: each rank's global torch and numpy RNG states (not python's: brorl draws
  from generators of its own, and in a Prefect flow the orchestration libraries draw from
  python's global RNG as often as the clock makes them, so its state made every checkpoint, and
  the run's output hash, differ);
- `params.json`: the resolved params of the run that wrote it (`brorl.runs.folder.record_params`);
- `trainer_state.json`: step, data cursor, metric history. Written last: a folder without it is
  incomplete and ignored.

What can be read without torch (the layout's names, the `latest` pointer, the trainer state, the
params record) lives in `brorl.runs.folder`, and `atomic_write_text` in `brorl.runs.files`; both are
re-exported here for the trainer.

All ranks write into `.tmp-step_000012/`; after a barrier rank 0 renames it to `step_000012/`,
replaces the `latest` pointer file atomically and removes the oldest folders beyond `keep`. A
crash at any point leaves the previous checkpoint and `latest` intact.

Deliberately ignored: remote storage, asynchronous saving, keeping the best-by-metric checkpoint.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from brorl.runs.files import atomic_write_text
from brorl.runs.folder import (
    LATEST_FILE,
    PARAMS_FILE,
    STATE_FILE,
    is_complete,
    latest_checkpoint,
    policy_to_evaluate,
    read_state,
    staging_dir,
    step_name,
)

__all__ = ["LATEST_FILE", "PARAMS_FILE", "STATE_FILE", "atomic_write_text", "commit",
           "is_complete", "latest_checkpoint", "load_rng", "policy_to_evaluate", "read_state",
           "rng_states", "save_rng", "seed_rngs", "staging_dir", "step_name", "write_state"]


def commit(root: str | Path, step: int, keep: int) -> Path:
    """Rank 0, after every rank wrote `staging_dir(root, step)`: rename, point `latest`, prune."""
    root = Path(root)
    staged, final = staging_dir(root, step), root / step_name(step)
    if not is_complete(staged):
        raise RuntimeError(f"{staged} has no {STATE_FILE}: the checkpoint was not fully written.")
    if (root / PARAMS_FILE).is_file():  # the params that made it (`run_files.record_params`)
        shutil.copyfile(root / PARAMS_FILE, staged / PARAMS_FILE)
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


def seed_rngs(seed: int, rank: int) -> None:
    """Seed this process's global torch, numpy and python RNGs from the run's seed and rank.

    No result draws from them (every draw has a generator of its own), but a checkpoint saves
    torch's and numpy's (`save_rng`), and torch and numpy seed them from the OS at start-up:
    unseeded, every run's `rng_rank<r>.pt` differed, so a rerun that reproduced every weight
    still changed its output's hash (dvc.lock). A resumed run then restores the checkpoint's
    (`load_rng`)."""
    value = seed * 1_000_003 + rank
    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)


def rng_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}


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
    if "python" in states:  # written before python's state was left out
        random.setstate(states["python"])
