"""The README's command blocks, run as a user would type them (CI-sized where the README says so).

Every fenced `bash`, `python` and `yaml` block of README.md is preceded by a marker the reader
does not see, `<!-- test: HOW -->`:

- `run`: each command (or the Python program) runs as typed;
- `ci: OLD -> NEW; ...`: the same after these replacements (CI-sized params, fewer steps);
- `params`: a params example: it must load (`brorl.params.load_params`);
- `file: PATH; OLD -> NEW; ...`: a params file the blocks after it use: it must load as typed, and
  it is written at PATH in the clone after these replacements (CI-sized) before the commands run;
- `skip: WHY`: not run here, and the marker says why (what covers it instead).

They run in the CI pipeline's clone (`ci_pipeline` in conftest.py: CI data, warm-up and arms
already there), with its MLflow store and the session's Prefect server, so a README command that
breaks fails this test. Every README example that trains writes its own folder.

An exit code of 0 is not enough: after each command, `PROMISES` checks what the README says it
gives (the run folder and its summary, the MLflow run in the store the clone's commands use, the
files and output of the others), and a command the README gains fails until it has a check.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?:<!-- test: (?P<how>.*?) -->\n)?```(?P<lang>bash|python|yaml)\n"
                   r"(?P<body>.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    """A fenced block of the README and its marker (None when it has none)."""

    lang: str
    body: str
    how: str | None
    line: int

    def replacements(self) -> list[tuple[str, str]]:
        """The `OLD -> NEW` pairs of a `ci:` or `file:` marker."""
        if not self.how or self.kind not in ("ci", "file"):
            return []
        pairs = self.how.split(":", 1)[1].split(";")[1 if self.kind == "file" else 0:]
        return [tuple(part.strip() for part in pair.removeprefix(" ci:").split("->"))
                for pair in pairs]

    @property
    def kind(self) -> str | None:
        return self.how.split(":")[0].strip() if self.how else None

    def replaced(self) -> str:
        """The block's text after its replacements, each of which must find its text."""
        body = self.body
        for old, new in self.replacements():
            assert old in body, f"README line {self.line}: `{old}` is not in its block"
            body = body.replace(old, new)
        return body

    def commands(self) -> list[str]:
        """The block's commands after its `ci:` replacements: one per non-comment line of a
        bash block (trailing `# ...` comments dropped), the whole program of a Python one."""
        body = self.replaced()
        if self.lang == "python":
            return [body]
        return [re.sub(r"\s+#\s.*$", "", line).strip() for line in body.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]


def readme_blocks(text: str) -> list[Block]:
    return [Block(m["lang"], m["body"], m["how"], text[:m.start()].count("\n") + 1)
            for m in BLOCK.finditer(text)]


BLOCKS = readme_blocks((ROOT / "README.md").read_text())


def test_every_block_says_how_it_is_tested():
    unmarked = [b.line for b in BLOCKS if b.how is None]
    assert BLOCKS and unmarked == [], f"README blocks without a `<!-- test: ... -->` marker at lines {unmarked}"
    for b in BLOCKS:
        kind = b.kind
        assert kind in {"run", "ci", "params", "file", "skip"}, (b.line, b.how)
        if kind == "file":
            assert b.lang == "yaml" and b.how.split(":", 1)[1].split(";")[0].strip().startswith(
                "params/"), (b.line, b.how)
            b.replaced()  # each replacement finds its text
        if kind == "skip":
            assert len(b.how.removeprefix("skip:").strip()) > 20, f"line {b.line}: say why"


def test_every_example_that_trains_writes_its_own_folder():
    text = (ROOT / "README.md").read_text()
    folders = re.findall(r"train\.run_dir=(\S+?)[\"'\s,\]]", text)
    folders += re.findall(r"run_dir: (\S+?)[,}\s]", text)
    assert folders and len(folders) == len(set(folders)), folders


def test_the_params_examples_load(tmp_path):
    from brorl.params import load_params

    examples = [b for b in BLOCKS if b.kind in ("params", "file")]
    assert examples
    for b in examples:
        path = ROOT / "params" / f".readme_example_{b.line}.yaml"
        try:
            for text in {b.body, b.replaced()}:  # as typed, and at CI size
                path.write_text(text)
                load_params(path)
        finally:
            path.unlink(missing_ok=True)


