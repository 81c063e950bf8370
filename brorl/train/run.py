"""One RL run: the loop that every entry point drives (Python API, `python -m brorl.train`,
torchrun, the Prefect flow `flows/train.py`).

A `Run` wraps a `Trainer` (the mechanics of a step) with what a run is: its `RunState` (rollout
counter, training seconds with evaluation and checkpoint time kept apart, per-step metrics, the
evaluation rows and the best validation score), the stop rules (`RunConfig`: steps, rollout
budget, training-time budget, plateau), the evaluation and checkpoint schedule, and resume: the
state is saved inside every checkpoint, so a resumed run continues its counters and records
exactly where the checkpoint left them (no repeated evaluation rows).

The budgets are the paper's bookkeeping (BroRL Table 1, §4.2.1): a step never spends past
`max_rollouts` (its draws are capped at the rollouts left, and the run stops once fewer than N
remain; with `min_steps` it goes on past the spent budget, uncapped, to that step, and the step
that spent the budget is evaluated), and time is the training stages' seconds only
(`TRAIN_STAGES`). Evaluations score each split of `eval_splits` on fixed instances
(`brorl.evaluation.protocol` holds the row format); the plateau rule follows `val/score_mean` only. A run's
end writes `run.json` beside its policy, so a run that starts from that policy continues its
prompt stream and seeds (`brorl.train.sampler`).

The run's folder holds no wall-clock figure or absolute path (same weights, same bytes for DVC):
the seconds go to `<run_dir>.timings.json` beside it (`brorl.runs.timings`), with every checkpoint.

The loop is written once, here (`train`, `step`). Orchestration plugs in through a `Driver`:
`stage(run, method, *args)` runs the stage method `method(run, *args)` (`Run.verify`, ...: the
function itself, so the result has its type; the Prefect driver runs it as its task),
`iteration(step, body)` runs one step (the Prefect driver makes it a subflow),
`on_step(run, metrics)` observes a finished step (MLflow logging). `Direct` runs
everything in place. Every stage method takes its inputs and returns its output with its own
seconds (`Timed`), so the orchestration's share of a step is the step's wall time minus the
stages' seconds.

Multi-process (torchrun / deepspeed launcher): every rank draws the same prompts; each generates
and verifies its share of a draw (all of it on rank 0 with the vllm engine), and the whole draw
is gathered on every rank, so the filter keeps the same groups everywhere. Rank 0 evaluates;
what the other ranks need from it (evaluation rows, stop decisions, the step's figures) is
broadcast, so every rank takes the same branch at the same step.

Deliberately ignored: early stopping on anything but `val/score_mean`; best-checkpoint selection
(the last state is the run's result; the best validation step is reported in the summary).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from brorl.data import load_split
from brorl.evaluation.protocol import (
    SELECTION_METRIC,
    eval_metrics,
    evals_jsonl,
    row_split,
    sample_per_family,
)
from brorl.runs.files import checkout_relative
from brorl.runs.folder import record_params
from brorl.runs.timings import read_timings, write_timings
from brorl.train import checkpoint as ckpt
from brorl.train.collection import Collected, Collection
from brorl.train.config import RunConfig, TrainerConfig
from brorl.train.diagnostics import (
    Shrinkage,
    build_probes,
    first_order_split,
    rollout_parts,
)
from brorl.train.report import step_line, write_summary
from brorl.train.rollouts import ScoredGroups, save_groups
from brorl.train.sampler import RUN_RECORD, run_record
from brorl.train.state import RunState
from brorl.train.trainer import RewardFn, Trainer, parameter_digest
from brorl.train.verification import ChunkVerifier, Generated
from brorl.types import Problem, Timed, timed

if TYPE_CHECKING:
    from brorl.params import ExperimentParams

TRAIN_STAGES = ("sample_prompts", "generate_rollouts", "verify", "filter", "ppo_update")
"""The stages whose seconds are training time (`train/seconds`, the `max_seconds` budget)."""

P = ParamSpec("P")
T = TypeVar("T")
Stage = Callable[Concatenate["Run", P], Timed[T]]
"""A stage method of `Run` (`Run.verify`): the run and the stage's inputs in, its output out."""


