"""Bad input gets one clear line before any work starts (issue 13, item 3).

Each case feeds one malformed input (a params file, an override, a data split, a checkpoint, a
command-line argument) to one entry point in this process: `python -m flows.NAME`
(`flows.entry.run_flow_cli`), the `brorl` command, `python -m brorl.train`, `python -m
flows.study`, `python -m flows.deploy` and `python -m flows.server --pipeline`. It asserts the
exit code (2, or 1 for an invalid schedule), that the output is one `error:` line naming the
file, key or value (argument errors: the parser's usage line and its error line), that no
traceback was printed, that nothing started (a tripwire replaces what would start the Prefect
flow, server or model), and that every file of the repository's metrics/, plots/, params/,
dvc.yaml/dvc.lock and of the case's own folder is byte-identical afterwards, with no file added
under outputs/. Two cases run as real processes (`python -m flows.train`, `brorl`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from brorl.data import generate_code, generate_math, save_splits, split_problems
from brorl.data.records import problems_to_dataset
from brorl.policy import build_policy, build_tokenizer, save_policy

ROOT = Path(__file__).resolve().parents[1]
CI = "params/prorl_ci.yaml"
PROTECTED = ("metrics", "plots", "params", "dvc.yaml", "dvc.lock")


def _digest(folder: Path) -> dict[str, str]:
    files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def snapshot(case: Path) -> dict[str, str]:
    """Content hashes of the protected files and the case folder; names of outputs/ files."""
    state: dict[str, str] = {}
    for name in PROTECTED:
        if (ROOT / name).exists():
            state |= _digest(ROOT / name)
    state |= _digest(case)
    state |= {str(p): "" for p in (ROOT / "outputs").rglob("*")} if (ROOT / "outputs").exists() \
        else {}
    return state


def _model(hidden: int):
    tokenizer = build_tokenizer()
    model = build_policy(vocab_size=len(tokenizer), hidden_size=hidden, num_layers=1, num_heads=2,
                         num_kv_heads=1, intermediate_size=2 * hidden,
                         max_position_embeddings=128)
    return model, tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Valid inputs a case corrupts a copy of: splits, a tiny policy."""
    root = tmp_path_factory.mktemp("world")
    problems = generate_math(4, seed=0) + generate_code(2, seed=0)
    save_splits(split_problems(problems, seed=0, validation_fraction=0.25, test_fraction=0.25),
                root / "data")
    save_policy(*_model(16), root / "policy")
    return root


def write_params(case: Path, **sections) -> Path:
    """A params file over params/prorl_ci.yaml reading the case's data and policy."""
    tree = {"extends": str(ROOT / CI), "name": "bad-input-case",
            "data": {"path": str(case / "data")},
            "train": {"init_checkpoint": str(case / "policy"), "run_dir": str(case / "run"),
                      "checkpoint_dir": str(case / "run" / "checkpoints"),
                      "eval_splits": ["test"]}}
    for name, values in sections.items():
        tree.setdefault(name, {}).update(values)
    path = case / "case.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


# -- corruptions of a case folder (a copy of the world) -------------------------------------------
def _resave(case: Path, change: Callable) -> None:
    from datasets import DatasetDict, load_from_disk

    tables = load_from_disk(str(case / "data"))
    changed = DatasetDict({name: change(name, table) for name, table in tables.items()})
    changed.save_to_disk(str(case / "data.new"))  # not over the files it reads from
    shutil.rmtree(case / "data")
    (case / "data.new").rename(case / "data")


def drop_column(case: Path) -> None:
    _resave(case, lambda name, t: t.remove_columns(["tests"]))


def empty_test_split(case: Path) -> None:
    _resave(case, lambda name, t: problems_to_dataset([]) if name == "test" else t)


def only_train_split(case: Path) -> None:
    from datasets import DatasetDict, load_from_disk

    train = load_from_disk(str(case / "data"))["train"]
    DatasetDict({"train": train}).save_to_disk(str(case / "data.new"))
    shutil.rmtree(case / "data")
    (case / "data.new").rename(case / "data")


