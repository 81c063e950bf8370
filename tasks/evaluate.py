"""Prefect tasks of the `evaluate` flow: score a checkpoint on the held-out problems, record it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

import tracking
from brorl.data import load_split
from brorl.evaluation.protocol import EvalProtocol, policy_engine
from brorl.params import ExperimentParams
from brorl.runs.folder import policy_to_evaluate
from brorl.system.checkout import find_root

_TASK = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="evaluate-checkpoint", **_TASK)
def evaluate_checkpoint(p: ExperimentParams, checkpoint: str | None) -> dict[str, Any]:
    """Held-out pass@1 per task and family of `checkpoint` (HF folder) on the test split, under
    the run's evaluation protocol (the instances and sampling of its own evaluations, through
    its rollout engine)."""
    root = find_root()
    path = Path(checkpoint) if checkpoint else policy_to_evaluate(
        root / p.train.run_dir, root / p.train.checkpoint_dir, root / p.train.init_checkpoint)
    engine, tokenizer = policy_engine(p, path)
    protocol = EvalProtocol.from_params(p)
    problems = protocol.instances(load_split(root / p.data.path, "test"))
    row = protocol.score(engine, tokenizer, problems, split="test")
    return {"checkpoint": str(path), **{k: row[k] for k in
                                        ("scores", "problem_ids", "families", "pass_at_1", "score")}}


@task(name="evaluate-record", **_TASK)
def record(p: ExperimentParams, result: dict[str, Any]) -> dict[str, Any]:
    """Write `<tracking.output_dir>/evaluate/<name>.json` and one MLflow run with the scores."""
    root = find_root()
    out = root / p.tracking.output_dir / "evaluate" / f"{p.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    uri = tracking.resolve_tracking_uri(p.tracking.tracking_uri)
    metrics = {f"eval/{q}_{fam}": [v] for fam, row in result["scores"]["family"].items()
               for q, v in row.items()}
    tags = {"stage": "evaluate", "algorithm": p.train.algorithm, "checkpoint": result["checkpoint"],
            "data_version": tracking.data_version(root / p.data.path)}
    with tracking.mlflow_run(p.tracking.experiment, uri, f"{p.name}-evaluate", tags) as run_id:
        tracking.log_params(uri, run_id, p.model_dump(mode="json", include={"name", "train"}))
        tracking.log_metric_series(uri, run_id, [0], metrics)
        MlflowClient(uri).log_artifact(run_id, str(out))
    return {"path": str(out), "mlflow_run_id": run_id,
            "pass_at_1": {f: r["pass_at_1"] for f, r in result["scores"]["family"].items()}}
