"""A study: ProRL against BroRL at two learning rates (and N = 16 at BroRL's prompts per step),
from one start shown plateaued, on a prompt pool with headroom, over several seeds, each run
scored at equal rollouts and at equal optimizer steps (docs/study.md holds the plan).

- `warmup`: the study's warm-up, trained until a TOST shows its validation slope flat, or a cap.
- `pool`: the RL prompts, chosen on the train split by the start policy's estimated pass rate.
- `plan`: the runs of `params.study` and each run's resolved params; the plan files DVC reads.
- `start`: the step-0 evaluation every run shares, scored once.
- `progress`: a run folder between sessions (resume, redo, start) and the study's progress line.
- `results`: the finished runs read back from their folders (per-instance scores, pooled rates).
- `analysis`: every number of the report (`brorl.evaluation.stats`: two-way bootstrap intervals, seed-level
  tests, Holm, TOST); `power`: the plan's a-priori power analysis.
- `report` and `figures`: report.md, report.json, the PNGs, the verdict, the DVC headline.

Python API (what the stages of study/dvc.yaml run, without Prefect):
    from brorl.params import load_params
    from brorl.train import Run
    from brorl.study import plan_runs, run_params, warmup_params
    from brorl.study.warmup import train_to_plateau, write_plateau
    from brorl.study.pool import write_pool
    from brorl.study.report import build_report
    params = load_params("params/study.yaml")
    warmup = Run.open(warmup_params(params))
    write_plateau(warmup.run_dir, train_to_plateau(warmup, params.study))
    write_pool(params)
    for run in plan_runs(params.study):
        Run.open(run_params(params, run)).train()
    build_report(params)       # needs the shared start too: brorl.study.start.score_start
"""

from brorl.study.plan import (
    StudyRun,
    find_run,
    plan_runs,
    run_dir,
    run_params,
    warmup_dir,
    warmup_params,
    write_plan,
)

__all__ = ["StudyRun", "find_run", "plan_runs", "run_dir", "run_params", "warmup_dir",
           "warmup_params", "write_plan"]