def truncate(path_of: Callable[[Path], Path], keep: float) -> Callable[[Path], None]:
    def corrupt(case: Path) -> None:
        path = path_of(case)
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])
    return corrupt


def arrow_of(split: str) -> Callable[[Path], Path]:
    return lambda case: next((case / "data" / split).glob("*.arrow"))


def weights(case: Path) -> Path:
    return case / "policy" / "model.safetensors"


def foreign_weights(case: Path) -> None:
    from safetensors.torch import save_file

    other, _ = _model(32)
    state = {k: v.contiguous() for k, v in other.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(weights(case)), metadata={"format": "pt"})


def remove(relative: str) -> Callable[[Path], None]:
    def corrupt(case: Path) -> None:
        target = case / relative
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    return corrupt


def write(relative: str, data: bytes) -> Callable[[Path], None]:
    def corrupt(case: Path) -> None:
        (case / relative).write_bytes(data)
    return corrupt


def saved_checkpoint(*, optimizer: bool, state: str | None = None) -> Callable[[Path], None]:
    """A run folder whose newest checkpoint lacks its optimizer state or has a bad state file."""
    def corrupt(case: Path) -> None:
        folder = case / "run" / "checkpoints" / "step_000001"
        for name in ("policy", "reference"):
            shutil.copytree(case / "policy", folder / name)
        (folder / "deepspeed" / "state").mkdir(parents=True)
        if optimizer:
            for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
                (folder / "deepspeed" / "state" / name).write_bytes(b"x")
        (folder / "trainer_state.json").write_text(
            state or json.dumps({"step": 1, "sampler": {"epoch": 0, "cursor": 0}}))
        (case / "run" / "checkpoints" / "latest").write_text("step_000001\n")
    return corrupt


# -- the cases ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    entry: str
    """flow:<name>, cli, train (python -m brorl.train), study, deploy or server."""
    argv: Callable[[Path], list[str]]
    """The arguments, given the case folder (a copy of the world, corrupted first)."""
    names: str
    """What the message must contain (the file, key or value)."""
    corrupt: Callable[[Path], None] | None = None
    code: int = 2
    usage: bool = False
    """An argument error: the parser prints its usage line before the error line."""


def flow_args(*sets: str, params: str = CI) -> Callable[[Path], list[str]]:
    return lambda case: ["--params", params, *(a for s in sets for a in ("-S", s))]


def case_args(*extra: str, **sections) -> Callable[[Path], list[str]]:
    return lambda case: ["--params", str(write_params(case, **sections)), *extra]


def file_args(text: bytes) -> Callable[[Path], list[str]]:
    def args(case: Path) -> list[str]:
        (case / "file.yaml").write_bytes(text)
        return ["--params", str(case / "file.yaml")]
    return args


