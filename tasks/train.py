"""Prefect tasks of one RL run, each a thin wrapper around one `brorl.train.Trainer` call.

The trainer (model, optimizer, rollout engine) lives in this process in a session registry;
tasks receive the session's handle, a short string, so no big object is ever pickled into a
Prefect result or sent to the Prefect API. Rollouts of each draw are written as Parquet and
referenced by path. `verify` retries (a verifier crash is transient); `ppo_update` and
`finish_step` never do (a retry would apply an update twice).

Each task adds the seconds of its brorl call to the session's `work` counters; `log_step`
compares them with the iteration's wall time, so the Prefect + MLflow overhead is measured.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from brorl.base import sample_per_family
from brorl.data import load_split
from brorl.evaluate import evaluate_policy
from brorl.params import ExperimentParams
from brorl.train import Trainer
from brorl.train.rollouts import ScoredGroups, save_groups
from brorl.train.trainer import Collection
from brorl.types import Problem, RolloutBatch
from tasks import tracking

_TASK = dict(cache_policy=NO_CACHE, persist_result=False)


@dataclass
class Session:
    """One RL run in this process: the trainer, its params, its MLflow run, its counters."""

    params: ExperimentParams
    trainer: Trainer
    eval_problems: list[Problem]
    tracking_uri: str
    run_id: str | None = None
    collection: Collection | None = None
    step_started: float = 0.0
    work: dict[str, float] = field(default_factory=dict)
    seconds_total: float = 0.0
    best_eval: float = float("-inf")
    evals_since_best: int = 0
    rollout_paths: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return tracking.ROOT / self.params.train.run_dir

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.work[name] = self.work.get(name, 0.0) + time.perf_counter() - started


SESSIONS: dict[str, Session] = {}


def session(handle: str) -> Session:
    if handle not in SESSIONS:
        raise KeyError(f"no open training session {handle!r}; open one with open_trainer first.")
    return SESSIONS[handle]


def _root_path(path: str) -> str:
    return str(tracking.ROOT / path)


@task(name="open-trainer", **_TASK)
def open_trainer(params: dict[str, Any]) -> str:
    """Build (or resume) the trainer of `params`; return the session handle."""
    p = ExperimentParams.model_validate(params)
    config = p.trainer_config()
    from dataclasses import replace

    config = replace(config, init_checkpoint=_root_path(config.init_checkpoint),
                     checkpoint_dir=_root_path(config.checkpoint_dir))
    data = _root_path(p.data.path)
    trainer = Trainer(config, load_split(data, "train"), resume=True)
    eval_problems = sample_per_family(load_split(data, "test"), p.train.eval_per_family, p.train.seed)
    handle = f"{p.name}-{uuid.uuid4().hex[:8]}"
    s = Session(p, trainer, eval_problems, tracking.resolve_tracking_uri(p.tracking.tracking_uri))
    state = s.run_dir / "session.json"
    if trainer.resumed_from is not None and state.is_file():
        saved = json.loads(state.read_text())
        s.seconds_total, s.best_eval = saved["seconds_total"], saved["best_eval"]
        s.evals_since_best = saved["evals_since_best"]
    SESSIONS[handle] = s
    return handle


@task(name="start-mlflow-run", **_TASK)
def start_run(handle: str, parent_run_id: str | None = None) -> str:
    """The arm's MLflow run: reopened when resuming (its id is kept in `<run_dir>/mlflow_run.json`)."""
    s = session(handle)
    p, marker = s.params, s.run_dir / "mlflow_run.json"
    client = MlflowClient(s.tracking_uri)
    if s.trainer.resumed_from is not None and marker.is_file():
        s.run_id = json.loads(marker.read_text())["run_id"]
        client.update_run(s.run_id, status="RUNNING")
        client.set_tag(s.run_id, "resumed_at_step", str(s.trainer.step_count))
        return s.run_id
    experiment_id = tracking.ensure_experiment(p.tracking.experiment, s.tracking_uri)
    tags = {"algorithm": p.train.algorithm, "rollouts_per_prompt": str(p.update.rollouts_per_prompt),
            "prompts_per_step": str(p.update.prompts_per_step), "git_commit": tracking.git_commit(),
            "stage": "train", "params_name": p.name, "data_path": p.data.path,
            "data_version": tracking.data_version(tracking.ROOT / p.data.path)}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    s.run_id = client.create_run(experiment_id, run_name=p.name, tags=tags).info.run_id
    tracking.log_params(s.tracking_uri, s.run_id, {**p.model_dump(mode="json"),
                                                    "derived": {"lr": p.update.lr}})
    s.run_dir.mkdir(parents=True, exist_ok=True)
    params_file = s.run_dir / "params.json"
    params_file.write_text(json.dumps(p.model_dump(mode="json"), indent=1) + "\n")
    client.log_artifact(s.run_id, str(params_file))
    marker.write_text(json.dumps({"run_id": s.run_id}) + "\n")
    return s.run_id


