"""Bad input gets one clear line before any work starts (issues 13 and 30).

Each case feeds one malformed input (a params file, an override, a data split, a checkpoint, a
run folder, a command-line argument, the environment) to one entry point: `brorl <stage>` (a
flow's command, `brorl study`, and the others of the `brorl` command), `python -m brorl.train`,
`python -m commands.deploy` and `python -m commands.server --pipeline`. Every case runs
twice. In this process, with a tripwire in place of what would start the Prefect flow, server or model; and as a process of its
own (`python -m MODULE` through a small harness; `brorl` is `python -m commands.cli`), which must exit before torch, transformers,
datasets, deepspeed, prefect, mlflow or dvc were imported: the order of work that makes an error
answer in about a second (`benchmarks/bad_inputs.py` times every case as a cold process). Both
assert the exit code (2, or 1 for an invalid schedule), that the output is one `error:` line naming
the file, key or value (argument errors: the parser's usage line and its error), that no traceback
was printed, and that every file of the repository's metrics/, plots/, params/, dvc.yaml/dvc.lock
and of the case's own folder is byte-identical afterwards, with no file added under outputs/.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from brorl.data import save_splits, split_problems
from brorl.data.records import problems_to_dataset
from brorl.families.code import generate_code
from brorl.families.math import generate_math
from brorl.params import load_params
from brorl.policy import build_policy, build_tokenizer, save_policy

ROOT = Path(__file__).resolve().parents[1]
CI = "params/prorl_ci.yaml"
PROTECTED = ("metrics", "plots", "params", "dvc.yaml", "dvc.lock")
HEAVY = ("torch", "transformers", "datasets", "deepspeed", "vllm", "prefect", "mlflow", "dvc")
"""What validation must never wait for: a rejected input exits before any of these loads."""


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


def make_world(root: Path) -> Path:
    """Valid inputs a case corrupts a copy of: splits, a tiny policy."""
    problems = generate_math(4, seed=0) + generate_code(2, seed=0)
    save_splits(split_problems(problems, seed=0, validation_fraction=0.25, test_fraction=0.25),
                root / "data")
    save_policy(*_model(16), root / "policy")
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return make_world(tmp_path_factory.mktemp("world"))


def write_params(case: Path, **sections) -> Path:
    """A params file over params/prorl_ci.yaml reading the case's data and policy."""
    tree = {"extends": str(ROOT / CI), "name": "bad-input-case",
            "data": {"path": str(case / "data")},
            "model": {"path": str(case / "policy")},  # as if the model stage had written it
            "train": {"init_checkpoint": str(case / "policy"), "run_dir": str(case / "run"),
                      "checkpoint_dir": str(case / "run" / "checkpoints"),
                      "eval_splits": ["test"]},
            "compare": {"arms": {arm: {"train": {"run_dir": str(case / arm)}}  # its own arms
                                 for arm in ("prorl", "brorl")}}}
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


OPTIMIZER = "deepspeed/state/zero_pp_rank_0_mp_rank_00_optim_states.pt"


def write_checkpoint(case: Path, *, optimizer: bool = True, state: str | None = None,
                     params: dict | None = None) -> Path:
    """`<case>/run/checkpoints/step_000001` as a run lays it out (`brorl.train.checkpoint`):
    policy, reference, DeepSpeed's state files and an RNG file (real torch archives, small),
    the trainer state, the `latest` pointer; `params`: the record of the run that wrote it."""
    folder = case / "run" / "checkpoints" / "step_000001"
    for name in ("policy", "reference"):
        shutil.copytree(case / "policy", folder / name)
    (folder / "deepspeed" / "state").mkdir(parents=True)
    if optimizer:
        for name in ("deepspeed/state/mp_rank_00_model_states.pt", OPTIMIZER, "rng_rank0.pt"):
            torch.save({"state": torch.arange(4096.0)}, folder / name)
    if params is not None:
        (folder / "params.json").write_text(json.dumps(params))
    (folder / "trainer_state.json").write_text(
        state or json.dumps({"step": 1, "sampler": {"epoch": 0, "cursor": 0}}))
    (case / "run" / "checkpoints" / "latest").write_text("step_000001\n")
    return folder


def saved_checkpoint(**kwargs) -> Callable[[Path], None]:
    return lambda case: write_checkpoint(case, **kwargs) and None