CASES: dict[str, Case] = {
    # params files
    "params_missing": Case("flow:train", lambda c: ["--params", str(c / "nope.yaml")],
                           "nope.yaml: params file not found"),
    "params_not_utf8": Case("flow:train", file_args(b"name: caf\xe9\n"), "not UTF-8 text"),
    "params_bad_yaml": Case("flow:train", file_args(b"name: [x\n"), "file.yaml:2:1: not valid YAML"),
    "params_empty": Case("flow:train", file_args(b""), "file.yaml: the params file is empty"),
    "params_only_comment": Case("flow:data", file_args(b"# nothing\n"), "the params file is empty"),
    "params_top_level_list": Case("flow:train", file_args(b"- a\n"), "top level must be a mapping"),
    "params_extends_missing": Case("flow:train", file_args(b"extends: gone.yaml\n"),
                                   "gone.yaml: params file not found"),
    "params_extends_cycle": Case("flow:train", file_args(b"extends: file.yaml\n"),
                                 "`extends` forms a cycle"),
    "params_extends_not_a_name": Case("flow:train", file_args(b"extends: {a: 1}\n"),
                                      "`extends` must be a file name"),
    "params_unknown_key": Case("flow:train", flow_args("update.base_rl=1e-4"),
                               "update.base_rl: unknown key"),
    "params_unknown_section": Case("flow:train", flow_args("updates.base_lr=1e-4"),
                                   "updates: unknown key"),
    # overrides
    "override_bad_yaml": Case("flow:train", flow_args("train.steps=[1"),
                              "override 'train.steps=[1': the value is not valid YAML"),
    "override_no_equals": Case("flow:train", flow_args("train.steps"), "expected KEY=VALUE"),
    "override_empty_key": Case("flow:train", flow_args("=3"), "has an empty part"),
    "override_double_dot": Case("flow:train", flow_args("train..steps=3"), "has an empty part"),
    # values
    "lr_infinite": Case("flow:train", flow_args("update.base_lr=.inf"),
                        "update.base_lr: Input should be a finite number (got inf)"),
    "seconds_nan": Case("flow:train", flow_args("train.max_seconds=.nan"),
                        "train.max_seconds: Input should be a finite number"),
    "n_one": Case("flow:train", flow_args("update.rollouts_per_prompt=1"),
                  "update.rollouts_per_prompt: Input should be greater than or equal to 2"),
    "n_boolean": Case("flow:train", flow_args("update.rollouts_per_prompt=true"),
                      "rollouts_per_prompt = True is a boolean"),
    "steps_boolean": Case("flow:train", flow_args("train.steps=false"),
                          "steps = False is a boolean"),
    "n_absurd": Case("flow:train", flow_args("update.rollouts_per_prompt=1000000000000"),
                     "update.prompts_per_step x update.rollouts_per_prompt would hold about"),
    "data_absurd": Case("flow:data", flow_args("data.math_per_task=100000000000"),
                        "data.math_per_task, code_per_task, reasoning_per_task would hold"),
    "eval_absurd": Case("flow:train", flow_args("train.eval_per_family=10000000000"),
                        "train.eval_per_family x train.eval_samples would hold"),
    "b_zero": Case("flow:train", flow_args("update.prompts_per_step=0"),
                   "update.prompts_per_step: Input should be greater than 0 (got 0)"),
    "steps_text": Case("flow:train", flow_args("train.steps=many"),
                       "train.steps: Input should be a valid integer"),
    "steps_list": Case("flow:train", flow_args("train.steps=[1, 2]"),
                       "train.steps: Input should be a valid integer"),
    "clip_negative": Case("flow:train", flow_args("update.clip_eps_low=-0.1"),
                          "update.clip_eps_low: Input should be greater than or equal to 0"),
    "top_p_above_one": Case("flow:train", flow_args("train.eval_top_p=1.5"),
                            "train.eval_top_p: Input should be less than or equal to 1"),
    "engine_unknown": Case("flow:train", flow_args("generate.engine=sglang"),
                           "generate.engine: Input should be 'hf' or 'vllm'"),
    "zero_stage_three": Case("flow:train", flow_args("train.zero_stage=3"),
                             "train.zero_stage: Input should be 0, 1 or 2"),
    "eval_split_twice": Case("flow:train", flow_args("train.eval_splits=[test, test]"),
                             "names a split twice"),
    "plateau_on_test": Case("flow:train", flow_args("train.plateau_patience=2"),
                            "plateau_patience = 2 needs 'validation'"),
    "tis_with_top_p": Case("flow:train", flow_args("generate.top_p=0.9"),
                           "update.tis_mode = 'truncate' needs generate.top_p = 1"),
    "mini_batches_uneven": Case("flow:train", flow_args("update.mini_batches_per_step=7"),
                                "do not split into mini_batches_per_step = 7"),
    "baseline_not_an_arm": Case("flow:compare", flow_args("compare.baseline=grpo",
                                                          params="params/compare_ci.yaml"),
                                "compare.baseline 'grpo' is not a key of compare.arms"),
    "compare_arm_file_missing": Case("flow:compare", flow_args(
        "compare.arms={prorl: params/prorl_ci.yaml, brorl: params/none.yaml}",
        params="params/compare_ci.yaml"), "none.yaml: params file not found"),
    "fractions_leave_nothing": Case("flow:data", flow_args("data.validation_fraction=0.5",
                                                           "data.test_fraction=0.5"),
                                    "leaves nothing to train on"),
    # data
    "data_missing": Case("flow:train", case_args(data={"path": "/nonexistent/brorl-data"}),
                         "/nonexistent/brorl-data: no problem splits here"),
    "data_split_missing": Case("flow:train", case_args(), "no 'test' split",
                               corrupt=only_train_split),
    "data_field_missing": Case("flow:train", case_args(), "no column tests",
                               corrupt=drop_column),
    "data_zero_rows": Case("flow:train", case_args(), "test: the split has no rows",
                           corrupt=empty_test_split),
    "data_truncated_arrow": Case("flow:train", case_args(), "data",
                                 corrupt=truncate(arrow_of("train"), 0.5)),
    "data_index_garbage": Case("flow:base", case_args(), "the problem splits cannot be read",
                               corrupt=write("data/dataset_dict.json", b"{not json")),
    "base_data_missing": Case("flow:base", case_args(data={"path": "/nonexistent/brorl-data"}),
                              "no problem splits here"),
    # checkpoints
    "checkpoint_missing": Case("flow:train", case_args(), "train.init_checkpoint",
                               corrupt=remove("policy")),
    "checkpoint_no_config": Case("flow:train", case_args(), "not a checkpoint folder",
                                 corrupt=remove("policy/config.json")),
    "checkpoint_config_garbage": Case("flow:train", case_args(), "config.json: not valid JSON",
                                      corrupt=write("policy/config.json", b"{")),
    "checkpoint_no_weights": Case("flow:train", case_args(), "no model.safetensors",
                                  corrupt=remove("policy/model.safetensors")),
    "checkpoint_truncated": Case("flow:train", case_args(), "model.safetensors: truncated",
                                 corrupt=truncate(weights, 0.6)),
    "checkpoint_not_safetensors": Case("flow:train", case_args(),
                                       "truncated or not a safetensors file",
                                       corrupt=write("policy/model.safetensors", b"junk" * 10)),
    "checkpoint_foreign_shape": Case("flow:train", case_args(), "belong to another model",
                                     corrupt=foreign_weights),
    "checkpoint_no_tokenizer": Case("flow:train", case_args(), "no tokenizer.json",
                                    corrupt=remove("policy/tokenizer.json")),
    "resume_without_optimizer": Case("flow:train", case_args(), "no optimizer state",
                                     corrupt=saved_checkpoint(optimizer=False)),
    "resume_state_garbage": Case("flow:train", case_args(), "trainer_state.json: not a trainer",
                                 corrupt=saved_checkpoint(optimizer=True, state="[1]")),
    "evaluate_checkpoint_missing": Case("cli", lambda c: [
        "evaluate", *case_args()(c), "--checkpoint", str(c / "gone")], "--checkpoint"),
    "brorl_train_checkpoint_missing": Case("train", case_args(), "train.init_checkpoint",
                                           corrupt=remove("policy")),
    "brorl_train_bad_override": Case("train", flow_args("train.steps=0"),
                                     "train.steps: Input should be greater than 0"),
    # the brorl command
    "cli_bad_override": Case("cli", lambda c: ["train", *flow_args("train.steps=-1")(c)],
                             "train.steps: Input should be greater than 0"),
    "cli_data_missing": Case("cli", lambda c: [
        "train", *case_args(data={"path": "/nonexistent/d"})(c)], "no problem splits here"),
    "cli_run_sets_without_params": Case("cli", lambda c: ["run", "-S", "train.steps=1"],
                                        "-S needs --params FILE"),
    "cli_missing_params_option": Case("cli", lambda c: ["train"], "--params", usage=True),
    "cli_unknown_command": Case("cli", lambda c: ["trian"], "trian", usage=True),
    # other entry points
    "train_steps_not_a_number": Case("train", lambda c: ["--params", CI, "--steps", "abc"],
                                     "--steps", usage=True),
    "study_unknown_run": Case("study", lambda c: ["--params", "params/study_ci.yaml",
                                                  "--run", "n3_s9"], "n3_s9"),
    "study_no_mode": Case("study", lambda c: ["--params", "params/study_ci.yaml"],
                          "one of the arguments", usage=True),
    "study_bad_override": Case("study", lambda c: ["--params", "params/study_ci.yaml", "--plan",
                                                   "-S", "study.budget_rollouts=-1"],
                               "study.budget_rollouts"),
    "deploy_bad_cron": Case("deploy", lambda c: ["--params", CI, "--flow", "train",
                                                 "--train-cron", "every day"], "train", code=1),
    "deploy_bad_params": Case("deploy", lambda c: ["--params", CI, "-S", "train.bogus=1"],
                              "train.bogus: unknown key"),
    "pipeline_bad_params_file": Case("server", lambda c: ["--pipeline", "--", "true"],
                                     "bad.yaml: invalid params: train.bogus: unknown key"),
}