def budget_spent(s: Session, step_seconds: float = 0.0) -> bool:
    """True once steps, rollouts or seconds (plus `step_seconds` of a step not yet logged) reach
    their budget; the plateau rule is not a budget (it needs the evaluation itself)."""
    t, trainer = s.params.train, s.trainer
    rollouts = sum(m.get("generate/rollouts", 0.0) for m in trainer.history)
    return (trainer.step_count >= t.steps
            or (t.max_rollouts is not None and rollouts >= t.max_rollouts)
            or (t.max_seconds is not None and s.seconds_total + step_seconds >= t.max_seconds))


def track_best(best: float, since: int, value: float) -> tuple[float, int]:
    """(best held-out pass@1, evaluations since it) after an evaluation scoring `value`: the
    plateau rule (`train.plateau_patience`) ends a run once `since` reaches the patience."""
    return (value, 0) if value > best else (best, since + 1)


@task(name="budget-left", **_TASK)
def budget_left(handle: str) -> bool:
    """True while steps, rollouts, seconds and the plateau rule all allow another step."""
    s = session(handle)
    t = s.params.train
    return (not budget_spent(s)
            and (t.plateau_patience is None or s.evals_since_best < t.plateau_patience))


@task(name="begin-step", **_TASK)
def begin_step(handle: str) -> int:
    """Start the step's clock and its dynamic-sampling collection; return the step number."""
    s = session(handle)
    s.step_started, s.work = time.perf_counter(), {}
    s.collection = s.trainer.start_collection()
    return s.trainer.step_count + 1


@task(name="sample_prompts", **_TASK)
def sample_prompts(handle: str) -> list[Problem]:
    """The prompts of the next draw (as many as the collection still needs)."""
    s = session(handle)
    with s.timed("sample_prompts"):
        return s.trainer.sample_prompts(s.collection.request())


@task(name="generate_rollouts", **_TASK)
def generate_rollouts(handle: str, problems: list[Problem]) -> RolloutBatch:
    """N rollouts per prompt from the current policy."""
    s = session(handle)
    with s.timed("generate_rollouts"):
        return s.trainer.generate_rollouts(problems, s.collection.rounds)


@task(name="verify", retries=2, retry_delay_seconds=1, **_TASK)
def verify(handle: str, problems: list[Problem], batch: RolloutBatch) -> ScoredGroups:
    """Rewards from the family verifiers; the draw is saved as Parquet (path kept in the session)."""
    s = session(handle)
    with s.timed("verify"):
        groups = s.trainer.verify(problems, batch)
        if s.params.train.save_rollouts:
            name = f"step_{s.trainer.step_count + 1:06d}_draw{s.collection.rounds}.parquet"
            path = save_groups(groups, s.run_dir / "rollouts" / name)
            s.rollout_paths.append(str(path))
    return groups


@task(name="filter", **_TASK)
def filter_groups(handle: str, groups: ScoredGroups) -> bool:
    """Keep the draw's informative groups; True once the step has enough (or the budget is spent)."""
    s = session(handle)
    with s.timed("filter"):
        s.collection.add(groups, dict(s.trainer.last_seconds))
        return s.collection.done


@task(name="ppo_update", **_TASK)
def ppo_update(handle: str) -> dict[str, float]:
    """The PPO mini-batches on the kept groups, then the step's bookkeeping (no retries)."""
    s = session(handle)
    with s.timed("ppo_update"):
        collected = s.collection.finish()
        metrics = dict(collected.metrics)
        if collected.groups is not None:
            metrics.update(s.trainer.update(collected.groups))
        metrics = s.trainer.finish_step(metrics, time.perf_counter() - s.step_started)
    s.collection = None
    return metrics