FILES = {b.how.split(":", 1)[1].split(";")[0].strip(): b for b in BLOCKS if b.kind == "file"}
"""The params files the README's commands use, by path."""


@dataclass(frozen=True)
class Ran:
    """A README command that ended with exit code 0 in the clone, and the MLflow store it used."""

    clone: Path
    command: str
    done: subprocess.CompletedProcess
    store: str
    program: bool
    """Whether `command` is a Python program (else a bash command line)."""

    def params(self):
        """The params it ran with: `--params FILE` and its `-S` overrides of a command line, the
        `load_params(FILE, [...])` call of a program."""
        from brorl.params import load_params

        if self.program:
            [call] = [node for node in ast.walk(ast.parse(self.command)) if
                      isinstance(node, ast.Call) and getattr(node.func, "id", "") == "load_params"]
            file, overrides = (ast.literal_eval(arg) for arg in call.args)
        else:
            words = shlex.split(self.command)
            file = words[words.index("--params") + 1]
            overrides = [words[i + 1] for i, w in enumerate(words) if w in ("-S", "--set")]
        return load_params(self.clone / file, overrides)

    def path(self, name: str) -> Path:
        """A path it printed or recorded: absolute, or relative to the clone."""
        return (self.clone / name).resolve()

    def printed_json(self) -> dict:
        """The last JSON object on its standard output (a summary, one or several lines)."""
        lines = self.done.stdout.splitlines()
        for i in reversed(range(len(lines))):
            if lines[i].startswith("{"):
                try:
                    return json.loads("\n".join(lines[i:]))
                except json.JSONDecodeError:
                    continue
        pytest.fail(f"`{self.command}` printed no JSON summary:\n{self.done.stdout[-2000:]}")

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.store, registry_uri=self.store)


def _trained(ran: Ran, params=None) -> dict:
    """What every training example promises (README, "Command line and Python API"): its own
    folder with the summary, stopped on the rollout budget and never past it, the start and the
    last step evaluated, the last step checkpointed, the final policy. Returns the summary.
    `params`: the run's (default: the command's)."""
    from brorl.runs.folder import read_state

    params = params or ran.params()
    run_dir = ran.path(params.train.run_dir)
    assert (run_dir / "summary.json").is_file(), f"`{ran.command}` left no {run_dir}/summary.json"
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["name"] == params.name
    assert (summary["prompts_per_step"], summary["rollouts_per_prompt"]) == (
        params.update.prompts_per_step, params.update.rollouts_per_prompt)
    assert summary["stopped_by"] == "rollouts", summary["stopped_by"]
    assert 0 < summary["rollouts"] <= params.train.max_rollouts
    assert steps >= 1 and [m["train/step"] for m in summary["history"]] == list(range(1, steps + 1))
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert {0, steps} <= {row["step"] for row in evals}
    checkpoint = ran.path(summary["checkpoint"])
    assert checkpoint.parent == ran.path(params.train.checkpoint_dir)
    assert read_state(checkpoint)["step"] == steps
    assert ran.path(summary["policy"]) == run_dir / "policy"
    assert (run_dir / "policy" / "config.json").is_file()
    return summary


def _mlflow_runs_of(ran: Ran, run_dir: str) -> list:
    """The MLflow runs of the store that record `train.run_dir` = `run_dir`."""
    client = ran.client()
    experiments = [e.experiment_id for e in client.search_experiments()]
    return [r for r in client.search_runs(experiments)
            if r.data.params.get("train.run_dir") == run_dir]