def run_entry(entry: str, argv: list[str], monkeypatch) -> int:
    """Run one entry point in this process with its start-up replaced by a tripwire."""
    def tripwire(*args, **kwargs):
        raise AssertionError(f"{entry} started work on bad input")

    if entry.startswith("flow:"):
        from flows import entry as flows_entry

        name = entry.split(":", 1)[1]
        flow = getattr(importlib.import_module(f"flows.{name}"), name)
        monkeypatch.setattr(flows_entry, "prefect_settings", tripwire)
        return _code(lambda: flows_entry.run_flow_cli(flow, argv))
    if entry == "cli":
        from flows import cli

        monkeypatch.setattr(cli, "_flow", tripwire)
        monkeypatch.setattr("flows.server.main", tripwire)
        result = CliRunner().invoke(cli.app, argv)
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        print(result.output, end="")
        return result.exit_code
    if entry == "train":
        from brorl.train import __main__ as train_main

        monkeypatch.setattr(train_main.Run, "open", tripwire)
        return _code(lambda: train_main.main(argv))
    if entry == "study":
        from flows import study

        monkeypatch.setattr(study, "prefect_settings", tripwire)
        return _code(lambda: study.main(argv))
    if entry == "deploy":
        from flows import deploy

        monkeypatch.setattr("prefect.serve", tripwire)
        return _code(lambda: deploy.main(argv))
    if entry == "server":
        from flows import server

        monkeypatch.setattr(server, "database", tripwire)
        return _code(lambda: server.main(argv))
    raise ValueError(entry)