def case_params(case: Path, *sets: str) -> dict:
    """The resolved params of the case's params file (`write_params`), with overrides."""
    return load_params(case / "case.yaml", list(sets)).model_dump(mode="json")


def checkpoint_of_another_run(case: Path) -> None:
    """A checkpoint recorded as BroRL's (N=64, its own name) where the case trains ProRL."""
    write_params(case)
    other = case_params(case, "name=brorl-ci", "train.algorithm=brorl",
                        "update.rollouts_per_prompt=64", "update.prompts_per_step=1",
                        "train.steps=3")  # steps: a stop rule, which may change
    write_checkpoint(case, params=other)


def truncated_optimizer(case: Path) -> None:
    folder = write_checkpoint(case)
    truncate(lambda c: folder / OPTIMIZER, 0.5)(case)


def latest_names_a_missing_checkpoint(case: Path) -> None:
    (case / "run" / "checkpoints").mkdir(parents=True)
    (case / "run" / "checkpoints" / "latest").write_text("step_000009\n")


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the cases ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    entry: str
    """flow:<name>, cli, train (python -m brorl.train), study, deploy or server."""
    argv: Callable[[Path], list[str]]
    """The arguments, given the case folder (a copy of the world, corrupted first)."""
    names: str | Callable[[Path], str]
    """What the message must contain (the file, key or value), or its maker given the folder."""
    corrupt: Callable[[Path], None] | None = None
    code: int = 2
    usage: bool = False
    """An argument error: the parser prints its usage line first, then this error."""
    env: Callable[[], dict[str, str]] = field(default=dict)
    """Environment variables the case sets."""
    read_only: str | None = None
    """A folder of the case (relative) mounted read-only: only as a process (a mount namespace)."""

    def expected(self, case: Path) -> str:
        return self.names(case) if callable(self.names) else self.names


ENTRY_MODULES = {"cli": "commands.cli", "train": "brorl.train", "study": "commands.cli",
                 "deploy": "commands.deploy", "server": "commands.server"}
"""The module `python -m` runs for each entry (`flow:<name>`: the `brorl` command)."""


def module_of(entry: str) -> str:
    return "commands.cli" if entry.startswith("flow:") else ENTRY_MODULES[entry]


def entry_argv(entry: str, argv: list[str]) -> list[str]:
    """The entry's whole command line: a flow's case (`flow:<name>`) and the study's run through
    the `brorl` command, named first."""
    if entry.startswith("flow:") or entry == "study":
        return [entry.removeprefix("flow:"), *argv]
    return argv


