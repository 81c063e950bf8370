"""The runs of a study and each run's resolved params (docs/study.md).

A study (`brorl.params.study.StudyParams`) is the union of its arms' runs and its N-sweep's
runs; a run is one (N, seed), so the sweep's N=16 and N=512 with seeds 0-2 are the arms' runs,
not new ones (5 + 5 + 3 x 3 = 19 runs); then each variant's runs (one arm's shape with other
`update` settings, `<variant>_s<seed>`). Each run's params are the study file's with
only what makes the run itself changed (`run_params`): name, B and N (B by the study's rule,
`StudyParams.prompts_per_step`; the LR follows by the sqrt rule, `UpdateParams.lr`),
`train.seed`, the label `train.algorithm`, the equal budget `train.max_rollouts`, the evaluation
and checkpoint schedule, and the run's folders under `<out_dir>/runs/<run>/`.

`write_plan` writes one JSON file per run (its params without the `study` section): a DVC run
stage depends on its own file, so a changed study reruns exactly the runs whose params changed.

Deliberately ignored: runs that differ in anything but N, B and seed (another study file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brorl.files import atomic_write_text

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.params.study import StudyParams

PLAN_DIR = "plan"
RUNS_DIR = "runs"
STUDY_FILE = "study.json"
"""The plan folder's record of the whole study (the report stage's dependency)."""


@dataclass(frozen=True)
class StudyRun:
    """One run of a study: N, B and the seed; which arm it serves and whether the sweep uses it."""

    rollouts_per_prompt: int
    """N."""
    prompts_per_step: int
    """B, by the study's rule B(N)."""
    seed: int
    """`train.seed`: RL sampling and prompt order (never the evaluation, `train.eval_seed`)."""
    arm: str | None
    """The arm this run is a seed of; None for a run only the sweep uses."""
    in_sweep: bool
    variant: str | None = None
    """The study variant this run belongs to (`StudyParams.variants`); None for arm and sweep runs."""

    @property
    def id(self) -> str:
        """`n<N>_s<seed>` (`<variant>_s<seed>` for a variant's run): the run's folder and DVC
        stage key."""
        return f"{self.variant or f'n{self.rollouts_per_prompt}'}_s{self.seed}"

    @property
    def samples_per_step(self) -> int:
        """B * N rollouts planned per step (before dynamic-sampling refills)."""
        return self.prompts_per_step * self.rollouts_per_prompt


def plan_runs(study: StudyParams) -> list[StudyRun]:
    """Every unique (N, seed) of the study's arms and sweep, ordered by seed, then N (a study cut
    short has then as many seeds of every N as possible); then the variants' runs, by seed,
    then variant."""
    arms: dict[tuple[int, int], str] = {}
    for name, arm in study.arms.items():
        for seed in range(arm.seeds):
            arms[(arm.rollouts_per_prompt, seed)] = name
    sweep = {(n, seed) for n in study.sweep_rollouts_per_prompt
             for seed in range(study.sweep_seeds)}
    keys = sorted(set(arms) | sweep, key=lambda k: (k[1], k[0]))
    runs = [StudyRun(n, study.prompts_per_step(n), seed, arms.get((n, seed)), (n, seed) in sweep)
            for n, seed in keys]
    variants = sorted(((seed, name) for name, v in study.variants.items()
                       for seed in range(v.seeds)))
    for seed, name in variants:
        shape = study.arms[study.variants[name].arm]
        runs.append(StudyRun(shape.rollouts_per_prompt, shape.prompts_per_step, seed, None, False,
                             name))
    return runs


def find_run(study: StudyParams, run_id: str) -> StudyRun:
    """The run named `run_id`; a ValueError listing the study's runs if there is none."""
    runs = {r.id: r for r in plan_runs(study)}
    if run_id not in runs:
        raise ValueError(f"study has no run {run_id!r}; its runs are {sorted(runs)} (the DVC "
                         "foreach list, params/pipeline*.yaml study.runs, must equal them).")
    return runs[run_id]


def eval_every(study: StudyParams, run: StudyRun) -> int:
    """Steps between evaluations so they land near equal fractions of the budget: the nearest
    whole number to budget / evaluations / (B N), at least 1 (our choice; 8192 rollouts, 4
    evaluations: N = 16, 64, 256, 512, 1024 give 16, 6, 3, 2, 1). The evaluation at the budget
    itself is the run loop's (`brorl.train.Run.eval_due`)."""
    return max(1, round(study.budget_rollouts / study.evaluations / run.samples_per_step))


def run_dir(study: StudyParams, run: StudyRun) -> str:
    """`<out_dir>/runs/<run>`: the run's `train.run_dir` (checkpoints in its `checkpoints/`)."""
    return f"{study.out_dir}/{RUNS_DIR}/{run.id}"


def run_params(params: ExperimentParams, run: StudyRun) -> ExperimentParams:
    """The study's params with the run's name, shape, seed, budget, schedule and folders."""
    from brorl.params import ExperimentParams

    study = params.study
    folder, every = run_dir(study, run), eval_every(study, run)
    tree = params.model_dump(mode="json")
    tree["name"] = f"{params.name}-{run.id.replace('_', '-')}"
    tree["update"].update(prompts_per_step=run.prompts_per_step,
                          rollouts_per_prompt=run.rollouts_per_prompt)
    if run.variant is not None:
        tree["update"].update(study.variants[run.variant].update)
    tree["study"]["variants"] = {}  # checked against the study's update section, not a run's
    baseline_n = study.arms[study.baseline].rollouts_per_prompt
    tree["train"].update(
        seed=run.seed, algorithm="prorl" if run.rollouts_per_prompt == baseline_n else "brorl",
        max_rollouts=study.budget_rollouts, eval_every=every, checkpoint_every=every,
        run_dir=folder, checkpoint_dir=f"{folder}/checkpoints")
    tree["tracking"].update(metrics_dir=folder, plots_dir=folder)  # never the committed metrics/
    try:
        return ExperimentParams.model_validate(tree)
    except ValueError as err:
        raise ValueError(f"study run {run.id} (N={run.rollouts_per_prompt}, "
                         f"B={run.prompts_per_step}) has invalid params: {err}") from None


def run_tree(params: ExperimentParams) -> dict[str, Any]:
    """A run's params as its plan file holds them: without the `study` section, so a change
    to the report's settings reruns no run."""
    return params.model_dump(mode="json", exclude={"study"})


def write_plan(params: ExperimentParams, root: Path | str = ".") -> list[str]:
    """Write `<out_dir>/plan/<run>.json` per run and `study.json`; remove stale run files.
    Returns the run ids in plan order."""
    study = params.study
    folder = Path(root) / study.out_dir / PLAN_DIR
    folder.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(study)
    for run in runs:
        text = json.dumps(run_tree(run_params(params, run)), indent=1, sort_keys=True) + "\n"
        if not (folder / f"{run.id}.json").is_file() or \
                (folder / f"{run.id}.json").read_text() != text:  # unchanged files keep mtime
            atomic_write_text(folder / f"{run.id}.json", text)
    keep = {f"{r.id}.json" for r in runs} | {STUDY_FILE}
    for stale in folder.glob("*.json"):
        if stale.name not in keep:
            stale.unlink()
    record = {"name": params.name, "study": study.model_dump(mode="json"),
              "runs": [r.id for r in runs]}
    atomic_write_text(folder / STUDY_FILE, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return [r.id for r in runs]