def eval_due(handle: str) -> bool:
    """Every `train.eval_every` steps, and at the step that spends the budget: the arms of a
    comparison end on an evaluation at the same budget, whatever their step sizes."""
    s = session(handle)
    return (s.trainer.step_count % s.params.train.eval_every == 0
            or budget_spent(s, time.perf_counter() - s.step_started))


@task(name="evaluate", **_TASK)
def evaluate(handle: str) -> dict[str, float]:
    """Held-out pass@1 per family of the current policy (the same instances every time)."""
    s = session(handle)
    t = s.params.train
    with s.timed("evaluate"):
        scores, rewards = evaluate_policy(
            s.trainer.model, s.trainer.tokenizer, s.eval_problems, n=t.eval_samples,
            max_new_tokens=s.params.generate.max_response_tokens,
            temperature=t.eval_temperature, top_p=t.eval_top_p, seed=t.seed,
            workers=s.params.verify.workers)
    metrics = {f"eval/{q}_{fam}": v for fam, row in scores["family"].items()
               for q, v in row.items() if q in ("pass_at_1", "reward_mean", "score")}
    mean_pass = sum(r["pass_at_1"] for r in scores["family"].values()) / len(scores["family"])
    metrics["eval/pass_at_1_mean"] = mean_pass
    s.best_eval, s.evals_since_best = track_best(s.best_eval, s.evals_since_best, mean_pass)
    elapsed = s.seconds_total + (time.perf_counter() - s.step_started if s.trainer.step_count else 0)
    record = {"step": s.trainer.step_count, "seconds": elapsed,
              "rollouts": sum(m.get("generate/rollouts", 0.0) for m in s.trainer.history),
              "scores": scores, "problem_ids": [p.id for p in s.eval_problems],
              "pass_at_1": [float((r >= 1.0).mean()) for r in rewards]}
    s.run_dir.mkdir(parents=True, exist_ok=True)
    with (s.run_dir / "evals.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")
    history = s.trainer.history
    if history and history[-1].get("train/step") == s.trainer.step_count:
        history[-1].update(metrics)  # before the checkpoint, so a resume keeps it
    return metrics


@task(name="checkpoint", **_TASK)
def checkpoint(handle: str, force: bool = False) -> str | None:
    """Save a checkpoint when due (or `force`); also the session counters beside it."""
    s = session(handle)
    if not (force or s.trainer.checkpoint_due()):
        return None
    with s.timed("checkpoint"):
        path = s.trainer.save_checkpoint()
        s.run_dir.mkdir(parents=True, exist_ok=True)
        (s.run_dir / "session.json").write_text(json.dumps(
            {"seconds_total": s.seconds_total, "best_eval": s.best_eval,
             "evals_since_best": s.evals_since_best, "step": s.trainer.step_count}) + "\n")
    return str(path)


@task(name="log-step", **_TASK)
def log_step(handle: str, metrics: dict[str, float]) -> dict[str, float]:
    """Step metrics + per-task seconds + orchestration share to MLflow (one batch)."""
    s = session(handle)
    wall = time.perf_counter() - s.step_started
    s.seconds_total += wall
    out = dict(metrics)
    for name, seconds in s.work.items():
        out[f"time/{name}"] = seconds
    work = sum(s.work.values())
    out["time/iteration"] = wall
    out["time/orchestration_share"] = max(wall - work, 0.0) / wall if wall else 0.0
    out["time/run_seconds"] = s.seconds_total
    out["generate/rollouts_total"] = sum(m.get("generate/rollouts", 0.0) for m in s.trainer.history)
    started = time.perf_counter()
    tracking.log_metric_series(s.tracking_uri, s.run_id, [s.trainer.step_count],
                               {k: [v] for k, v in out.items()})
    out["time/mlflow"] = time.perf_counter() - started
    tracking.log_metric_series(s.tracking_uri, s.run_id, [s.trainer.step_count],
                               {"time/mlflow": [out["time/mlflow"]]})
    if s.trainer.history and s.trainer.history[-1].get("train/step") == s.trainer.step_count:
        s.trainer.history[-1].update({k: v for k, v in out.items() if k.startswith("time/")})
    get_run_logger().info(progress_line(s.params.name, s.trainer.step_count, out))
    return out