def api_down() -> dict[str, str]:
    return {"PREFECT_API_URL": f"http://127.0.0.1:{closed_port()}/api"}


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
    "data_absurd": Case("flow:data", flow_args("data.families.math.per_task=100000000000"),
                        "data.families' per_task would hold"),
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
    "data_truncated_arrow": Case("flow:train", case_args(),
                                 lambda c: f"{arrow_of('train')(c)}: the Arrow data cannot be read",
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
    "resume_optimizer_truncated": Case(
        "flow:train", case_args(),
        lambda c: f"{c / 'run/checkpoints/step_000001' / OPTIMIZER}: truncated or not a "
                  "checkpoint archive", corrupt=truncated_optimizer),
    "resume_another_runs_checkpoint": Case(
        "train", case_args(),
        "train.algorithm ('brorl' there, 'prorl' now), update.prompts_per_step (1 there, 4 now), "
        "update.rollouts_per_prompt (64 there, 16 now)", corrupt=checkpoint_of_another_run),
    "resume_latest_names_missing_checkpoint": Case(
        "flow:train", case_args(),
        lambda c: f"{c / 'run/checkpoints/latest'} names step_000009, which is not a complete "
                  "checkpoint", corrupt=latest_names_a_missing_checkpoint),
    "run_dir_read_only": Case(
        "flow:train", case_args(),
        lambda c: f"train.run_dir = {c / 'run'}: cannot write in {c / 'run'} (a read-only file "
                  "system)", corrupt=lambda c: (c / "run").mkdir(), read_only="run"),
    "steps_beyond_any_budget": Case(
        "flow:train", flow_args("train.steps=99999999999999999999999"),
        "train.steps = 99999999999999999999999: beyond the 999,999 steps a run can count"),
    "prefect_server_not_running": Case(
        "flow:simulate", flow_args(params="params/simulate_ci.yaml"),
        "no Prefect server answers there", env=api_down),
    "cli_prefect_server_not_running": Case(
        "cli", lambda c: ["simulate", *flow_args(params="params/simulate_ci.yaml")(c)],
        "no Prefect server answers there", env=api_down),
    "pipeline_prefect_server_not_running": Case(
        "server", lambda c: ["--pipeline", "--", "true"], "no Prefect server answers there",
        env=api_down),
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
    "cli_missing_params_option": Case("cli", lambda c: ["train"], "Missing option '--params'",
                                      usage=True),
    "cli_unknown_command": Case("cli", lambda c: ["trian"], "No such command 'trian'",
                                usage=True),
    # other entry points
    "train_steps_not_a_number": Case("train", lambda c: ["--params", CI, "--steps", "abc"],
                                     "argument --steps: invalid int value: 'abc'", usage=True),
    "study_unknown_run": Case("study", lambda c: ["--params", "params/study_ci.yaml",
                                                  "--run", "n3_s9"], "n3_s9"),
    "study_no_mode": Case("study", lambda c: ["--params", "params/study_ci.yaml"],
                          "brorl study takes one mode of --warmup, --pool, --plan, --start, "
                          "--report, --run RUN (given: none)"),
    "study_bad_override": Case("study", lambda c: ["--params", "params/study_ci.yaml", "--plan",
                                                   "-S", "study.budget_rollouts=-1"],
                               "study.budget_rollouts"),
    "deploy_bad_cron": Case("deploy", lambda c: ["--params", CI, "--flow", "train",
                                                 "--train-cron", "every day"],
                              "train: 'every day' is not a cron expression", code=1),
    "deploy_bad_params": Case("deploy", lambda c: ["--params", CI, "-S", "train.bogus=1"],
                              "train.bogus: unknown key"),
    "pipeline_bad_params_file": Case("server", lambda c: ["--pipeline", "--", "true"],
                                     "bad.yaml: invalid params: train.bogus: unknown key"),
}


def run_entry(entry: str, argv: list[str], monkeypatch) -> int:
    """Run one entry point in this process with its start-up replaced by a tripwire."""
    def tripwire(*args, **kwargs):
        raise AssertionError(f"{entry} started work on bad input")

    if entry in ("cli", "study") or entry.startswith("flow:"):
        from commands import cli

        monkeypatch.setattr(cli, "_flow", tripwire)
        monkeypatch.setattr("flows.prefect_settings", tripwire)
        monkeypatch.setattr("commands.server.main", tripwire)
        result = CliRunner().invoke(cli.app, entry_argv(entry, argv))
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        print(result.output, end="")
        return result.exit_code
    if entry == "train":
        from brorl.train import __main__ as train_main

        monkeypatch.setattr("brorl.train.run.Run.open", tripwire)
        return _code(lambda: train_main.main(argv))
    if entry == "deploy":
        from commands import deploy

        monkeypatch.setattr(deploy, "build_deployments", tripwire)
        return _code(lambda: deploy.main(argv))
    if entry == "server":
        from commands import server

        monkeypatch.setattr(server, "database", tripwire)
        monkeypatch.setattr("subprocess.run", tripwire)
        return _code(lambda: server.main(argv))
    raise ValueError(entry)


def _code(call: Callable[[], object]) -> int:
    try:
        result = call()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return result if isinstance(result, int) else 0


RUN_MODULE = """import json, os, runpy, sys, traceback
def run(module, argv, result):
    sys.argv = [module, *argv]
    code = 1
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        with open(result, "w") as f:
            json.dump({"code": code, "loaded": sorted(m for m in HEAVY if m in sys.modules)}, f)
    return code
"""
"""Runs `python -m MODULE ARGV` in this interpreter and writes its exit code and which of HEAVY
it had loaded when it ended (the case's input rejected) to `result`."""

ONE = RUN_MODULE + "sys.exit(run(sys.argv[1], sys.argv[3:], sys.argv[2]))\n"
"""`python -c ONE MODULE RESULT ARGS...`: one entry point in a fresh interpreter."""

