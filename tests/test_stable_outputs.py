"""Stable DVC hashes: a rerun that reproduces the same weights writes the same output bytes.

The model, base and train stages at a few-problem size run twice, each time in a checkout folder
of its own and from relative paths, as DVC runs them; every file of every DVC output hashes the
same (md5, DVC's hash) in both, though the two folders differ and the clock does too. Nothing
in an output holds a wall-clock key or an absolute path: those figures lie beside each output
in `<out>.timings.json` (`brorl.runs.timings`). Under DVC itself, forcing the model and base stages
to rerun leaves the stage that depends on them up to date.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from brorl.params import (
    BaseParams,
    DataParams,
    ExperimentParams,
    ModelParams,
    TrackingParams,
    load_params,
)
from brorl.runs.machine import machine_path
from brorl.runs.timings import is_timing, timings_path
from brorl.verifiers import Verdict

ROOT = Path(__file__).resolve().parents[1]
DVC = str(Path(sys.executable).parent / "dvc")
OUTS = ("outputs/data", "outputs/model", "outputs/base")
"""The DVC outputs of the data, model and base stages (as in dvc.yaml, params/pipeline.yaml)."""
RUN = "outputs/prorl"
"""The train stage's output: the run's folder."""


def stage_params() -> ExperimentParams:
    """A few problems, the tiny policy and two warm-up steps; every path relative to the
    checkout, as params/tiny.yaml's."""
    return ExperimentParams(
        data=DataParams(path="outputs/data/problems", seed=0, validation_fraction=0.2,
                        test_fraction=0.2, families={"math": {"per_task": 4}, "code": {"per_task": 5},
                                                         "reasoning": {"per_task": 4}}),
        model=ModelParams(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                          intermediate_size=128, max_position_embeddings=256, seed=0,
                          path="outputs/model/checkpoint"),
        base=BaseParams(path="outputs/base/checkpoint", target_pass_high=0.6, max_steps=2,
                        eval_every=2, batch_size=4, lr=1e-3, seed=0, target_pass_low=0.2,
                        eval_per_family=2, test_samples=1, eval_temperature=0.6, eval_top_p=0.95,
                        max_response_tokens=4, band_margin=0.0, warmup_steps=20,
                        min_lr_ratio=1.0, micro_batches=1, reached_share=1.0),
        tracking=TrackingParams(metrics_dir="metrics"))


def make_checkout(folder: Path) -> Path:
    """An empty checkout (what `brorl.system.checkout` looks for) with the repository's .dvcignore."""
    (folder / "params").mkdir(parents=True)
    (folder / "dvc.yaml").write_text("stages: {}\n")
    shutil.copyfile(ROOT / ".dvcignore", folder / ".dvcignore")
    return folder


