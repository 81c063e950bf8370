"""Evaluation: how a run is scored and how runs are compared.

- `protocol`: the evaluation protocol of a run (`EvalProtocol`), its rows (`evals.jsonl`), reading
  a run folder back;
- `scoring`: pass@k, per-task, per-family and per-instance scores, sampling a policy;
- `stats`: the statistics every report uses (bootstrap, paired t, TOST, Holm, power);
- `compare`: the two-arm report (Table 1 and 2 layouts, paired tests);
- `reporting`: markdown tables and the run record the reports share.
"""