def _trained_and_tracked(ran: Ran) -> None:
    """`brorl train` (the Prefect flow): a run folder, and "a run, tracked in MLflow": the one
    MLflow run of that folder in the store, the one its printed summary names, finished, named
    after the params, in their experiment, tagged with the arm's algorithm, with the start and
    every step logged, the final policy a registered version."""
    params, summary, printed = ran.params(), _trained(ran), ran.printed_json()
    [run] = _mlflow_runs_of(ran, params.train.run_dir)
    run_id = run.info.run_id
    assert printed["mlflow_run_id"] == run_id and printed["steps"] == summary["steps"]
    client = ran.client()
    run = client.get_run(run_id)
    assert (run.info.status, run.info.run_name) == ("FINISHED", params.name)
    assert client.get_experiment(run.info.experiment_id).name == params.tracking.experiment
    assert run.data.tags["algorithm"] == params.train.algorithm
    assert run.data.params["train.run_dir"] == params.train.run_dir
    logged = sorted(m.step for m in client.get_metric_history(run_id, "train/step"))
    assert logged == list(range(summary["steps"] + 1))
    assert max(m.step for m in client.get_metric_history(run_id, "eval/score_mean")) == \
        summary["steps"]
    versions = client.search_model_versions(f"run_id = '{run_id}'")
    assert str(printed["model_version"]) in {str(v.version) for v in versions}


def _trained_untracked(ran: Ran) -> dict:
    """`Run.open(params).train()` and `python -m brorl.train`: the same run folder "without
    MLflow": no MLflow run of that folder in the store."""
    params, summary = ran.params(), _trained(ran)
    assert _mlflow_runs_of(ran, params.train.run_dir) == []
    return summary


def _trained_from_the_command_line(ran: Ran) -> None:
    """`python -m brorl.train`: the run as above, and its one JSON line saying how it ended."""
    summary = _trained_untracked(ran)
    printed = ran.printed_json()
    assert (printed["step"], printed["stopped_by"], printed["rollouts"]) == (
        summary["steps"], summary["stopped_by"], summary["rollouts"])


def _simulated(ran: Ran) -> None:
    """`brorl simulate`: the results table, figure and curves (for every N, up to the steps
    asked), the DVC metrics, and the MLflow parent run with one finished child per N."""
    params = ran.params()
    sim, where = params.simulate, params.tracking
    out = ran.path(where.output_dir) / "simulate"
    assert all((out / name).is_file() for name in ("results.md", "simulate.png", "summary.json"))
    assert (ran.path(where.metrics_dir) / "simulate.json").is_file()
    with open(ran.path(where.plots_dir) / "simulate" / "curves.csv", newline="") as curves:
        rows = list(csv.DictReader(curves))
    assert {int(r["rollouts"]) for r in rows} == set(sim.rollouts_per_prompt)
    assert max(int(r["step"]) for r in rows) == sim.steps
    client, run_id = ran.client(), ran.printed_json()["mlflow_run_id"]
    parent = client.get_run(run_id)
    assert (parent.info.status, parent.info.run_name) == ("FINISHED", "simulate")
    assert client.get_experiment(parent.info.experiment_id).name == where.experiment
    assert parent.data.params["simulate.steps"] == str(sim.steps)
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{run_id}'")
    assert sorted(c.info.run_name for c in children) == sorted(
        f"simulate N={n}" for n in set(sim.rollouts_per_prompt))
    for child in children:
        assert child.info.status == "FINISHED"
        assert max(m.step for m in client.get_metric_history(child.info.run_id,
                                                             "simulate/q_pos")) == sim.steps


def _reproduced(ran: Ran) -> None:
    """`brorl run STAGES` ("dvc repro ..., as make run"; here against the session's Prefect
    server, which PREFECT_API_URL names): the stages are up to date after it and the
    comparison report is there."""
    import yaml

    stages = shlex.split(ran.command)[2:]
    status = subprocess.run([str(Path(sys.executable).parent / "dvc"), "status", *stages],
                            cwd=ran.clone, capture_output=True, text=True, timeout=300)
    assert status.returncode == 0 and "up to date" in status.stdout, status.stdout[-2000:]
    pipeline = yaml.safe_load((ran.clone / "params" / "pipeline.yaml").read_text())
    assert (ran.path(pipeline["compare"]["out"]) / "report.md").is_file()


def _helped(ran: Ran) -> None:
    """`brorl --help`: every command the README lists under it."""
    text = (ROOT / "README.md").read_text()
    listed = re.search(r"`brorl (run(?: \| [a-z]+)+)`", text)[1].split(" | ")
    missing = [c for c in listed if not re.search(rf"^\W*{c}\s", ran.done.stdout, re.M)]
    assert missing == [], ran.done.stdout