def _code(call: Callable[[], object]) -> int:
    try:
        result = call()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return result if isinstance(result, int) else 0


def test_there_are_at_least_50_cases():
    assert len(CASES) >= 50


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_gets_one_clear_line_and_changes_nothing(name, world, tmp_path, monkeypatch,
                                                            capsys):
    case = CASES[name]
    folder = tmp_path / "case"
    shutil.copytree(world, folder)
    if case.corrupt:
        case.corrupt(folder)
    argv = case.argv(folder)
    monkeypatch.chdir(ROOT)
    if case.entry == "server":  # a pipeline whose stage reads a broken params file
        (folder / "bad.yaml").write_text("extends: " + str(ROOT / CI) + "\ntrain: {bogus: 1}\n")
        (folder / "dvc.yaml").write_text(
            "stages:\n  s:\n    cmd: scripts/python -m flows.train --params bad.yaml\n")
        monkeypatch.chdir(folder)
    before = snapshot(folder)
    capsys.readouterr()
    code = run_entry(case.entry, argv, monkeypatch)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert code == case.code, text
    assert "Traceback" not in text
    assert case.names in text, text
    if case.usage:
        assert any("rror" in line for line in lines), text
    else:
        assert len(lines) == 1 and lines[0].startswith("error: "), text
    assert snapshot(folder) == before


@pytest.mark.parametrize(
    ("command", "names"),
    [
        ([sys.executable, "-m", "flows.train", "--params", CI, "-S", "update.base_lr=.inf"],
         "update.base_lr: Input should be a finite number"),
        ([str(Path(sys.executable).parent / "brorl"), "train", "--params", CI, "-S",
          "update.rollouts_per_prompt=true"], "rollouts_per_prompt = True is a boolean"),
    ],
)
def test_as_a_process_the_error_is_one_line_exit_2_no_traceback(command, names):
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and names in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout
