"""The study's start evaluation, scored once for all its runs.

Every run of a study starts from the warm-up policy and is evaluated at step 0 on the same test
instances with the same sampling seed: the same rows in every run (`Run.eval_protocol` is equal).
The `study_start` stage scores them once (`score_start`, written to `<out_dir>/start/start.json`),
and each run records them as its step-0 evaluation (`Run.train(start=)`, which refuses rows of
another protocol) instead of scoring them again. The same instances are scored
`study.start_replicates` times in all, under other sampling seeds (`EvalProtocol.score`'s
`replicate`): a contrast against the start sets the arm's seeds against these draws, so the
start's own evaluation noise enters the test. The rows are stored without their `seconds` (0 at
step 0; a DVC output holds no wall-clock figure).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brorl.runs.files import atomic_write_text
from brorl.runs.timings import split_timings
from brorl.study.plan import plan_runs, run_params

if TYPE_CHECKING:
    from brorl.params import ExperimentParams
    from brorl.params.study import StudyParams

START_DIR = "start"
START_FILE = "start.json"


def start_path(study: StudyParams) -> str:
    """`<out_dir>/start/start.json`."""
    return f"{study.out_dir}/{START_DIR}/{START_FILE}"


def score_start(params: ExperimentParams, root: Path | str = ".") -> dict[str, Any]:
    """The step-0 evaluation of the study's first run (any run would do: they share the
    protocol), scored in `<out_dir>/start/` (its evals.jsonl), and `study.start_replicates` - 1
    more draws of it (other sampling seeds, the same instances): `{"protocol", "rows",
    "replicates"}`, `replicates[r]` the rows of draw r (draw 0 is `rows`)."""
    from brorl.params import ExperimentParams
    from brorl.train import Run

    tree = run_params(params, plan_runs(params.study)[0]).model_dump(mode="json")
    folder = f"{params.study.out_dir}/{START_DIR}"
    tree["train"].update(run_dir=folder, checkpoint_dir=f"{folder}/checkpoints")
    run = Run.open(ExperimentParams.model_validate(tree), root, resume=False)
    run.evaluate()
    rows = [split_timings(row)[0] for row in run.state.evals]
    protocol, trainer = run.config.eval_protocol, run.trainer
    replicates = [rows] + [
        [split_timings(protocol.score(trainer.rollout_engine, trainer.tokenizer, problems,
                                      split=split, replicate=r))[0]
         for split, problems in run.eval_problems.items()]
        for r in range(1, params.study.start_replicates)]
    return {"protocol": run.eval_protocol(), "rows": rows, "replicates": replicates}


def write_start(params: ExperimentParams, root: Path) -> Path:
    """`score_start`, written to `<root>/<out_dir>/start/start.json`; that path. A frozen start
    (`brorl.study.frozen`) is reused as it is."""
    from brorl.study.frozen import check

    path = root / start_path(params.study)
    if check(params, root, "start"):
        return path
    atomic_write_text(path, json.dumps(score_start(params, root), indent=1, sort_keys=True) + "\n")
    return path