MANY = RUN_MODULE + """for warm in ("pydantic", "yaml", "pyarrow", "typer", "brorl.params"):
    __import__(warm)  # what every entry loads first, paid once: none of HEAVY
for job in json.load(open(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        os.chdir(job["cwd"])
        os.environ.update(job["env"])
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1), os.dup2(log, 2)
        os._exit(run(job["module"], job["argv"], job["result"]))
    os.waitpid(pid, 0)
"""
"""`python -c MANY JOBS.json`: each job's entry point in a child forked from one interpreter
that holds none of HEAVY (a fresh interpreter per case would cost a second each)."""


def read_only_prefix(folder: Path) -> list[str]:
    """A command prefix under which `folder` is a read-only mount (a user and mount namespace of
    its own); without `unshare`, a folder without write permission when not running as root."""
    if shutil.which("unshare") and subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "true"]).returncode == 0:
        script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
        return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(folder)]
    if os.geteuid() == 0:
        pytest.skip("no read-only folder here: root ignores permissions and unshare is missing")
    folder.chmod(0o555)
    return []


def harness(code: str) -> str:
    return code.replace("HEAVY", repr(HEAVY))


def prepare(case: Case, world: Path, folder: Path) -> tuple[list[str], Path]:
    """The case folder (a corrupted copy of the world), its arguments, its working folder."""
    shutil.copytree(world, folder)
    if case.corrupt:
        case.corrupt(folder)
    argv = case.argv(folder)
    if case.entry != "server":
        return argv, ROOT
    (folder / "bad.yaml").write_text("extends: " + str(ROOT / CI) + "\ntrain: {bogus: 1}\n")
    if "PREFECT_API_URL" not in case.env():  # a pipeline whose stage reads a broken params file
        (folder / "dvc.yaml").write_text(
            "stages:\n  s:\n    cmd: scripts/brorl train --params bad.yaml\n")
    return argv, folder


def assert_one_clear_line(case: Case, folder: Path, code: int, text: str) -> None:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert code == case.code, text
    assert "Traceback" not in text
    assert case.expected(folder) in text, text
    if case.usage:
        assert lines[0].lower().startswith("usage:"), text
    else:
        assert len(lines) == 1 and lines[0].startswith("error: "), text


PROCESS_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
"""A child's environment: this checkout's packages first, whatever the working folder."""


@pytest.fixture(scope="module")
def as_processes(world, tmp_path_factory) -> dict[str, dict]:
    """The cases of AS_PROCESSES run by one `MANY` harness: per case its folder, exit code,
    output, what it had loaded, and its folder's snapshot before and after."""
    root = tmp_path_factory.mktemp("processes")
    jobs, found = [], {}
    for name in AS_PROCESSES:
        case = CASES[name]
        folder = root / name / "case"
        argv, cwd = prepare(case, world, folder)
        job = {"module": module_of(case.entry), "argv": entry_argv(case.entry, argv),
               "cwd": str(cwd), "env": case.env(),
               "log": str(root / name / "log"), "result": str(root / name / "result.json")}
        jobs.append(job)
        found[name] = {"folder": folder, "job": job, "before": snapshot(folder)}
    (root / "jobs.json").write_text(json.dumps(jobs))
    done = subprocess.run([sys.executable, "-c", harness(MANY), str(root / "jobs.json")],
                          cwd=ROOT, env=PROCESS_ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for name, entry in found.items():
        result = json.loads(Path(entry["job"]["result"]).read_text())
        entry |= result | {"text": Path(entry["job"]["log"]).read_text(),
                           "after": snapshot(entry["folder"])}
    return found


def test_the_world_the_cases_corrupt_passes_every_check(world, tmp_path):
    """The control of every case: the uncorrupted world passes the checks of each stage, and
    so does a checkpoint written by the same run (only a stop rule changed), so that a case
    fails for its corruption alone."""
    from brorl.runs.preflight import check_inputs

    case = tmp_path / "case"
    shutil.copytree(world, case)
    params = load_params(write_params(case))
    for stage in ("data", "base", "train", "evaluate", "compare", "simulate"):
        assert check_inputs(params, stage, ROOT) == []
    write_checkpoint(case, params=case_params(case, "train.steps=3", "train.max_rollouts=64"))
    assert check_inputs(params, "train", ROOT) == []  # resumes step_000001


def test_a_changed_run_resumes_when_allowed_and_a_broken_pointer_falls_back_saying_so(
        world, tmp_path):
    from brorl.runs.preflight import InputError, check_inputs

    case = tmp_path / "case"
    shutil.copytree(world, case)
    params = load_params(write_params(case))
    write_checkpoint(case, params=case_params(case, "update.clip_eps_high=0.4"))
    with pytest.raises(InputError, match=r"update.clip_eps_high \(0.4 there, 0.28 now\)"):
        check_inputs(params, "train", ROOT)
    assert check_inputs(params, "train", ROOT, allow_changed_params=True) == []
    (case / "run" / "checkpoints" / "latest").write_text("step_000002\n")  # removed by hand
    notes = check_inputs(params, "train", ROOT, allow_changed_params=True)
    assert notes == [f"{case / 'run/checkpoints/latest'} names step_000002, which is not a "
                     "complete checkpoint: resuming from step_000001, the newest complete one."]


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.read_only is None))
def test_bad_input_gets_one_clear_line_and_changes_nothing(name, world, tmp_path, monkeypatch,
                                                            capsys):
    case, folder = CASES[name], tmp_path / "case"
    argv, cwd = prepare(case, world, folder)
    monkeypatch.chdir(cwd)
    for key, value in case.env().items():
        monkeypatch.setenv(key, value)
    before = snapshot(folder)
    capsys.readouterr()
    code = run_entry(case.entry, argv, monkeypatch)
    captured = capsys.readouterr()
    assert_one_clear_line(case, folder, code, captured.out + captured.err)
    assert snapshot(folder) == before


