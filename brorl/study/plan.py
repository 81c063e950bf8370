"""The runs of a study and each run's resolved params (docs/study.md).

A study (`brorl.params.study.StudyParams`) is its arms' runs, one per (arm, seed), named
`<arm>_s<seed>` and ordered seed by seed (a study cut short has as many seeds of every arm as
possible). Each run's params are the study file's with only what makes the run itself changed
(`run_params`): its name, the arm's `update` keys (N, B, the LR's anchor), `train.seed`, the
start (the study's warm-up policy, a fresh prompt stream over the pool: the pool is not the
warm-up's train list), the pool as its data, where it stops (the equal rollout budget, and not
before the equal step count; or the equal step count), its evaluation and checkpoint schedule
and its folders `<out_dir>/runs/<run>/`.

`write_plan` writes one JSON file per run (its params without the `study` section): a DVC run
stage depends on its own file, so a changed study reruns exactly the runs whose params changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brorl.runs.files import atomic_write_text

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.params.study import StudyArm, StudyParams

EVAL_SPLITS = ("holdout", "test")
"""What every run (and the start) is scored on: the hold-out split drawn from the pool's
difficulty band (the primary endpoint) and the pipeline's full test split (the secondary no-harm
check)."""
PLAN_DIR = "plan"
RUNS_DIR = "runs"
STUDY_FILE = "study.json"
"""The plan folder's record of the whole study (the report stage's dependency)."""
WARMUP_DIR = "warmup"
"""The warm-up's run folder under `study.out_dir` (`brorl.study.warmup`)."""


def warmup_dir(params: ExperimentParams) -> str:
    """`<out_dir>/warmup`: the warm-up's run folder (policy/, checkpoints/, evals.jsonl)."""
    return f"{params.study.out_dir}/{WARMUP_DIR}"


def pool_dir(params: ExperimentParams) -> str:
    """`<out_dir>/pool`: the pool stage's folder (pool.json, problems/)."""
    return f"{params.study.out_dir}/pool"


def pool_data(params: ExperimentParams) -> str:
    """`<out_dir>/pool/problems`: the data folder every study run trains on."""
    return f"{pool_dir(params)}/problems"


def warmup_params(params: ExperimentParams) -> ExperimentParams:
    """The study file's params as the warm-up's run: the baseline arm's update keys, validation
    evaluations every `warmup.eval_every` steps (checkpoints with them), at most
    `warmup.max_steps` steps, no rollout budget, its folders under `<out_dir>/warmup`."""
    from brorl.params import ExperimentParams

    study, w = params.study, params.study.warmup
    folder = warmup_dir(params)
    tree = params.model_dump(mode="json")
    tree["name"] = f"{params.name}-warmup"
    tree["update"].update(study.arms[study.baseline].update)
    tree["train"].update(
        algorithm="prorl", steps=w.max_steps, max_rollouts=None, max_seconds=None,
        plateau_patience=None, eval_every=w.eval_every, checkpoint_every=w.eval_every,
        eval_splits=["validation"], eval_per_family=w.eval_per_family,
        eval_samples=w.eval_samples, run_dir=folder, checkpoint_dir=f"{folder}/checkpoints")
    tree["tracking"].update(metrics_dir=folder, plots_dir=folder)
    return ExperimentParams.model_validate(tree)


@dataclass(frozen=True)
class StudyRun:
    """One run of a study: its arm and seed."""

    arm: str
    seed: int
    """`train.seed`: the prompt order and rollout sampling (never the evaluation's seed)."""

    @property
    def id(self) -> str:
        """`<arm>_s<seed>`: the run's folder and DVC stage key."""
        return f"{self.arm}_s{self.seed}"


def plan_runs(study: StudyParams) -> list[StudyRun]:
    """Every (arm, seed), seed by seed, arms in their order."""
    most = max((a.seeds for a in study.arms.values()), default=0)
    return [StudyRun(name, seed) for seed in range(most) for name, arm in study.arms.items()
            if seed < arm.seeds]


def find_run(study: StudyParams, run_id: str) -> StudyRun:
    """The run named `run_id`; a ValueError listing the study's runs if there is none."""
    runs = {r.id: r for r in plan_runs(study)}
    if run_id not in runs:
        raise ValueError(f"study has no run {run_id!r}; its runs are {sorted(runs)} (the DVC "
                         "foreach list, params/pipeline*.yaml study.runs, must equal them).")
    return runs[run_id]


def nominal_steps(study: StudyParams, arm: StudyArm) -> int:
    """RL steps the arm's runs end at when no step refills: `equal_steps`, or the budget over
    B x N."""
    if arm.stop == "steps":
        return study.equal_steps
    shape = arm.update["prompts_per_step"] * arm.update["rollouts_per_prompt"]
    return study.budget_rollouts // shape


def eval_steps(study: StudyParams) -> list[int]:
    """Steps at which a run is evaluated besides step 0 and the step that spends its budget:
    `evaluations` equal fractions of `equal_steps` (the equal-steps point the last). Every
    evaluation of the hold-out costs as much generation as a few training steps, so a long arm
    is not evaluated between `equal_steps` and its budget."""
    every = study.equal_steps // study.evaluations
    return [every * i for i in range(1, study.evaluations + 1)]


