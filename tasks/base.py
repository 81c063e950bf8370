"""Prefect task `base`: warm the tiny policy up on the data's splits, save it, write its metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from brorl.base import make_base_checkpoint
from brorl.data import load_split
from brorl.policy import save_policy


def base_metrics(report: dict, target_pass_high: float) -> dict[str, float]:
    """Flat `base/<quantity>[_<family>]` metrics from a `make_base_checkpoint` report."""
    metrics = {"base/steps": float(report["steps"]),
               "base/train_seconds": round(report["train_seconds"], 1)}
    families = report["test"]["family"]
    for family, scores in families.items():
        metrics[f"base/pass_at_1_{family}"] = scores["pass_at_1"]
        metrics[f"base/reward_mean_{family}"] = scores["reward_mean"]
        metrics[f"base/score_{family}"] = scores["score"]
    in_band = all(s["pass_at_1"] <= target_pass_high for s in families.values())
    metrics["base/in_band"] = float(in_band)
    return metrics


@task(name="base", cache_policy=NO_CACHE, persist_result=False)
def train_base(*, data_path: str, path: str, metrics_path: str, target_pass_high: float,
               **knobs: Any) -> dict[str, Any]:
    """Warm up, save the HF folder at `path`, write metrics JSON; return paths and metrics."""
    splits = {name: load_split(data_path, name) for name in ("train", "validation", "test")}
    model, tokenizer, report = make_base_checkpoint(splits["train"], splits["validation"],
                                                    splits["test"], **knobs)
    save_policy(model, tokenizer, path)
    metrics = base_metrics(report, target_pass_high)
    Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_path).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    (Path(path).parent / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return {"path": path, "metrics_path": metrics_path, "metrics": metrics}
