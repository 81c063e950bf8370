"""One training run for tests/test_kill_resume.py: run to the end, or SIGKILL itself at a point.

    python tests/kill_resume_run.py PARAMS POINT STEP

The run is what the `train` flow runs, without Prefect: the run opened and its MLflow run started
or reopened by the flow's own task functions (`tasks.train`), its steps logged to MLflow as the
flow's driver logs them, and finished by `finish_run`. POINT names the moment of step STEP at
which the process sends itself SIGKILL (wrapping the library function that runs then):

- `none`: no kill;
- `before_first_checkpoint`: after step STEP's update, before any checkpoint exists;
- `generate`: during generation, as the second chunk of rollouts starts decoding;
- `verify`: during verification, once the rewards are computed, before the stage returns;
- `update`: during the PPO update, after its first optimizer step (of step STEP or, when that
  step's draws kept no group and so had no update, of the first later step that has one);
- `checkpoint_state`: during the checkpoint write, before its trainer state (the file that
  makes it complete) is written;
- `checkpoint_pointer`: during the checkpoint write, after the folder is renamed into place,
  before the `latest` pointer is replaced;
- `evaluate`: during the evaluation, once the split is scored, before its row is recorded.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brorl.evaluation.protocol import EvalProtocol  # noqa: E402
from brorl.params import load_params  # noqa: E402
from brorl.train import checkpoint as ckpt  # noqa: E402
from brorl.train.run import Direct  # noqa: E402
from tasks import train as t  # noqa: E402


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Tracked(Direct):
    """The flow's driver without Prefect: stages in place, each step's metrics to MLflow."""

    def __init__(self, tracker: t.Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def on_step(self, run, metrics) -> None:
        t.log_step(self.tracker, run.step_count, metrics, run.config.name)


def install(point: str, run, step: int) -> None:
    """Wrap the function that runs at `point` so that it kills this process during step `step`."""
    def at_step() -> bool:  # the step being run (step_count counts finished steps)
        return run.step_count + 1 == step

    if point == "before_first_checkpoint":
        real_update = type(run).ppo_update  # the loop runs the class's stage method

        def update(self, *args):
            out = real_update(self, *args)
            if self.step_count == step:
                die()
            return out
        type(run).ppo_update = update
    elif point == "generate":  # the engine's chunks of rollouts, not of an evaluation
        engine, calls, rolling = run.trainer.rollout_engine, [], []
        real_chunk, real_generate = engine._decode_chunk, run.trainer.generate_rollouts

        def generate(*args, **kwargs):
            rolling.append(1)
            try:
                return real_generate(*args, **kwargs)
            finally:
                rolling.pop()

        def chunk(*args, **kwargs):
            if at_step() and rolling:
                calls.append(1)
                if len(calls) == 2:
                    die()
            return real_chunk(*args, **kwargs)
        engine._decode_chunk = chunk
        run.trainer.generate_rollouts = generate
    elif point == "verify":
        real_reward = run.trainer.reward_fn

        def reward(*args, **kwargs):
            out = real_reward(*args, **kwargs)
            if at_step():
                die()
            return out
        run.trainer.reward_fn = reward
    elif point == "update":  # from step `step` on: a step whose draws kept nothing has no update
        real_step = run.trainer.engine.step

        def optimizer_step(*args, **kwargs):
            real_step(*args, **kwargs)
            if run.step_count + 1 >= step:
                die()
        run.trainer.engine.step = optimizer_step
    elif point == "checkpoint_state":
        real_state = ckpt.write_state

        def write_state(folder, state):
            if state["step"] == step:
                die()
            return real_state(folder, state)
        ckpt.write_state = write_state
    elif point == "checkpoint_pointer":
        real_write = ckpt.atomic_write_text

        def atomic_write_text(path, text):
            if Path(path).name == ckpt.LATEST_FILE and text.strip() == ckpt.step_name(step):
                die()
            return real_write(path, text)
        ckpt.atomic_write_text = atomic_write_text
    elif point == "evaluate":
        real_score = EvalProtocol.score

        def score(*args, **kwargs):
            out = real_score(*args, **kwargs)
            if kwargs.get("step") == step:
                die()
            return out
        EvalProtocol.score = score
    elif point != "none":
        raise SystemExit(f"unknown kill point {point!r}")


def main(params_path: str, point: str, step: int) -> None:
    params = load_params(params_path)
    run = t.open_run.fn(params)
    tracker = t.start_tracking.fn(run, params)
    install(point, run, step)
    run.train(Tracked(tracker))
    t.finish_run.fn(run, tracker, params)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
