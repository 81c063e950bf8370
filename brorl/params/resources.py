"""Sizes checked against this machine's memory when params load, before anything starts.

A typo such as `rollouts_per_prompt=1000000000000` would otherwise start a server and a model and
then fail (or swap) allocating a petabyte. `check_memory` estimates what the largest structures
of a run hold at once and refuses params whose estimate exceeds the memory available now
(`MemAvailable`), naming the keys, the estimate and how it was made:

- one step's rollouts: B x N x ceil(oversample) rollouts, each its record (~`BYTES_PER_ROLLOUT`:
  the Python objects, the response text, the verdict) and its tokens (`PROMPT_TOKENS` +
  `generate.max_response_tokens`, ~`BYTES_PER_TOKEN` each over the ids, masks, log-probs of policy,
  reference and engine, and advantages);
- the generated problems: the draws per task times the tasks (`BYTES_PER_PROBLEM` each);
- one evaluation: instances per family x 3 families x samples x splits rollouts.

These are lower bounds of what a run holds (the model, activations and libraries come on top):
params they refuse cannot run here; params they pass may still not fit.

Deliberately ignored: GPU memory (the engines' own settings bound it) and disk.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brorl.params.experiment import ExperimentParams

BYTES_PER_ROLLOUT = 2048
BYTES_PER_TOKEN = 48
PROMPT_TOKENS = 256
"""Tokens assumed per prompt (the CPU default's prompts are 12-60 characters)."""
BYTES_PER_PROBLEM = 2048


def available_bytes() -> int | None:
    """Memory available to a new process now (Linux `MemAvailable`), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def estimates(params: ExperimentParams) -> list[tuple[str, int, str]]:
    """(what, bytes, how) of each structure `check_memory` bounds."""
    u, g, f, d, t = params.update, params.generate, params.filter, params.data, params.train
    rollouts = u.prompts_per_step * u.rollouts_per_prompt * math.ceil(f.oversample)
    per_rollout = BYTES_PER_ROLLOUT + BYTES_PER_TOKEN * (PROMPT_TOKENS + g.max_response_tokens)
    problems = sum(section.size() for section in d.families.values())
    evaluated = t.eval_per_family * len(d.families) * t.eval_samples * len(t.eval_splits)
    return [
        ("update.prompts_per_step x update.rollouts_per_prompt",
         rollouts * per_rollout,
         f"{rollouts:,} rollouts per step x ~{per_rollout:,} B (record + "
         f"{PROMPT_TOKENS + g.max_response_tokens} tokens)"),
        ("data.families' per_task",
         problems * BYTES_PER_PROBLEM, f"{problems:,} problems x ~{BYTES_PER_PROBLEM:,} B"),
        ("train.eval_per_family x train.eval_samples",
         evaluated * per_rollout,
         f"{evaluated:,} rollouts per evaluation x ~{per_rollout:,} B"),
    ]


def check_memory(params: ExperimentParams, available: int | None = None) -> None:
    """ValueError naming the keys when an estimate exceeds `available` bytes (default: what
    this machine has available now)."""
    available = available_bytes() if available is None else available
    if available is None:
        return
    for keys, need, how in estimates(params):
        if need > available:
            raise ValueError(
                f"{keys} would hold about {need / 2**30:,.1f} GiB ({how}), more than the "
                f"{available / 2**30:,.1f} GiB of memory available here; lower them.")
