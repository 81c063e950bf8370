"""A study run's folder between sessions (resume, redo or start) and the study's progress line.

Each run folder holds a marker, `study_run.json`: the digest of what the run was started with
(its params without the `study` section, the content of its start policy and of the pool's
data), whether it finished and in how many sessions. Its wall seconds go beside the folder, in
the run's `<folder>.timings.json` (`wall_seconds`, `brorl.runs.timings`), with its MLflow run's id in
`<folder>.mlflow_run.json`: the folder is a DVC output and holds neither. `prepare_run_dir`
decides from the marker before a session:
- no folder: start;
- the same digest, unfinished, with a checkpoint (an interrupted session): resume from the run's
  newest checkpoint in `<folder>/checkpoints`;
- anything else (other params or start policy; or a finished run asked to run again, which DVC
  does only when the run's code or data changed): the folder and the two files beside it are
  cleared and the run starts over.
`progress` counts the finished runs whose digest is current and estimates the time left from
their wall seconds: per remaining run, the mean of the finished runs of the same arm, else the
finished runs' seconds per nominal rollout times the run's nominal rollouts (`nominal_rollouts`).

Deliberately ignored: code changes outside DVC (a finished run asked again is redone).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brorl.runs.files import atomic_write_text
from brorl.runs.folder import latest_checkpoint, mlflow_marker
from brorl.runs.timings import read_timings, timings_path, write_timings
from brorl.study.plan import (
    StudyRun,
    find_run,
    nominal_steps,
    plan_runs,
    pool_data,
    run_dir,
    run_params,
    run_tree,
)
from brorl.study.start import start_path

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

MARKER = "study_run.json"


def folder_digest(path: Path) -> str:
    """sha256 over a folder's files (relative path and bytes, in path order), 16 hex digits;
    'missing' when there is no such folder."""
    if not path.exists():
        return "missing"
    digest = hashlib.sha256()
    for file in sorted(f for f in path.rglob("*") if f.is_file()):
        digest.update(file.relative_to(path).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def run_digest(tree: dict[str, Any], start_digest: str) -> str:
    """The identity of a run's work: its params tree (without `study`) and its start policy."""
    text = json.dumps(tree, sort_keys=True) + start_digest
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_marker(folder: Path) -> dict[str, Any] | None:
    path = folder / MARKER
    return json.loads(path.read_text()) if path.is_file() else None


@dataclass(frozen=True)
class Preparation:
    """What `prepare_run_dir` did: `resume` or `start`, and the MLflow run id of a cleared
    session (None if none), which the caller may retire."""

    action: str
    cleared_mlflow_run: str | None


def resumes(folder: Path, digest: str) -> bool:
    """Whether a session of the run with `digest` resumes `folder` (module docstring): the same
    digest, unfinished, with a checkpoint."""
    marker = read_marker(folder)
    return marker is not None and marker["digest"] == digest and not marker["finished"] and \
        latest_checkpoint(folder / "checkpoints") is not None


def will_resume(params: ExperimentParams, root: Path, run_id: str) -> bool:
    """Whether the run's next start resumes its folder (else the folder is cleared and the run
    starts over: its checkpoints are not its inputs)."""
    run = find_run(params.study, run_id)
    return resumes(root / run_dir(params.study, run), digests(params, root)[run_id])


def prepare_run_dir(folder: Path, run_id: str, digest: str) -> Preparation:
    """Get `folder` ready for a session of the run (module docstring); the marker written."""
    marker, cleared = read_marker(folder), None
    if resumes(folder, digest):
        action = "resume"
    else:
        action = "start"
        if mlflow_marker(folder).is_file():
            cleared = json.loads(mlflow_marker(folder).read_text()).get("run_id")
        mlflow_marker(folder).unlink(missing_ok=True)
        timings_path(folder).unlink(missing_ok=True)
        if folder.exists():
            shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sessions = (marker or {}).get("sessions", 0) + 1 if action == "resume" else 1
    atomic_write_text(folder / MARKER, json.dumps(
        {"run": run_id, "digest": digest, "finished": False, "sessions": sessions}) + "\n")
    return Preparation(action, cleared)


