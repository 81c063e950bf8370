"""Every example in the commands' `--help` works as typed: `brorl <command> --help` and `python -m
flows.NAME --help` name a params file that exists, validates with the example's `-S` override,
and holds the section the command runs (not the pipeline's arm for the simulator); the
override sets a key the command reads; each `brorl run TARGET` names a stage DVC can find. The
`dvc exp run -S FILE:KEY=VALUE` examples of the README and docs/ use DVC's `+KEY` where the file
itself lacks the key (it comes through `extends`). Nothing is run: the commands are parsed only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
import yaml

from brorl.params import load_params
from brorl.params.loading import read_yaml_tree
from commands import cli, entry

ROOT = Path(__file__).resolve().parents[1]
RL = {"train", "update", "generate", "filter", "verify", "diagnostics"}
SECTIONS = {"simulate": {"simulate"}, "data": {"data"}, "model": {"model"}, "base": {"base"},
            "train": RL, "evaluate": RL, "serve": RL, "run": RL, "compare": {"compare"},
            "study": {"study"}}
"""The params sections each command runs: its example file must set one, its override one."""
COMMANDS = typer.main.get_command(cli.app).commands
FLOWS = sorted(p.stem for p in (ROOT / "flows").glob("*.py")
               if 'main("' in p.read_text() or "main(name)" in p.read_text())


def _help_texts(name: str) -> list[str]:
    if name.startswith("flows."):
        flow = name.removeprefix("flows.")
        p = entry.study_parser() if flow == "study" else entry.parser(flow)
        return [a.help or "" for a in p._actions] + [p.description or ""]
    command = COMMANDS[name]
    return [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]


def _examples(name: str) -> tuple[list[str], list[str], list[str]]:
    """The params files, `-S` overrides and `brorl run` targets a command's help names."""
    text = "\n".join(_help_texts(name))
    return (re.findall(r"params/[\w.-]+\.yaml", text), re.findall(r"e\.g\. ([\w.]+=\S+)", text),
            re.findall(r"`brorl run ([^`]+)`", text))


def _parses(name: str, args: list[str]) -> None:
    if name.startswith("flows."):
        flow = name.removeprefix("flows.")
        if flow == "study":
            entry.study_parser().parse_args([*args, "--plan"])
        else:
            entry.parser(flow).parse_args(args)
    else:
        COMMANDS[name].make_context(name, list(args))


def test_every_flow_module_has_a_help_example():
    assert set(FLOWS) == {*entry.EXAMPLES, "study"}


@pytest.mark.parametrize("name", [*sorted(COMMANDS), *(f"flows.{f}" for f in FLOWS)])
def test_help_examples_parse_and_validate_as_typed(name):
    files, overrides, targets = _examples(name)
    command = name.removeprefix("flows.")
    for target in targets:
        _parses(command, target.split())
        for one in target.split():
            dvc_yaml, _, stage = one.rpartition(":")
            where = dvc_yaml or "dvc.yaml"
            stages = yaml.safe_load((ROOT / where).read_text())["stages"]
            assert stage in stages, f"brorl run {target}: no stage {stage} in {where}"
    assert files, f"{name} --help names no example params file"
    for file in files:
        assert (ROOT / file).is_file(), f"{name}: {file} does not exist"
        given = set(read_yaml_tree(ROOT / file))
        assert given & SECTIONS[command], f"{name}: {file} sets none of {SECTIONS[command]}"
    for override in overrides:
        section = override.split(".")[0]
        assert section in SECTIONS[command], f"{name}: -S {override} sets no key {command} reads"
    assert overrides, f"{name} --help gives no example -S override"
    for file in files:
        _parses(name if name.startswith("flows.") else command,
                ["--params", file, *(a for o in overrides for a in ("-S", o))])
        load_params(ROOT / file, overrides)

DVC_SET = re.compile(r"-S '?((params/[\w.-]+\.yaml):\+?([\w.]+=[^'`\s]+))")


def test_dvc_exp_run_examples_mark_keys_their_file_lacks(monkeypatch):
    monkeypatch.chdir(ROOT)  # `_dvc_set` reads the file from the working folder
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for given, file, override in DVC_SET.findall(doc.read_text()):
            found.append(given)
            assert given == cli._dvc_set(file, override), f"{doc.name}: -S '{given}'"
    assert found
