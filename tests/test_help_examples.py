"""Every example in the commands' `--help` works as typed: `brorl <command> --help` names a params
file that exists, validates with the example's `-S` override, and holds the section the command
runs (not the pipeline's arm for the simulator); the
override sets a key the command reads; each `brorl run TARGET` names a stage DVC can find. The
other programs (`python -m brorl.train`, `commands.deploy`, `commands.server`,
`commands.mlflow_ui`, each `python benchmarks/X.py` with a command line) are held to the same
where their help names a params file or an override: their parsers are read in a child process
that stops each program at its argument parsing (tests/cli_probe.py). The
`dvc exp run -S FILE:KEY=VALUE` examples of the README and docs/ use DVC's `+KEY` where the file
itself lacks the key (it comes through `extends`). Nothing is run: the commands are parsed only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from brorl.params import load_params
from brorl.params.loading import read_yaml_tree
from commands import cli
from tests.cli_probe import probe
from tests.command_sections import COMMANDS, FLOWS, OPTION_SECTIONS, SECTIONS

ROOT = Path(__file__).resolve().parents[1]


def _help_texts(name: str) -> list[str]:
    command = COMMANDS[name]
    return [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]


def _examples(name: str) -> tuple[list[str], list[str], list[str]]:
    """The params files, `-S` overrides and `brorl run` targets a command's help names."""
    text = "\n".join(_help_texts(name))
    return (re.findall(r"params/[\w.-]+\.yaml", text), re.findall(r"e\.g\. ([\w.]+=\S+)", text),
            re.findall(r"`brorl run ([^`]+)`", text))


def _parses(name: str, args: list[str]) -> None:
    COMMANDS[name].make_context(name, list(args))


def test_every_flow_module_has_its_brorl_command():
    assert set(FLOWS) >= {"simulate", "train", "study"}
    assert set(FLOWS) <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_examples_parse_and_validate_as_typed(name):
    files, overrides, targets = _examples(name)
    command = name
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
        _parses(command, ["--params", file, *(a for o in overrides for a in ("-S", o))])
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


PROGRAMS = ["brorl.train", "commands.deploy", "commands.server", "commands.mlflow_ui",
            *(f"benchmarks/{p.name}" for p in sorted((ROOT / "benchmarks").glob("*.py"))
              if 'if __name__ == "__main__"' in p.read_text())]
"""The programs with a command line besides `brorl`."""
OVERRIDE = re.compile(r"e\.g\. (?:-S )?([\w.]+=[^\s),;]+)")


@pytest.fixture(scope="module")
def parsers():
    """Each program's argparse parser, unparsed (tests/cli_probe.py)."""
    argv = [["python", t] if t.endswith(".py") else ["python", "-m", t] for t in PROGRAMS]
    return dict(zip(PROGRAMS, probe([{"argv": a, "describe": True} for a in argv])))


@pytest.mark.parametrize("program", PROGRAMS)
def test_program_help_examples_validate(program, parsers):
    found = parsers[program]
    assert found["error"] is None and found["takes_args"], found
    options = found["options"]
    texts = [found["description"], *(o["help"] for o in options.values())]
    overrides = [o for text in texts for o in OVERRIDE.findall(text)]
    files = {}  # example params file -> the sections its option reads
    for option, about in options.items():
        if not (option.startswith("--") and about["dest"].endswith("params")
                and about["takes_value"]):
            continue
        assert (program, option) in OPTION_SECTIONS, (
            f"{program} {option}: say in tests/command_sections.py OPTION_SECTIONS which "
            "params sections it reads")
        for file in re.findall(r"params/[\w.-]+\.yaml", about["help"]):
            files[file] = OPTION_SECTIONS[program, option]
    if "-S" in options:
        assert files and overrides, f"{program} --help: give an example params file and -S"
    for file, sections in files.items():
        assert (ROOT / file).is_file(), f"{program}: {file} does not exist"
        given = set(read_yaml_tree(ROOT / file))
        assert given & sections, f"{program}: {file} sets none of {sorted(sections)}"
        load_params(ROOT / file, overrides)
    for override in overrides:
        reads = OPTION_SECTIONS.get((program, "--params"), set())
        assert override.split(".")[0] in reads, f"{program}: -S {override} sets no key it reads"