def _data_built(ran: Ran) -> None:
    """`brorl data`: the three splits at the params' `data.path`, each with rows."""
    from brorl.runs.preflight import check_split

    folder = ran.path(ran.params().data.path)
    assert all(check_split(folder, split) > 0 for split in ("train", "validation", "test"))


def _model_built(ran: Ran) -> None:
    """`brorl model`: "the checkpoint as an HF folder, and its card", from the GGUF file the
    params name; the folder loads as the trainer loads it."""
    from transformers import AutoConfig

    params = ran.params()
    folder = ran.path(params.model.path)
    card = json.loads((folder / "model.json").read_text())
    assert card["gguf"]["file"] == str(params.model.gguf_file), card
    assert AutoConfig.from_pretrained(folder).vocab_size == card["vocab_size"]
    assert (folder / "model.safetensors").is_file()


def _compared(ran: Ran) -> None:
    """`brorl compare` of a file with its own arms: "both arms, then the report": each arm
    trained in its own folder to the budget (`_trained`) as a finished MLflow run under the
    comparison's run, and the report on exactly those arms in the file's `report_dir`."""
    from brorl.params import compare_arms

    params, printed = ran.params(), ran.printed_json()
    arms = compare_arms(params, ran.clone)
    assert len({p.train.run_dir for p in arms.values()}) == len(arms) >= 2
    client = ran.client()
    for arm in arms.values():
        _trained(ran, arm)
        [run] = _mlflow_runs_of(ran, arm.train.run_dir)
        assert (run.info.status, run.info.run_name) == ("FINISHED", arm.name)
        assert run.data.tags["mlflow.parentRunId"] == printed["mlflow_run_id"]
    report = ran.path(params.compare.report_dir)
    assert ran.path(printed["report_dir"]) == report
    written = json.loads((report / "report.json").read_text())
    assert set(written["final_score"]) == set(arms)
    assert client.get_run(printed["mlflow_run_id"]).info.status == "FINISHED"


PROMISES: dict[str, Callable[[Ran], None]] = {
    "brorl data": _data_built,
    "brorl model": _model_built,
    "brorl compare": _compared,
    "brorl simulate": _simulated,
    "brorl train": _trained_and_tracked,
    "brorl run": _reproduced,
    "brorl --help": _helped,
    "python -m brorl.train": _trained_from_the_command_line,
    "Run.open(params).train()": _trained_untracked,
}
"""How a README command starts (a Python program: what it calls) -> the check of what the
README promises it does."""


def promised(block: Block, command: str) -> Callable[[Ran], None]:
    for start, check in PROMISES.items():
        if command.startswith(start) or (block.lang == "python" and start in command):
            return check
    pytest.fail(f"README line {block.line}: nothing checks what `{command}` promises; add its "
                "check to PROMISES")


RUN_BLOCKS = [b for b in BLOCKS if b.how and b.how.split(":")[0] in ("run", "ci")]


def test_every_command_that_runs_has_a_check_of_what_it_promises():
    assert RUN_BLOCKS
    for block in RUN_BLOCKS:
        for command in block.commands():
            promised(block, command)


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: f"line{b.line}")
def test_the_command_block_runs(block, ci_pipeline, prefect_harness):
    from prefect.settings import PREFECT_API_URL

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "BRORL_PYTHON": sys.executable, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "MLFLOW_TRACKING_URI": f"sqlite:///{ci_pipeline / 'mlflow.db'}",
           "PYTHONPATH": str(ci_pipeline)}  # `brorl` runs the clone's code, as in a user's clone
    for path, file in FILES.items():  # the params files the commands name, CI-sized
        (ci_pipeline / path).write_text(file.replaced())
    for command in block.commands():
        check = promised(block, command)
        if block.lang == "python":
            done = subprocess.run([sys.executable, "-c", command], cwd=ci_pipeline, env=env,
                                  capture_output=True, text=True, timeout=900)
        else:
            done = subprocess.run(["bash", "-c", command], cwd=ci_pipeline, env=env,
                                  capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (block.line, command, done.stdout[-2000:],
                                      done.stderr[-3000:])
        check(Ran(ci_pipeline, command, done, env["MLFLOW_TRACKING_URI"], block.lang == "python"))
