"""Shared fixtures: offline project-local environment, a temporary MLflow store, a Prefect harness,
an easy RL setup (a tiny policy that sometimes solves one generated task, and its data)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from brorl.system.environment import apply_defaults
from flows import prefect_home

ROOT = Path(__file__).resolve().parents[1]
apply_defaults()  # offline, project-local environment, as every entry point runs
prefect_home()
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI job's timeout) ends the session as Ctrl-C does: `pytest_sessionfinish` then
    stops the background pipelines instead of leaving them running."""
    signal.signal(signal.SIGTERM, _interrupt)


@pytest.hookimpl(trylast=True)  # after `-m`/`-k` deselection: `items` is what will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the `gpu` tests (the `cuda` cases of tests/devices.py) where torch sees no CUDA, and
    put the modules that use a background pipeline (`BACKGROUND`) last, each kept whole and in
    order, so that the pipelines run beside the other tests."""
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="gpu: no CUDA device here (run `pytest -m gpu` on a GPU)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    late = {item.path for item in items if BACKGROUND.keys() & set(item.fixturenames)}
    items.sort(key=lambda item: item.path in late)  # stable: the order within each part stays


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start each background pipeline a collected test needs (none for `--collect-only`)."""
    if session.config.option.collectonly:
        return
    needed = set().union(*(item.fixturenames for item in session.items)) & BACKGROUND.keys()
    for name in sorted(needed):
        start_background(name, session.config._tmp_path_factory.mktemp(name))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the background pipelines still running (a session cut short)."""
    for job, _ in RUNNING.values():
        stop_background(job)


@pytest.fixture()
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite MLflow store under the test's temporary folder, set as the tracking URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server for all flow tests of the session (startup takes ~10 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def clone_repository(dest: Path) -> Path:
    """`git clone` of this checkout plus its uncommitted (tracked or new, not ignored) files."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True, timeout=120)
    changed = subprocess.run(["git", "ls-files", "-m", "-o", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    for name in changed:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def ci_pipeline_command(clone: Path) -> list[str]:
    """The CI pipeline: `dvc repro compare` with `params/pipeline_ci.yaml` copied over
    `params/pipeline.yaml` (the switch dvc.yaml reads), as `make run` runs it."""
    shutil.copy(clone / "params" / "pipeline_ci.yaml", clone / "params" / "pipeline.yaml")
    return [str(Path(sys.executable).parent / "dvc"), "repro", "compare"]


def real_pipeline_command(clone: Path) -> list[str]:
    """SmolLM2 through the data, model and compare flows at CI size (tests/real_pipeline.py)."""
    return [sys.executable, str(ROOT / "tests" / "real_pipeline.py"), str(clone / "real.json")]


BACKGROUND = {"ci_pipeline": ci_pipeline_command, "smollm2_pipeline": real_pipeline_command}
"""The pipelines that session fixtures of the same name wait for: each starts when collection
ends, in its own clone, under a Prefect server of its own (`python -m commands.server
--pipeline`, as `make run`), its MLflow store `<clone>/mlflow.db`, one thread."""
RUNNING: dict[str, tuple[subprocess.Popen, Path]] = {}
"""Name -> the started pipeline and its clone."""


def start_background(name: str, folder: Path) -> None:
    """Clone the checkout into `folder`/repo and start pipeline `name` there, its output in
    `folder`/log.txt."""
    clone = clone_repository(folder / "repo")
    venv_bin = Path(sys.executable).parent
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env |= {"PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
            "BRORL_PYTHON": sys.executable,  # scripts/python: the clone has no .venv of its own
            "PYTHONPATH": str(clone), "OMP_NUM_THREADS": "1",
            "PREFECT_HOME": str(clone / ".cache" / "prefect"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{clone / 'mlflow.db'}",
            "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions")}
    server = [sys.executable, "-m", "commands.server", "--pipeline", "--"]
    command = [*server, *BACKGROUND[name](clone)]
    (folder / "git_status_before.txt").write_text(git_status(clone))
    with open(folder / "log.txt", "wb") as log:
        job = subprocess.Popen(command, cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    RUNNING[name] = (job, clone)


def git_status(clone: Path) -> str:
    """`git status --porcelain` of `clone`, every untracked file listed."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone,
                          capture_output=True, text=True, check=True, timeout=120).stdout


def stop_background(job: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM to `commands.server`, which ends its command and stops the Prefect server and
    PostgreSQL it started (their own process groups); SIGKILL to its group after `grace_s`."""
    if job.poll() is not None:
        return
    job.terminate()
    try:
        job.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def finish_background(name: str, timeout_s: float = 1500) -> Path:
    """The clone of background pipeline `name` once it has ended; the test fails with the end of
    its log when it did not succeed."""
    job, clone = RUNNING[name]
    try:
        job.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_background(job)
    log = (clone.parent / "log.txt").read_text(errors="replace")
    assert job.returncode == 0, f"the {name} pipeline ended with {job.returncode}:\n{log[-4000:]}"
    return clone


@pytest.fixture(scope="session")
def ci_pipeline() -> Path:
    """A clone after `dvc repro compare` with CI params (a few minutes on 2 cores), run in the
    background from the start of the session (`BACKGROUND`). Its `git status` right after the
    pipeline, before any test writes there, is `<clone>/../git_status_after.txt`."""
    clone = finish_background("ci_pipeline")
    (clone.parent / "git_status_after.txt").write_text(git_status(clone))
    return clone


@pytest.fixture(scope="session")
def smollm2_pipeline() -> Path:
    """A clone after SmolLM2's data, model and compare flows at CI size (tests/real_pipeline.py;
    the model flow's card in `<clone>/real.json`), run in the background from the start of the
    session (`BACKGROUND`)."""
    return finish_background("smollm2_pipeline")


CI_ARMS = ("prorl_warmup", "prorl", "brorl")
"""The CI pipeline's RL stages (outputs/ci/<arm>), each of which must update its weights."""


def _arms_not_updated(clone: Path) -> dict[str, str]:
    """Arm -> why none of its steps updated its policy, for each CI arm of `clone` that did not
    (empty when all did): the prompts it drew and how many of each group's rollouts were right."""
    import pyarrow.parquet as pq

    why = {}
    for arm in CI_ARMS:
        folder = clone / "outputs" / "ci" / arm
        history = json.loads((folder / "summary.json").read_text())["history"]
        if any(step["update/skipped"] == 0.0 for step in history):
            continue
        drawn: dict[str, list[float]] = {}
        for table in sorted((folder / "rollouts").glob("*.parquet")):
            for row in pq.read_table(table, columns=["problem_id", "reward"]).to_pylist():
                drawn.setdefault(row["problem_id"], []).append(row["reward"])
        groups = ", ".join(f"{p} {sum(r >= 1.0 for r in rewards)}/{len(rewards)} right"
                           for p, rewards in drawn.items())
        why[arm] = (f"{arm}: none of its {len(history)} steps kept an informative group (drawn: "
                    f"{groups}), so its weights never moved; the CI seeds and sizes "
                    "(params/prorl_warmup_ci.yaml) must give every arm prompts the CI base "
                    "sometimes solves")
    return why


@pytest.fixture(scope="session")
def ci_arms_not_updated(ci_pipeline) -> dict[str, str]:
    """Arm -> why it never updated, for each CI arm of the CI pipeline that did not (empty when
    every arm updated its weights)."""
    return _arms_not_updated(ci_pipeline)


@pytest.fixture(scope="session")
def ci_arms_updated(ci_pipeline, ci_arms_not_updated) -> Path:
    """The CI pipeline's clone, once every CI arm is known to have updated its weights: a test
    of trained arms (weights moved, `diag/*` logged, their charts drawn) fails here, saying which
    arm did not and why; it never skips or checks less."""
    why = ci_arms_not_updated
    if why:
        pytest.fail("; ".join(why.values()), pytrace=False)
    return ci_pipeline


@dataclass(frozen=True)
class EasySplit:
    """Three disjoint sets of the `compare` task (the larger of two numbers): the base's
    supervised warm-up, the RL prompts, held-out evaluation (RL on prompts the warm-up memorised
    raised the training reward but not the held-out one)."""

    warm_up: list
    train: list
    held_out: list


@pytest.fixture(scope="session")
def easy_split() -> EasySplit:
    from brorl.families.math import generate_math

    problems = generate_math(200, seed=0, tasks=("compare",))
    return EasySplit(problems[:100], problems[100:150], problems[150:])


@pytest.fixture(scope="session")
def warm_up_config():
    """`make(**knobs)`: a `BaseConfig` for `brorl.base.warm_up` in tests: greedy validation checks
    (64 tokens), a constant LR after 20 warm-up steps, one micro-batch, equal family shares, the
    band [target_pass_low, 1] with no margin; `knobs` on top (the schema's defaults elsewhere)."""
    from dataclasses import replace

    from brorl.base import BaseConfig
    from brorl.params import ExperimentParams

    plain = dict(warmup_steps=20, min_lr_ratio=1.0, micro_batches=1, family_shares=None,
                 reached_share=1.0, target_pass_high=1.0, band_margin=0.0, eval_temperature=0.0,
                 eval_top_p=1.0, max_response_tokens=64)

    def make(**knobs) -> BaseConfig:
        return replace(BaseConfig.from_params(ExperimentParams()), **{**plain, **knobs})

    return make


@pytest.fixture(scope="session")
def easy_base(tmp_path_factory, easy_split, warm_up_config) -> Path:
    """An HF folder: the tiny policy warmed up on `compare` until 8 held-out problems reach
    greedy pass@1 0.25 (checked every 100 steps, at most 2000; about 10-30 s): a policy that
    solves some problems, so RL has rewards to work with. A fixed step count is fragile: the
    step at which this skill appears moves by hundreds of steps with rounding-level changes (on
    one Intel Xeon it first reached 0.25 at step 900, past the former cap of 800)."""
    from brorl.base import warm_up
    from brorl.policy import build_policy, build_tokenizer, save_policy

    tokenizer = build_tokenizer()
    model = build_policy(vocab_size=len(tokenizer), hidden_size=64, num_layers=2, num_heads=2,
                         num_kv_heads=1, intermediate_size=128, max_position_embeddings=256)
    config = warm_up_config(max_steps=2000, eval_every=100, batch_size=16, lr=3e-3, seed=0,
                            target_pass_low=0.25, max_response_tokens=24)
    history = warm_up(model, tokenizer, easy_split.warm_up, easy_split.held_out[:8], config)
    assert max(h["pass_at_1"]["math"] for h in history) >= 0.25, history
    path = tmp_path_factory.mktemp("easy") / "base"
    save_policy(model, tokenizer, path)
    return path


@pytest.fixture(scope="session")
def easy_data(tmp_path_factory, easy_split) -> Path:
    """The easy split saved as a data folder: train, validation (10 held-out), test (held-out)."""
    from brorl.data import save_splits

    path = tmp_path_factory.mktemp("data") / "problems"
    save_splits({"train": easy_split.train, "validation": easy_split.held_out[:10],
                 "test": easy_split.held_out}, path)
    return path