AS_PROCESSES = sorted(n for n, c in CASES.items() if c.read_only is None)


@pytest.mark.parametrize("name", AS_PROCESSES)
def test_as_a_process_it_answers_before_any_heavy_import(name, as_processes):
    """The same case as `python -m MODULE`: one line, nothing changed, and none of HEAVY loaded
    when it exits: every check runs before the imports of the work it guards."""
    case, found = CASES[name], as_processes[name]
    assert_one_clear_line(case, found["folder"], found["code"], found["text"])
    assert found["after"] == found["before"]
    assert found["loaded"] == []


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.read_only))
def test_a_read_only_folder_is_refused_before_any_heavy_import(name, world, tmp_path):
    case, folder = CASES[name], tmp_path / "case"
    argv, cwd = prepare(case, world, folder)
    before = snapshot(folder)
    result = tmp_path / "result.json"
    command = [*read_only_prefix(folder / case.read_only), sys.executable, "-c", harness(ONE),
               module_of(case.entry), str(result), *entry_argv(case.entry, argv)]
    done = subprocess.run(command, cwd=cwd, env={**PROCESS_ENV, **case.env()},
                          capture_output=True, text=True, timeout=300)
    (folder / case.read_only).chmod(0o755)  # where the folder was made read-only by its mode
    assert_one_clear_line(case, folder, done.returncode, done.stdout + done.stderr)
    assert json.loads(result.read_text()) == {"code": case.code, "loaded": []}
    assert snapshot(folder) == before


@pytest.mark.parametrize(
    ("command", "names"),
    [
        ([str(ROOT / "scripts" / "brorl"), "train", "--params", CI, "-S", "update.base_lr=.inf"],
         "update.base_lr: Input should be a finite number"),
        ([str(Path(sys.executable).parent / "brorl"), "train", "--params", CI, "-S",
          "update.rollouts_per_prompt=true"], "rollouts_per_prompt = True is a boolean"),
    ],
)
def test_the_typed_commands_print_one_line_exit_2_no_traceback(command, names):
    # the installed script: this checkout's flows/; scripts/brorl: this interpreter
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BRORL_PYTHON": sys.executable}
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and names in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout


@pytest.mark.parametrize("command", ["commands.cli train", "commands.cli", "brorl.train",
                                     "commands.deploy", "commands.server", "commands.cli evaluate",
                                     "commands.cli study"])
def test_help_answers_before_any_heavy_import(command, tmp_path):
    out = tmp_path / "result.json"
    module, *args = command.split()
    done = subprocess.run([sys.executable, "-c", harness(ONE), module, str(out), *args, "--help"],
                          cwd=ROOT, env=PROCESS_ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "usage" in done.stdout.lower(), done.stdout + done.stderr
    assert json.loads(out.read_text()) == {"code": 0, "loaded": []}