def progress_line(name: str, step: int, m: dict[str, float]) -> str:
    """One human line per step: reward, pass rate, throughput, held-out pass@1 when evaluated."""
    parts = [f"{name} step {step}"]
    if "generate/rollouts" in m:
        parts.append(f"{m['generate/rollouts_per_s']:.0f} rollouts/s "
                     f"({int(m['generate/rollouts'])} rollouts, {int(m['generate/rollouts_total'])} total)")
        parts.append(f"reward {m['verify/reward_mean']:.3f}")
        parts.append(f"pass rate {100 * m['filter/pass_rate']:.0f}%")
    evals = [f"{k.removeprefix('eval/pass_at_1_')} {v:.2f}" for k, v in sorted(m.items())
             if k.startswith("eval/pass_at_1_") and k != "eval/pass_at_1_mean"]
    if evals:
        parts.append("held-out pass@1 " + " ".join(evals))
    parts.append(f"{m['time/iteration']:.1f} s")
    return " | ".join(parts)


@task(name="finish-run", **_TASK)
def finish_run(handle: str) -> dict[str, Any]:
    """Final checkpoint, the policy folder `<run_dir>/policy`, summary JSON, MLflow artifacts."""
    s = session(handle)
    trainer = s.trainer
    folder = trainer.save_checkpoint()
    from brorl.policy import save_policy

    save_policy(trainer.model, trainer.tokenizer, s.run_dir / "policy")
    summary = {"name": s.params.name, "algorithm": s.params.train.algorithm,
               "steps": trainer.step_count, "mlflow_run_id": s.run_id,
               "rollouts": sum(m.get("generate/rollouts", 0.0) for m in trainer.history),
               "seconds": s.seconds_total, "checkpoint": str(folder),
               "policy": str(s.run_dir / "policy"), "params": s.params.model_dump(mode="json"),
               "history": trainer.history}
    path = s.run_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=1) + "\n")
    write_dvc_files(s)
    client = MlflowClient(s.tracking_uri)
    for artifact in (path, s.run_dir / "evals.jsonl"):
        if artifact.is_file():
            client.log_artifact(s.run_id, str(artifact))
    client.log_artifacts(s.run_id, str(s.run_dir / "policy"), artifact_path="policy")
    client.set_terminated(s.run_id, status="FINISHED")
    del SESSIONS[handle]
    return {k: v for k, v in summary.items() if k not in ("history", "params")}


def write_dvc_files(s: Session) -> None:
    """`<metrics_dir>/<name>.json` (last evaluation, budget used) and `<plots_dir>/<name>/eval.csv`."""
    evals_path = s.run_dir / "evals.jsonl"
    evals = [json.loads(x) for x in evals_path.read_text().splitlines()] if evals_path.is_file() else []
    by_step = {e["step"]: e for e in evals}
    rows = [by_step[k] for k in sorted(by_step)]
    families = sorted(rows[-1]["scores"]["family"]) if rows else []
    history = [m for m in s.trainer.history if m.get("train/step", 0) > 0]
    metrics: dict[str, float] = {
        "steps": float(s.trainer.step_count), "seconds": round(s.seconds_total, 1),
        "rollouts": sum(m.get("generate/rollouts", 0.0) for m in history),
        "pass_rate": (sum(m.get("filter/pass_rate", 0.0) for m in history) / len(history)
                      if history else 0.0),
    }
    for fam in families:
        metrics[f"pass_at_1_{fam}"] = rows[-1]["scores"]["family"][fam]["pass_at_1"]
    root = tracking.ROOT
    out = root / s.params.tracking.metrics_dir / f"{s.params.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    lines = ["step,rollouts,seconds," + ",".join(f"pass_at_1_{f}" for f in families)
             + ",pass_at_1_mean"]
    for r in rows:
        passes = [r["scores"]["family"][f]["pass_at_1"] for f in families]
        mean = sum(passes) / len(passes) if passes else 0.0
        lines.append(f"{r['step']},{int(r['rollouts'])},{r['seconds']:.2f},"
                     + ",".join(f"{v:.4f}" for v in passes) + f",{mean:.4f}")
    plots = root / s.params.tracking.plots_dir / s.params.name / "eval.csv"
    plots.parent.mkdir(parents=True, exist_ok=True)
    plots.write_text("\n".join(lines) + "\n")


@task(name="fail-run", **_TASK)
def fail_run(handle: str) -> None:
    """Mark the MLflow run failed and drop the session (the checkpoint on disk stays)."""
    s = SESSIONS.pop(handle, None)
    if s is not None and s.run_id is not None:
        MlflowClient(s.tracking_uri).set_terminated(s.run_id, status="FAILED")