def prepare_session(params: ExperimentParams, root: Path, run_id: str,
                    started: float | None) -> dict[str, Any]:
    """Run `run_id`'s folder made ready for a session (`prepare_run_dir`), and what the session
    needs: `line` (the progress line before it), `params` (the run's resolved params, an
    `ExperimentParams`), and as plain values `tags` (arm, seed, N, B), `action`, `cleared_mlflow_run`, `folder`, `start` (the
    shared start file) and `started` (monotonic seconds at the end of the preparation)."""
    run = find_run(params.study, run_id)
    line = progress_line(params.name, run, progress(params, root, run_id, started))
    folder = root / run_dir(params.study, run)
    done = prepare_run_dir(folder, run_id, digests(params, root)[run_id])
    rp = run_params(params, run)
    tags = {"study": params.name, "arm": run.arm, "seed": str(run.seed),
            "N": str(rp.update.rollouts_per_prompt), "B": str(rp.update.prompts_per_step)}
    return {"line": line, "params": rp, "tags": tags,
            "action": done.action, "cleared_mlflow_run": done.cleared_mlflow_run,
            "folder": str(folder), "start": str(root / start_path(params.study)),
            "started": time.monotonic()}


def mark_finished(folder: Path, wall_seconds: float) -> None:
    """Record in the marker that the run finished, and its last session's wall seconds in the
    timings beside the folder."""
    marker = read_marker(folder) or {}
    marker.update(finished=True)
    atomic_write_text(folder / MARKER, json.dumps(marker) + "\n")
    write_timings(folder, {**read_timings(folder), "wall_seconds": wall_seconds})


def digests(params: ExperimentParams, root: Path) -> dict[str, str]:
    """Run id -> current digest, for every run of the study (the start policy and the pool's
    data hashed once)."""
    from brorl.study.plan import warmup_dir

    start = folder_digest(root / warmup_dir(params) / "policy") + \
        folder_digest(root / pool_data(params))
    return {run.id: run_digest(run_tree(run_params(params, run)), start)
            for run in plan_runs(params.study)}


@dataclass(frozen=True)
class Progress:
    """Runs finished of the total, seconds elapsed and estimated to go (None: no estimate)."""

    done: int
    total: int
    elapsed: float
    eta: float | None


def progress(params: ExperimentParams, root: Path, current: str,
             started: float | None = None) -> Progress:
    """The study's progress before run `current`. `started` (epoch seconds) gives the elapsed
    time; without it, elapsed is the wall time of the finished runs."""
    study = params.study
    runs: dict[str, StudyRun] = {r.id: r for r in plan_runs(study)}
    walls: dict[str, float] = {}
    for run_id, digest in digests(params, root).items():
        folder = root / run_dir(study, runs[run_id])
        marker = read_marker(folder)
        if marker and marker["finished"] and marker["digest"] == digest:
            walls[run_id] = float(read_timings(folder).get("wall_seconds", 0.0))
    elapsed = time.time() - started if started is not None else sum(walls.values())
    eta = None
    if walls:
        size = {name: nominal_rollouts(study, name) for name in study.arms}
        per_rollout = sum(walls.values()) / sum(size[runs[r].arm] for r in walls)
        eta = 0.0
        for run_id in (r for r in runs if r not in walls):
            arm = runs[run_id].arm
            same = [w for r, w in walls.items() if runs[r].arm == arm]
            eta += sum(same) / len(same) if same else per_rollout * size[arm]
    return Progress(len(walls), len(runs), elapsed, eta)


def nominal_rollouts(study, arm: str) -> int:
    """Rollouts an arm's run generates when no step refills (its size for the estimate)."""
    a = study.arms[arm]
    return nominal_steps(study, a) * a.update["prompts_per_step"] * a.update["rollouts_per_prompt"]


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def progress_line(name: str, run: StudyRun, p: Progress) -> str:
    """`study <name>: run brorl_s1 (seed 1) | 7/12 runs done | elapsed 23m10s | ETA 41m00s`."""
    eta = _clock(p.eta) if p.eta is not None else "unknown until a run finishes"
    return (f"study {name}: run {run.id} (seed {run.seed}) | {p.done}/{p.total} runs done | "
            f"elapsed {_clock(p.elapsed)} | ETA {eta}")