class Driver(Protocol):
    """How the loop's stages and steps are run (see the module docstring)."""

    def stage(self, run: Run, method: Stage[P, T], *args: P.args) -> Timed[T]: ...

    def iteration(self, step: int, body: Callable[[], dict[str, float]]) -> dict[str, float]: ...

    def on_step(self, run: Run, metrics: dict[str, float]) -> None: ...


class Direct:
    """Runs every stage and step in place; `progress` prints one line per step (`step_line`)."""

    def __init__(self, progress: Callable[[str], None] | None = None) -> None:
        self.progress = progress

    def stage(self, run: Run, method: Stage[P, T], *args: P.args) -> Timed[T]:
        return method(run, *args)

    def iteration(self, step: int, body: Callable[[], dict[str, float]]) -> dict[str, float]:
        return body()

    def on_step(self, run: Run, metrics: dict[str, float]) -> None:
        if self.progress is not None and run.trainer.rank == 0:
            self.progress(step_line(run.config.name, run.step_count, metrics))


class Run:
    """A trainer, its run policy and state; `train()` is the loop (see the module docstring).
    `eval_problems` maps each evaluated split to its fixed instances; `probe_problems` are the
    held-out probes of the shrinkage diagnostics (`brorl.train.diagnostics`)."""

    def __init__(self, trainer: Trainer, config: RunConfig,
                 eval_problems: Mapping[str, Sequence[Problem]],
                 probe_problems: Sequence[Problem] = ()) -> None:
        self.trainer, self.config = trainer, config
        self.eval_problems = {split: list(problems) for split, problems in eval_problems.items()}
        self.run_dir = Path(config.run_dir)
        self.state = RunState()
        if trainer.resumed_state:  # with the seconds kept beside the run for that same step
            timings = read_timings(self.run_dir)
            same = timings.get("step") == trainer.step_count
            self.state = RunState.from_dict(trainer.resumed_state, timings if same else None)
        self.shrinkage: Shrinkage | None = None
        """Rank 0's diagnostics when `diagnostics.enabled` (the other ranks skip them)."""
        if config.diagnostics.enabled and trainer.rank == 0:
            c = trainer.config
            self.shrinkage = Shrinkage(
                build_probes(probe_problems, trainer.tokenizer), trainer.tokenizer,
                config.diagnostics, c.temperature, c.micro_batch_rollouts, c.correct_reward,
                start=self.state.probe_start, max_tokens=c.max_tokens_per_micro_batch)

    @classmethod
    def open(cls, params: ExperimentParams, root: Path | str = ".", *, resume: bool = True,
             reward_fn: RewardFn | None = None) -> Run:
        """The run of `params` (relative paths taken from `root`), resumed from its newest
        checkpoint unless `resume` is False. Each split of `train.eval_splits` is scored on the
        instances of the evaluation protocol (`brorl.evaluation.protocol.EvalProtocol.instances`); the
        shrinkage probes are `diagnostics.probes_per_family` validation problems drawn by
        `diagnostics.seed`."""
        from dataclasses import replace

        root = Path(root)
        config = TrainerConfig.from_params(params)
        config = replace(config, init_checkpoint=str(root / config.init_checkpoint),
                         checkpoint_dir=str(root / config.checkpoint_dir))
        run_config = RunConfig.from_params(params, root)
        data, t, d = root / params.data.path, params.train, params.diagnostics
        needed = {*t.eval_splits, "validation"} if d.enabled else set(t.eval_splits)
        splits = {split: load_split(data, split) for split in needed}  # each read once
        eval_problems = {split: run_config.eval_protocol.instances(splits[split])
                         for split in t.eval_splits}
        empty = [split for split, problems in eval_problems.items() if not problems]
        if empty:
            raise ValueError(f"{data}: the {empty} split holds no problems; drop it from "
                             "train.eval_splits or regenerate the data with that split.")
        probes = sample_per_family(splits["validation"], d.probes_per_family, d.seed) \
            if d.enabled else []
        trainer = Trainer(config, load_split(data, "train"), reward_fn=reward_fn, resume=resume)
        if trainer.rank == 0:  # what a resume compares its params with (brorl.runs.folder)
            record_params(config.checkpoint_dir, params.model_dump(mode="json"))
        return cls(trainer, run_config, eval_problems, probes)

    @property
    def step_count(self) -> int:
        return self.trainer.step_count

    # -- the stop rules and schedules ---------------------------------------------------------
    def budget_spent(self) -> bool:
        """True once not one more group of N fits in the rollout budget (False: no budget)."""
        c = self.config
        return c.max_rollouts is not None and \
            c.max_rollouts - self.state.rollouts < self.trainer.config.rollouts_per_prompt

    def rollouts_left(self) -> int | None:
        """Rollouts the next step may spend: what the budget still allows; None without a budget
        or past a spent one (the steps up to `min_steps`)."""
        c = self.config
        if c.max_rollouts is None or self.budget_spent():
            return None
        return c.max_rollouts - self.state.rollouts

    def _budget_reason(self) -> str | None:
        c, s = self.config, self.state
        if self.step_count >= c.steps:
            return "steps"
        if self.budget_spent() and self.step_count >= (c.min_steps or 0):
            return "rollouts"
        if c.max_seconds is not None and s.train_seconds >= c.max_seconds:
            return "seconds"
        return None

    def stop_reason(self) -> str | None:
        """Why the run stops now (`steps`, `rollouts`, `seconds`, `plateau`), or None to go on.
        Rank 0 decides (its clock and evaluations rule); every rank gets its answer."""
        reason = self._budget_reason()
        patience = self.config.plateau_patience
        if reason is None and patience is not None and self.state.evals_since_best >= patience:
            reason = "plateau"
        return self.trainer.broadcast(reason)

    def eval_due(self) -> bool:
        """Every `eval_every` steps, at `eval_steps`, at the step that spends a budget and at the
        last step: arms end on an evaluation at the same budget, whatever their step sizes."""
        c, step = self.config, self.step_count
        due = step % c.eval_every == 0 or step in c.eval_steps or \
            self._budget_reason() is not None or self.state.budget_step == step
        return self.trainer.broadcast(due)

    def checkpoint_due(self) -> bool:
        return self.step_count % self.config.checkpoint_every == 0

    # -- stage methods: inputs in, (output, seconds) out ------------------------------------
    def sample_prompts(self, collection: Collection) -> Timed[list[Problem]]:
        """The prompts of the next draw (as many as the collection still needs); with the
        adaptive allocation's first round waiting, its prompts repeated by their extra rollouts."""
        if collection.pending is not None:
            return timed(collection.second_round_problems)
        return timed(self.trainer.sample_prompts, collection.request())

    def generate_rollouts(self, problems: list[Problem],
                          collection: Collection) -> Timed[Generated]:
        """This rank's share of the draw (`Trainer.draw_share`): N rollouts per prompt (n0, or 1
        per listed prompt, with the adaptive allocation) from the current policy, seeded by
        (global step, engine call, place in the draw). Each chunk the engine hands over is
        verified on a background thread while the next one decodes (`ChunkVerifier`)."""
        started = time.perf_counter()
        lo, hi = self.trainer.draw_share(len(problems))
        share = Generated(problems[lo:hi], lo)
        if share.problems:
            n = collection.rollouts_per_prompt
            share.verifier = ChunkVerifier(self.trainer.reward_fn, share.problems, n)
            try:
                share.batch = self.trainer.generate_rollouts(
                    share.problems, collection.rounds, n, first_prompt=lo, on_chunk=share.verifier)
            except BaseException:
                share.verifier.close()
                raise
        return Timed(share, time.perf_counter() - started)

    def verify(self, problems: list[Problem], share: Generated,
               collection: Collection) -> Timed[ScoredGroups]:
        """The draw's rewards from the family verifiers: this rank's share waited for (its
        verification started during generation), then every rank's share gathered (with several
        ranks the seconds include waiting for the slowest); rank 0 saves the draw as Parquet if
        `save_rollouts`."""
        started = time.perf_counter()
        mine = None
        if share.batch is not None and share.verifier is not None:
            mine = self.trainer.verify(share.problems, share.batch, share.verifier.result())
        groups = self.trainer.gather_groups(mine)
        if self.config.save_rollouts and self.trainer.rank == 0:
            name = f"step_{self.step_count + 1:06d}_draw{collection.rounds}.parquet"
            save_groups(groups, self.run_dir / "rollouts" / name)
        return Timed(groups, time.perf_counter() - started)

    def filter(self, collection: Collection, groups: ScoredGroups,
               seconds: dict[str, float]) -> Timed[bool]:
        """Keep the draw's groups that pass the keep rule; True once the step has enough (or
        the draw budget or the rollouts left are spent). `seconds` are the draw's generate /
        verify times, for throughput."""
        started = time.perf_counter()
        collection.add(groups, seconds)
        return Timed(collection.done, time.perf_counter() - started)

    def ppo_update(self, collection: Collection) -> Timed[dict[str, float]]:
        """The PPO mini-batches on the kept groups (all ranks), then the step's end. With
        diagnostics, rank 0 scores its probes before and after the update (`diag/*`); their
        seconds (`time/diagnostics`) are not the stage's, so training time never counts them.
        Every rank holds the same kept groups; the step's figures are rank 0's."""
        started = time.perf_counter()
        collected: Collected = collection.finish()
        metrics = dict(self.trainer.broadcast(collected.metrics))
        if collected.groups is not None:  # else the draws found nothing informative: report it
            pending = None
            if self.shrinkage is not None:
                t = self.trainer
                pending = self.shrinkage.before(t.model, collected.drawn, partial(
                    self._decompose, collected.groups))
                self.state.probe_start = self.shrinkage.start_values()
            metrics.update(self.trainer.update(collected.groups))
            diag = {} if pending is None else self.shrinkage.after(self.trainer.model, pending)
            metrics.update(self.trainer.broadcast(diag))  # every rank logs rank 0's figures
        metrics = self.trainer.end_step(metrics)
        return Timed(metrics, time.perf_counter() - started - metrics.get("time/diagnostics", 0.0))

    def _decompose(self, groups: ScoredGroups, objective) -> dict[str, float]:
        """The first-order split of the probes' `objective` by the step's correct and
        incorrect rollouts (`brorl.train.diagnostics.first_order_split`), at the update's LR."""
        t = self.trainer
        parts = rollout_parts(t.model, t.reference, groups, t.config)
        return first_order_split(t.model, objective, parts, t.config.lr)

    def eval_protocol(self) -> dict[str, Any]:
        """What this run's evaluation rows depend on besides its training: the policy's weights
        now, the instances of each split, the sampling. Runs with equal protocols at step 0 score
        the same rows (a study's runs share one start evaluation, `train(start=)`)."""
        return {"policy": parameter_digest(self.trainer.model),
                "instances": {split: [p.id for p in problems]
                              for split, problems in self.eval_problems.items()},
                **self.config.eval_protocol.sampling()}

    def _score(self, split: str, problems: list[Problem]) -> dict[str, Any]:
        """One eval row of `split` under the evaluation protocol, sampled by the rollout engine."""
        return self.config.eval_protocol.score(
            self.trainer.rollout_engine, self.trainer.tokenizer, problems, split=split,
            step=self.step_count, seconds=self.state.train_seconds, rollouts=self.state.rollouts)

    def evaluate(self, rows: list[dict[str, Any]] | None = None) -> Timed[dict[str, float]]:
        """Score every evaluated split (rank 0 samples; all ranks record); evals.jsonl rewritten;
        the best `val/score_mean` and the evaluations since it updated. `rows`: this step's
        rows scored elsewhere under this run's `eval_protocol` (`train(start=)`), recorded as
        they are."""
        started = time.perf_counter()
        if self.trainer.rank == 0 and rows is None:
            rows = [self._score(split, problems) for split, problems in self.eval_problems.items()]
        rows = self.trainer.broadcast(rows)
        for row in rows:  # rows scored elsewhere are stored without their seconds (step 0's)
            row.setdefault("seconds", self.state.train_seconds)
        metrics: dict[str, float] = {}
        for row in rows:
            metrics.update(eval_metrics(row))
        s = self.state
        if SELECTION_METRIC in metrics:
            value = metrics[SELECTION_METRIC]
            if s.best_eval is None or value > s.best_eval:
                s.best_eval, s.best_step, s.evals_since_best = value, self.step_count, 0
            else:
                s.evals_since_best += 1
        fresh = {(r["step"], r["split"]) for r in rows}
        s.evals = [e for e in s.evals if (e["step"], row_split(e)) not in fresh] + rows
        if self.trainer.rank == 0:
            ckpt.atomic_write_text(self.run_dir / "evals.jsonl", evals_jsonl(s.evals))
        return Timed(metrics, time.perf_counter() - started)

    def checkpoint(self, force: bool = False) -> Timed[str | None]:
        """Save a checkpoint (with the run state) when due or `force`; its path, else None."""
        started = time.perf_counter()
        path = None
        if force or self.checkpoint_due():
            path = str(self.trainer.save_checkpoint(run_state=self.state.stable_dict()))
            self._write_timings()
        return Timed(path, time.perf_counter() - started)

    def _write_timings(self) -> None:
        """Rank 0: the state's seconds as of this step, beside the run's folder (what a resume
        from this step's checkpoint reads back)."""
        if self.trainer.rank == 0:
            write_timings(self.run_dir, {"step": self.step_count, **self.state.timings_dict()})

    # -- the loop ----------------------------------------------------------------------------
    def step(self, driver: Driver) -> dict[str, float]:
        """One RL step through `driver`: draws until the filter is satisfied (never past the
        rollouts left), the update, an evaluation when due, a checkpoint when due (each of the
        two a stage only on the steps it is due). Returns the step's metrics."""
        work: dict[str, float] = {}

        def stage(method: Stage[P, T], *args: P.args) -> Timed[T]:
            out = driver.stage(self, method, *args)
            work[method.__name__] = work.get(method.__name__, 0.0) + out.seconds
            return out

        collection = self.trainer.start_collection(self.rollouts_left())
        done = False
        while not done:  # every rank, in step: the same prompts, each rank its share of them
            problems = stage(Run.sample_prompts, collection).value
            share = stage(Run.generate_rollouts, problems, collection)
            groups = stage(Run.verify, problems, share.value, collection)
            verifier = share.value.verifier
            seconds = {"generate": share.seconds, "verify": groups.seconds,
                       "verify_work": verifier.work_seconds if verifier else 0.0}
            done = stage(Run.filter, collection, groups.value, seconds).value
        metrics = stage(Run.ppo_update, collection).value
        s = self.state
        s.rollouts += int(metrics["generate/rollouts"])
        if s.budget_step is None and self.budget_spent():
            s.budget_step = self.step_count
        train_seconds = self.trainer.broadcast(sum(work.get(k, 0.0) for k in TRAIN_STAGES))
        s.train_seconds += train_seconds
        metrics.update({"train/seconds": train_seconds, "train/seconds_total": s.train_seconds,
                        "generate/rollouts_total": float(s.rollouts)})
        if self.eval_due():
            metrics.update(stage(Run.evaluate).value)
            s.eval_seconds += work["evaluate"]
        s.history.append(metrics)  # before the checkpoint, so a resume keeps it
        if self.checkpoint_due():  # a stage (a task in the flow) only when one is taken
            stage(Run.checkpoint)
            s.checkpoint_seconds += work["checkpoint"]
        metrics.update({f"time/{name}": seconds for name, seconds in work.items()})
        return metrics

    def train(self, driver: Driver | None = None, max_steps: int | None = None,
              start: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Evaluate the start (a fresh run), then step until a stop rule fires (or `max_steps`
        more steps ran); save the last state; return the run's summary (`finish`).
        `start`: the start's evaluation already scored (`{"protocol": eval_protocol(), "rows":
        [...]}` of a run from the same policy), recorded instead of scored again; refused if
        its protocol is not this run's."""
        driver = driver or Direct()
        if self.trainer.rank == 0:  # a resumed run drops records of steps after its checkpoint
            ckpt.atomic_write_text(self.run_dir / "evals.jsonl", evals_jsonl(self.state.evals))
        if self.step_count == 0 and not self.state.evals:
            args: tuple[Any, ...] = ()
            if start is not None:
                if start["protocol"] != self.eval_protocol():
                    raise ValueError(f"{self.config.name}: the start evaluation given was scored "
                                     "under another policy, instances or sampling than this "
                                     "run's; score it again from this run's params.")
                args = ([dict(row) for row in start["rows"]],)
            first = driver.stage(self, Run.evaluate, *args)
            self.state.eval_seconds += first.seconds
            driver.on_step(self, {"train/step": 0.0, **first.value,
                                  "time/evaluate": first.seconds})
        stop_at = None if max_steps is None else self.step_count + max_steps
        while self.stop_reason() is None and (stop_at is None or self.step_count < stop_at):
            started = time.perf_counter()
            metrics = driver.iteration(self.step_count + 1, partial(self.step, driver))
            wall = time.perf_counter() - started
            work = sum(v for k, v in metrics.items() if k.startswith("time/"))
            timing = {"time/iteration": wall,
                      "time/orchestration_share": max(wall - work, 0.0) / wall if wall else 0.0}
            metrics.update(timing)
            self.state.history[-1].update(timing)
            driver.on_step(self, metrics)
            # what observing the step cost (MLflow logging in the flow), kept in the history only
            self.state.history[-1]["time/on_step"] = time.perf_counter() - started - wall
        return self.finish()

    def finish(self) -> dict[str, Any]:
        """Save the last state (if not saved yet) and the policy folder `<run_dir>/policy` with
        its `run.json`; write `<run_dir>/summary.json` (its seconds and the machine's record
        beside it, paths from the checkout); return the summary (with the seconds, and
        absolute paths)."""
        saved = ckpt.latest_checkpoint(self.trainer.config.checkpoint_dir)
        if saved is None or ckpt.read_state(saved)["step"] != self.step_count:
            saved = Path(self.checkpoint(force=True).value)
        t, s = self.trainer, self.state
        summary = {"name": self.config.name, "steps": self.step_count,
                   "step_offset": t.step_offset,
                   "prompts_per_step": t.config.prompts_per_step,
                   "rollouts_per_prompt": t.config.rollouts_per_prompt,
                   "stopped_by": self.stop_reason(), "rollouts": s.rollouts,
                   "budget_step": s.budget_step,
                   "train_seconds": s.train_seconds, "eval_seconds": s.eval_seconds,
                   "checkpoint_seconds": s.checkpoint_seconds,
                   "best_val_score": s.best_eval, "best_step": s.best_step,
                   "checkpoint": str(saved), "policy": str(self.run_dir / "policy"),
                   "history": s.history}
        if t.rank == 0:
            from brorl.policy import save_policy

            save_policy(t.model, t.tokenizer, self.run_dir / "policy")
            data = checkout_relative(self.config.data_path, self.config.root)
            record = run_record(t.config.seed, t.global_step, t.sampler.state, data,
                                len(t.sampler.problems))
            ckpt.atomic_write_text(self.run_dir / "policy" / RUN_RECORD,
                                   json.dumps(record, indent=1) + "\n")
            write_summary(self.run_dir, summary, s.stable_dict()["history"], self.config.root)
            self._write_timings()
        return summary
