"""A study: ProRL vs BroRL over many seeds and an N-sweep, each run from the one warm-up policy at
an equal rollout budget (issue: "A ProRL-vs-BroRL study that can be believed"; docs/study.md).

- `plan`: the runs of `params.study` and each run's resolved params; the plan files DVC reads.
- `start`: the step-0 evaluation every run shares, scored once.
- `progress`: a run folder between sessions (resume, redo, start) and the study's progress line.
- `results`: the finished runs read back from their folders (per-instance scores, pooled rates).
- `analysis`: every number of the report, with `brorl.stats` (bootstrap intervals, paired tests).
- `report` and `figures`: report.md, report.json, the PNGs, the verdict, the DVC headline.

Python API:
    from brorl.params import load_params
    from brorl.study.plan import plan_runs, run_params
    params = load_params("params/study.yaml")
    for run in plan_runs(params.study):
        Run.open(run_params(params, run)).train()      # brorl.train.Run
    build_report(params)                               # brorl.study.report
"""

from brorl.study.plan import StudyRun, find_run, plan_runs, run_dir, run_params, write_plan

__all__ = ["StudyRun", "find_run", "plan_runs", "run_dir", "run_params", "write_plan"]