def run_dir(study: StudyParams, run: StudyRun) -> str:
    """`<out_dir>/runs/<run>`: the run's `train.run_dir` (checkpoints in its `checkpoints/`)."""
    return f"{study.out_dir}/{RUNS_DIR}/{run.id}"


def run_params(params: ExperimentParams, run: StudyRun) -> ExperimentParams:
    """The study's params with the run's name, arm, seed, start, pool, stop rule, schedule and
    folders (module docstring)."""
    from brorl.params import ExperimentParams

    study = params.study
    arm = study.arms[run.arm]
    folder = run_dir(study, run)
    baseline_n = study.arms[study.baseline].update["rollouts_per_prompt"]
    tree = params.model_dump(mode="json")
    tree["name"] = f"{params.name}-{run.id.replace('_', '-')}"
    tree["update"].update(arm.update)
    tree["data"]["path"] = pool_data(params)
    rollouts = arm.stop == "rollouts"
    steps = params.train.steps if rollouts else study.equal_steps
    tree["train"].update(
        seed=run.seed,
        algorithm="prorl" if arm.update["rollouts_per_prompt"] == baseline_n else "brorl",
        init_checkpoint=f"{warmup_dir(params)}/policy", continue_stream=False,
        max_rollouts=study.budget_rollouts if rollouts else None,
        min_steps=study.equal_steps if rollouts else None, max_seconds=None,
        steps=steps, plateau_patience=None, eval_every=steps, eval_steps=eval_steps(study),
        checkpoint_every=study.equal_steps // study.evaluations, eval_splits=list(EVAL_SPLITS),
        eval_split_samples=dict(study.eval_split_samples), run_dir=folder,
        checkpoint_dir=f"{folder}/checkpoints")
    tree["tracking"].update(metrics_dir=folder, plots_dir=folder)  # never the committed metrics/
    try:
        return ExperimentParams.model_validate(tree)
    except ValueError as err:
        raise ValueError(f"study run {run.id} ({run.arm}: {arm.update}) has invalid params: "
                         f"{err}") from None


def run_tree(params: ExperimentParams) -> dict[str, Any]:
    """A run's params as its plan file holds them: without the `study` section, so a change
    to the report's settings reruns no run."""
    return params.model_dump(mode="json", exclude={"study"})


STAGE_FILES = ("warmup.json", "pool.json")
"""Plan files of the warm-up and pool stages: what each reads of the params, so a change
elsewhere (a run's arm, the report's settings) reruns neither."""


def stage_trees(params: ExperimentParams) -> dict[str, dict[str, Any]]:
    """`STAGE_FILES` -> content: the warm-up's run params with its stop rule (the warm-up
    section, the budget its margin refers to, alpha); the pool's section with what the estimate
    and the choice read (the data, sampling, verifiers, the correct-reward threshold, each
    arm's N)."""
    study = params.study
    return {
        "warmup.json": {"run": run_tree(warmup_params(params)),
                        "warmup": study.warmup.model_dump(mode="json"),
                        "budget_rollouts": study.budget_rollouts, "alpha": study.alpha},
        "pool.json": {"pool": study.pool.model_dump(mode="json"),
                      "data": params.data.model_dump(mode="json"),
                      "generate": params.generate.model_dump(mode="json"),
                      "verify": params.verify.model_dump(mode="json"),
                      "correct_reward": params.filter.correct_reward,
                      "arms": {k: a.update["rollouts_per_prompt"] for k, a in study.arms.items()},
                      "baseline": study.baseline}}


def write_plan(params: ExperimentParams, root: Path | str = ".") -> list[str]:
    """Write `<out_dir>/plan/<run>.json` per run, the stage files (`STAGE_FILES`) and
    `study.json`; remove stale run files. Returns the run ids in plan order."""
    study = params.study
    folder = Path(root) / study.out_dir / PLAN_DIR
    folder.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(study)
    for run in runs:
        text = json.dumps(run_tree(run_params(params, run)), indent=1, sort_keys=True) + "\n"
        path = folder / f"{run.id}.json"
        if not path.is_file() or path.read_text() != text:  # unchanged files keep their mtime
            atomic_write_text(path, text)
    for name, tree in stage_trees(params).items():  # the warm-up's and the pool's settings
        text = json.dumps(tree, indent=1, sort_keys=True) + "\n"
        if not (folder / name).is_file() or (folder / name).read_text() != text:
            atomic_write_text(folder / name, text)
    keep = {f"{r.id}.json" for r in runs} | {STUDY_FILE, *STAGE_FILES}
    for stale in folder.glob("*.json"):
        if stale.name not in keep:
            stale.unlink()
    record = {"name": params.name, "study": study.model_dump(mode="json"),
              "runs": [r.id for r in runs]}
    atomic_write_text(folder / STUDY_FILE, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return [r.id for r in runs]