def md5s(folder: Path) -> dict[str, str]:
    """Relative path -> md5 of every file under `folder`: what DVC hashes a folder output by."""
    return {p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _reward(problems, responses) -> list[Verdict]:
    """A deterministic binary reward from the response's characters: mixed groups, so the
    filter keeps some and the policy updates."""
    return [Verdict(float(sum(map(ord, r)) % 3 == 0), "parity") for r in responses]


def rl_params() -> ExperimentParams:
    """Two ProRL steps of 2 prompts x 8 rollouts from the base stage's checkpoint."""
    return load_params(ROOT / "params" / "prorl_ci.yaml", [
        "data.path=outputs/data/problems", "train.init_checkpoint=outputs/base/checkpoint",
        f"train.run_dir={RUN}", f"train.checkpoint_dir={RUN}/checkpoints",
        "update.prompts_per_step=2", "update.rollouts_per_prompt=8", "train.steps=2",
        "train.max_rollouts=null", "generate.max_response_tokens=8", "verify.workers=1",
        "train.eval_per_family=1", "train.checkpoint_every=1", "tracking.metrics_dir=metrics",
        "tracking.plots_dir=plots"])


def run_stages(checkout: Path) -> None:
    """The data, model and base tasks (`.fn`), then a two-step ProRL run, from `checkout`."""
    from brorl.train import Direct, Run
    from tasks.base import train_base
    from tasks.data import build_data
    from tasks.model import make_model

    here = Path.cwd()
    os.chdir(checkout)
    try:
        params = stage_params()
        build_data.fn(params)
        make_model.fn(params)
        train_base.fn(params)
        Run.open(rl_params(), checkout, reward_fn=_reward).train(Direct())
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def two_checkouts(tmp_path_factory) -> tuple[Path, Path]:
    """The same stages run in two checkout folders, one after the other."""
    folders = tuple(make_checkout(tmp_path_factory.mktemp(name)) for name in ("one", "two"))
    for folder in folders:
        # as in a fresh process: torch, numpy and python seed their global RNGs from the OS
        torch.seed()
        np.random.seed()
        random.seed()
        run_stages(folder)
    return folders


def test_a_rerun_writes_every_stage_output_byte_for_byte_again(two_checkouts):
    one, two = two_checkouts
    for out in (*OUTS, RUN):
        first, second = md5s(one / out), md5s(two / out)
        assert first, out
        assert first == second, (out, sorted(k for k in first if first[k] != second.get(k)))
    summary = json.loads((one / RUN / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["policy"] == f"{RUN}/policy"
    machine = json.loads(machine_path(one / RUN).read_text())  # beside: in no output's hash
    assert machine["intra_op_threads"] == 1 and machine_path(two / RUN).read_text() == \
        machine_path(one / RUN).read_text()
    # the run updated the policy (else the weights would trivially agree)
    assert any(m["update/skipped"] == 0.0 for m in summary["history"])


def test_the_clock_is_beside_each_output_in_its_timings_file(two_checkouts):
    one, _ = two_checkouts
    assert json.loads(timings_path(one / "outputs/model").read_text())["model/seconds"] >= 0
    base = json.loads(timings_path(one / "outputs/base").read_text())
    assert base["base/train_seconds"] >= 0 and [h["step"] for h in base["history"]] == [0, 2]
    run = json.loads(timings_path(one / RUN).read_text())
    assert run["step"] == 2 and run["train_seconds"] > 0 and len(run["history"]) == 2
    assert all(m["train/seconds"] > 0 and "time/iteration" in m for m in run["history"])
    assert [(r["step"], r["split"]) for r in run["evals"]] == [(0, "test"), (1, "test"),
                                                                (2, "test")]
    # the readers put the seconds back (`brorl.evaluation.protocol.read_run`)
    from brorl.evaluation.protocol import read_run

    summary, rows = read_run(one / RUN, "")
    assert summary["train_seconds"] == run["train_seconds"]
    assert [r["seconds"] for r in rows] == [r["seconds"] for r in run["evals"]]
    assert summary["history"][0]["generate/seconds"] == run["history"][0]["generate/seconds"]


def wall_clock_or_absolute(value, roots: tuple[str, ...], where: str = "") -> list[str]:
    """Where a JSON value holds a wall-clock key (`brorl.runs.timings.is_timing`) or a string naming
    an absolute path or one of `roots`."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            if is_timing(key):
                found.append(f"{where}.{key}")
            found += wall_clock_or_absolute(item, roots, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += wall_clock_or_absolute(item, roots, f"{where}[{i}]")
    elif isinstance(value, str) and (value.startswith("/") or any(r in value for r in roots)):
        found.append(f"{where} = {value}")
    return found


def test_no_output_holds_a_wall_clock_key_or_an_absolute_path(two_checkouts):
    roots = tuple(str(folder) for folder in two_checkouts)
    one = two_checkouts[0]
    found = []
    for out in (*OUTS, RUN):
        for path in sorted((one / out).rglob("*")):
            if path.suffix not in (".json", ".jsonl") or path.name == "params.json":
                continue  # params records hold settings (`train.max_seconds`), not measurements
            lines = path.read_text().splitlines() if path.suffix == ".jsonl" else \
                [path.read_text()]
            for line in lines:
                found += [f"{path.relative_to(one)}{x}"
                          for x in wall_clock_or_absolute(json.loads(line), roots)]
    assert found == []


def test_the_comparison_report_leaves_the_arms_seconds_to_its_timings_file(two_checkouts,
                                                                          tmp_path):
    """The run compared with itself: its seconds and throughput reach the report's return (and
    MLflow through it) and `<out_dir>.timings.json`, not report.json, report.md or the plots."""
    from brorl.evaluation.compare import ArmResult, build_report, report_metrics

    one = two_checkouts[0]
    arms = [ArmResult.load(name, one / RUN) for name in ("prorl", "brorl")]
    report = build_report(arms, tmp_path / "compare", "prorl")
    saved = json.loads(timings_path(one / RUN).read_text())
    timings = json.loads(timings_path(tmp_path / "compare").read_text())
    assert report["arms"]["prorl"]["train_seconds"] == saved["train_seconds"]
    assert timings["arms"]["brorl"]["train_seconds"] == saved["train_seconds"]
    assert timings["rollouts_per_s"]["prorl"] == report["rollouts_per_s"]["prorl"] > 0
    assert report_metrics(report)["compare/train_seconds_brorl"] == saved["train_seconds"]
    written = json.loads((tmp_path / "compare" / "report.json").read_text())
    assert wall_clock_or_absolute(written, (str(tmp_path), str(one))) == []
    text = (tmp_path / "compare" / "report.md").read_text()
    assert "rollouts/s" not in text and "training time (s)" not in text


def test_a_resume_reads_the_seconds_of_its_checkpoint_back(two_checkouts):
    """The run's last checkpoint (step 2) holds no seconds; a resume from it takes them from the
    timings file written at that step, so the `train.max_seconds` budget goes on counting."""
    from brorl.train import Run

    one = two_checkouts[0]
    saved = json.loads(timings_path(one / RUN).read_text())
    here = Path.cwd()
    os.chdir(one)
    try:
        run = Run.open(rl_params(), one, reward_fn=_reward)
    finally:
        os.chdir(here)
    assert run.step_count == saved["step"] == 2
    assert run.state.train_seconds == saved["train_seconds"] > 0
    assert [m["train/seconds"] for m in run.state.history] == \
        [m["train/seconds"] for m in saved["history"]]
    assert [r["seconds"] for r in run.state.evals] == [r["seconds"] for r in saved["evals"]]


STAGE_SCRIPT = """\
import sys
from tests.test_stable_outputs import stage_params
from tasks.base import train_base
from tasks.data import build_data
from tasks.model import make_model

{"data": build_data, "model": make_model, "base": train_base}[sys.argv[1]].fn(stage_params())
"""

PIPELINE = """\
stages:
  data:
    cmd: {python} stage.py data
    outs: [outputs/data]
  model:
    cmd: {python} stage.py model
    outs: [outputs/model]
  base:
    cmd: {python} stage.py base
    deps: [outputs/data, outputs/model]
    outs: [outputs/base]
  downstream:
    cmd: {python} -c "import shutil; shutil.copy('outputs/base/report.json', 'downstream.json')"
    deps: [outputs/base]
    outs: [downstream.json]
"""


@pytest.mark.slow  # five stage processes under DVC: about a minute on 2 cores
def test_forcing_the_model_and_base_stages_to_rerun_leaves_downstream_up_to_date(tmp_path):
    checkout = make_checkout(tmp_path / "checkout")
    (checkout / "stage.py").write_text(STAGE_SCRIPT)
    (checkout / "dvc.yaml").write_text(PIPELINE.format(python=sys.executable))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "DVC_NO_ANALYTICS": "1"}

    def dvc(*args: str) -> str:
        done = subprocess.run([DVC, *args], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
        return done.stdout

    dvc("init", "--no-scm", "-q")
    dvc("repro")
    for stage in ("model", "base"):  # each runs again (its timings change), nothing else
        assert f"Running stage '{stage}'" in dvc("repro", "--force", "--single-item", stage)
    status = dvc("status")
    assert "up to date" in status, status


def test_a_checkpoints_rng_file_does_not_depend_on_pythons_global_rng(tmp_path):
    """In a Prefect flow the orchestration libraries draw from python's global RNG as often as
    the clock makes them: its state stays out of `rng_rank<r>.pt` (brorl never draws from it)."""
    from brorl.train.checkpoint import load_rng, save_rng, seed_rngs

    for name, draws in (("one", 0), ("two", 7)):
        seed_rngs(3, 0)
        for _ in range(draws):
            random.random()
        (tmp_path / name).mkdir()
        save_rng(tmp_path / name, 0)
    assert (tmp_path / "one" / "rng_rank0.pt").read_bytes() == \
        (tmp_path / "two" / "rng_rank0.pt").read_bytes()
    seed_rngs(3, 0)
    expected = torch.get_rng_state()
    torch.seed()
    load_rng(tmp_path / "one", 0)  # restores torch's and numpy's
    assert torch.equal(torch.get_rng_state(), expected)
