"""A checkpoint's pass@1 per family and task before any RL: where there is headroom.

Scores the model stage's checkpoint of a params file (`model.checkpoint`) on held-out problems of
every family (the params' data settings, each family's generated count switched on, the
VALIDATION split: choosing families on the test split would select on it), k samples per
problem, at the evaluation protocol (temperature 0.6, top-p 0.95, BroRL App. D) and at the rollout
temperatures given, sampled by the params' rollout engine as evaluations are. Prints and records
(benchmarks/record.py) per family and temperature: pass@1 (avg@k), the share of problems solved
at least once, the mean response length in the model's tokens and the share cut at the length
limit; then per task at the evaluation protocol.

Usage: python benchmarks/base_pass_rates.py --params params/smollm2.yaml
       (after `brorl model --params params/smollm2.yaml` wrote the checkpoint)
Deliberately ignored: the test split (selection happens on validation only), pass@k beyond 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # brorl and benchmarks.record

import numpy as np  # noqa: E402

from benchmarks.record import Table, save, show  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params/smollm2.yaml")
    ap.add_argument("--per-family", type=int, default=30, help="validation problems per family")
    ap.add_argument("--samples", type=int, default=4, help="k, samples per problem")
    ap.add_argument("--temperatures", default="0.6,1.0,1.2",
                    help="0.6 is the evaluation protocol (top-p 0.95); others use top-p 1")
    ap.add_argument("--per-task", type=int, default=150, help="generated problems per task")
    args = ap.parse_args(argv)

    from brorl.data import DataConfig, make_splits
    from brorl.evaluation.protocol import policy_engine, sample_per_family
    from brorl.evaluation.scoring import sample_responses
    from brorl.families import verify_batch
    from brorl.params import load_params

    params = load_params(ROOT / args.params, [f"data.{f}_per_task={args.per_task}"
                                              for f in ("math", "code", "reasoning")])
    problems = sample_per_family(make_splits(DataConfig.from_params(params.data))["validation"],
                                 args.per_family, params.train.eval_seed)
    engine, tokenizer = policy_engine(params, ROOT / params.model.checkpoint)
    limit = params.generate.max_response_tokens
    families, tasks = [], []
    for temperature in (float(t) for t in args.temperatures.split(",")):
        started = time.perf_counter()
        top_p = 0.95 if temperature == 0.6 else 1.0
        responses = sample_responses(engine, tokenizer, problems, n=args.samples,
                                     max_new_tokens=limit, temperature=temperature,
                                     top_p=top_p, seed=0)
        flat = [r for rs in responses for r in rs]
        verdicts = verify_batch([p for p in problems for _ in range(args.samples)], flat)
        correct = np.array([v.reward >= 1.0 for v in verdicts]).reshape(len(problems), -1)
        lengths = np.array([len(tokenizer(r, add_special_tokens=False)["input_ids"])
                            for r in flat]).reshape(len(problems), -1)
        by_family, by_task = defaultdict(list), defaultdict(list)
        for i, p in enumerate(problems):
            by_family[p.family].append(i)
            by_task[f"{p.family}/{p.task}"].append(i)
        for family, rows in sorted(by_family.items()):
            families.append([family, temperature, top_p, len(rows),
                             round(float(correct[rows].mean()), 3),
                             round(float(correct[rows].any(axis=1).mean()), 3),
                             round(float(lengths[rows].mean()), 1),
                             round(float((lengths[rows] >= limit).mean()), 3)])
        if temperature == 0.6:
            tasks = [[task, len(rows), round(float(correct[rows].mean()), 3)]
                     for task, rows in sorted(by_task.items())]
        print(f"temperature {temperature}: {time.perf_counter() - started:.0f} s", flush=True)
    name = params.model.gguf_file or params.model.hf_folder or params.model.source
    tables = [
        Table(f"{name}: pass@1 per family on validation problems ({args.samples} samples each, "
              f"{limit} response tokens)",
              ["family", "temperature", "top_p", "problems", "pass@1", "solved at least once",
               "mean response tokens", "cut at the limit"], families),
        Table("pass@1 per task at the evaluation protocol (temperature 0.6, top-p 0.95)",
              ["task", "problems", "pass@1"], tasks)]
    show(tables)
    save("base_pass_rates", tables)


if __name__ == "__main__":
    main()
