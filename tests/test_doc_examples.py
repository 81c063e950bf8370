"""Every example of docs/*.md is checked as typed, without running it: nothing trains.

The pages are read as they are (a new block or command is checked as soon as it is written);
docs/benchmarks.md is left out, `python benchmarks/docs.py` writes it from the results files.
What counts as an example, on every other page:

- each command line of a fenced `bash` block (`\\` continuations joined, `# ...` comments
  dropped, `&&` / `;` / `|` chains split), and each inline `code` that starts with
  `python -m flows.`, `python -m brorl.`, `python -m commands.`, `python -m pytest`,
  `python benchmarks/` (or `benchmarks/X.py ARGS`), `brorl `, `dvc `, `make `, `torchrun`,
  `deepspeed` or `accelerate launch`; an inline one without arguments (or `brorl CMD` alone)
  only names the program, which must exist;
- each fenced `yaml` block: a params example that must load, written for the check to a
  temporary file under params/ (as the README's `params` marker); one whose first line is
  `# params/NAME.yaml` also stands for that file in the page's commands;
- each fenced `python` block: it parses, and its literal `load_params(FILE, [...])` calls load;
- a fenced block without a language: a stage diagram (`a -> b, c`) whose names are DVC stages;
- an inline option fragment (`--decompose`, `--run prorl_s0`) after a command of the same
  paragraph that parses its arguments with argparse: each option is one of that command's.

How a command is checked:

- `--params FILE`: FILE exists (placeholders `FILE`, `<run>`, `...` are not checked), sets one of
  the sections the command runs (tests/command_sections.py; else it would run their defaults)
  and `brorl.params.load_params(FILE, overrides)` accepts the example's `-S` overrides, each of
  which sets a key of a section the command reads;
- `brorl CMD`: parsed by the typer app (its options stand for the fragments after it);
  `brorl run STAGES`: stages DVC finds; `python -m flows.NAME` is refused (a flow module is not
  a program: `brorl NAME` runs it);
- `python -m brorl.X` / `commands.X`, `python benchmarks/X.py` and what `torchrun`, `deepspeed`
  and `accelerate launch` start (their own parsers read the launcher's options): the program's
  own argparse parser parses the example's arguments in a child process that stops the program
  right after (tests/cli_probe.py), so an unknown option, a bad choice or a missing required
  argument fails as it would for the reader; its params-file options as above
  (`OPTION_SECTIONS`);
- `dvc ...`: DVC's own parser accepts it (`dvc.cli.parse_args`); its targets (`X`,
  `FILE:STAGE`, `STAGE@KEY`, a path) name stages of that dvc.yaml (default the root's) or paths
  of the checkout; `exp run -S [FILE:]KEY=V` uses DVC's `+KEY` exactly where the file lacks the
  key (`commands.cli._dvc_set`) and loads; a remote is one of .dvc/config's;
- `make TARGET [VAR=V]`: a Makefile target and a variable it uses;
- `python -m pytest PATHS`: the test files (and `::test` names) exist.

Anything else in a fenced block (`pip install`, `ssh -L`, `source`) must match `ALLOWED`, each
with the reason it cannot be dry-run checked; an unknown command form fails, naming the page and
line, so that a new example gets a check. An example that cannot hold may be waived one by one
in `WAIVED`, with why. The README's own params files (its `file:` blocks, which
tests/test_readme.py writes before running the recipe) stand for themselves, so a page may name
`params/mine.yaml`.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import io
import logging
import re
import shlex
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer
import yaml

from benchmarks.docs import DOC as GENERATED
from benchmarks.docs import HEADER, render
from brorl.params import load_params
from brorl.params.loading import read_yaml_tree
from commands import cli
from tests.cli_probe import probe
from tests.command_sections import COMMANDS, OPTION_SECTIONS, SECTIONS
from tests.test_readme import FILES as README_FILES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != GENERATED.name]
SHELLS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
INLINE = re.compile(r"(?<!`)`(?!`)([^`]+)`(?!`)")
HEADING = re.compile(r"^#{1,6} +(.+?)[ \t]*$", re.M)
COMMAND = re.compile(r"(?:[A-Z_][A-Z0-9_]*=\S* )*(?:python -m (?:(?:flows|brorl|commands)\.\w"
                     r"|pytest(?= |$))|python benchmarks/|benchmarks/[\w.-]+\.py(?= |$)"
                     r"|(?:brorl|dvc|make|torchrun|deepspeed|accelerate launch)(?= |$))")
PLACEHOLDER = re.compile(r"<[^>]+>|[A-Z][A-Z_]*|\.\.\.")
"""An argument the reader fills in (`--params FILE`, `--run <run>`): parsed, not checked."""

ALLOWED: dict[str, str] = {
    r"python3(?:\.\d+)? -m venv \S+":
        "makes a virtualenv; nothing of the project's is named",
    r"source \S+/bin/activate":
        "activates that virtualenv in the reader's shell",
    r"pip install .+":
        "installs packages, which a test cannot do; the constraints file, the extras and the "
        "pins it names are checked (`_pip_problems`)",
    r"ssh -N(?: -L \d+:127\.0\.0\.1:\d+)+ \S+":
        "a tunnel to another machine, which a test cannot open",
}
"""Fenced command forms that cannot be dry-run checked by the rules above, and why."""

WAIVED: dict[tuple[str, str], tuple[str, dict[str, str]]] = {
    ("families.md", "Adding a family"): (
        "the params example names the reader's own module (mypackage.parity), which no checkout "
        "holds; tests/test_families.py loads that very family from a temporary package",
        {"yaml 0706a9f1e7f7": "data.families.parity with module mypackage.parity"}),
}
"""(page, section) -> why, and its waived examples (a block by its kind and the start of its
SHA-256, a command by its text) -> which one. A waived example that is gone fails the test."""


@dataclass(frozen=True)
class Example:
    """One example of a page: `kind` is command, fragment, yaml, python or text (a block
    without a language), or `lang:X` for a block of another language."""

    page: str
    line: int
    kind: str
    text: str
    section: str
    paragraph: int | None
    """The inline paragraph it lies in (None: a fenced block's)."""
    fenced: bool

    @property
    def identity(self) -> str:
        if self.kind == "command":
            return self.text
        return f"{self.kind} {hashlib.sha256(self.text.encode()).hexdigest()[:12]}"

    def where(self) -> str:
        folder = "" if self.page == "README.md" else "docs/"
        return f"{folder}{self.page}:{self.line}"


def _shell_commands(body: str) -> Iterator[tuple[int, str]]:
    """(line offset, command) of a shell block: continuations joined, comments dropped, chains
    split."""
    start, parts = 0, []
    for i, line in enumerate(body.splitlines()):
        if not parts:
            start = i
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        whole = " ".join(p.strip() for p in [*parts, line]).strip()
        parts = []
        whole = re.sub(r"(^|\s+)#(\s.*)?$", "", whole).strip()
        for command in re.split(r"\s+(?:&&|\|\||;|\|)\s+", whole):
            if command:
                yield start, command


def examples_of(page: str, text: str) -> list[Example]:
    """Every example of a page, in page order."""
    blanked = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)
    headings = [(m.start(), m[1]) for m in HEADING.finditer(blanked)]

    def section(pos: int) -> str:
        return next((h for at, h in reversed(headings) if at < pos), "")

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    found = []
    for m in FENCE.finditer(text):
        lang, body, first = m["lang"], m["body"], line(m.start()) + 1
        if lang in SHELLS:
            found += [Example(page, first + offset, "command", command, section(m.start()),
                              None, True) for offset, command in _shell_commands(body)]
        else:
            kind = {"yaml": "yaml", "yml": "yaml", "python": "python", "": "text"}.get(
                lang, f"lang:{lang}")
            found.append(Example(page, first, kind, body, section(m.start()), None, True))
    for m in INLINE.finditer(blanked):
        code = " ".join(m[1].split())
        paragraph = len(re.findall(r"\n[ \t]*\n", blanked[:m.start()]))
        if COMMAND.match(code):
            kind = "command"
        elif re.match(r"--?[A-Za-z]", code):
            kind = "fragment"
        else:
            continue
        found.append(Example(page, line(m.start()), kind, code, section(m.start()), paragraph,
                             False))
    return sorted(found, key=lambda e: e.line)


def _waived(example: Example) -> bool:
    _, waived = WAIVED.get((example.page, example.section), ("", {}))
    return example.identity in waived


@dataclass
class Program:
    """What a checked command parses its arguments with, for the option fragments after it:
    its option strings and the sections each params-file option reads (and its `-S` may set)."""

    options: set[str]
    params_options: dict[str, tuple[set[str], set[str]]] = field(default_factory=dict)


class Probes:
    """`tests.cli_probe.probe`, cached: one child process for everything asked at once."""

    def __init__(self) -> None:
        self.cache: dict[tuple, dict] = {}

    @staticmethod
    def key(argv: list[str], describe: bool) -> tuple:
        return (*argv, describe)

    def prefetch(self, requests: list[tuple[list[str], bool]]) -> None:
        missing = {self.key(a, d): (a, d) for a, d in requests if self.key(a, d) not in self.cache}
        results = probe([{"argv": a, "describe": d} for a, d in missing.values()])
        self.cache.update(zip(missing, results))

    def __call__(self, argv: list[str], describe: bool = False) -> dict:
        self.prefetch([(argv, describe)])
        return self.cache[self.key(argv, describe)]


def _argv(example: Example) -> list[str]:
    """A command's words, the leading `VAR=VALUE` settings dropped, `python` put before an
    inline `benchmarks/X.py`."""
    words = shlex.split(example.text)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    if words and words[0].startswith("benchmarks/"):
        words = ["python", *words]
    return words


def _probed(words: list[str]) -> bool:
    """Whether the command is checked by its own parser in the child process."""
    return (words[:1] in (["torchrun"], ["deepspeed"]) or words[:2] == ["accelerate", "launch"]
            or (words[:2] == ["python", "-m"] and len(words) > 2
                and words[2].startswith(("brorl.", "commands.")))
            or (words[:1] == ["python"] and len(words) > 1
                and words[1].startswith("benchmarks/")))


def _bare(words: list[str], example: Example) -> bool:
    """An inline command without arguments: it names the program only."""
    program = (3 if words[:2] == ["python", "-m"] else
               2 if words[:1] == ["python"] or words[:2] == ["accelerate", "launch"] else 1)
    return not example.fenced and len(words) <= program


def probe_requests(examples: list[Example]) -> list[tuple[list[str], bool]]:
    requests = []
    for example in examples:
        if example.kind == "command" and not _waived(example):
            words, bare = _argv(example), _bare(_argv(example), example)
            if _probed(words) and not (bare and words[0] != "python"):
                requests.append((words, bare))
    return requests


@dataclass
class Page:
    """The checks of one page: its doc-defined params files and the child-process parses."""

    probes: Probes
    defined: dict[str, str] = field(default_factory=dict)
    """`params/NAME.yaml` -> the yaml block of the page that stands for it."""

    @contextlib.contextmanager
    def params_file(self, file: str) -> Iterator[Path | None]:
        path = ROOT / file
        if path.is_file() or file not in self.defined:
            yield path if path.is_file() else None
            return
        stand_in = ROOT / "params" / f".doc_example_{path.stem}.yaml"
        try:
            stand_in.write_text(self.defined[file])
            yield stand_in
        finally:
            stand_in.unlink(missing_ok=True)

    def params_problems(self, file: str, overrides: list[str], sections: set[str],
                        reads: set[str]) -> list[str]:
        """A params file a command names: it exists, sets one of the sections the command
        runs, loads with the overrides, each of which sets a key the command reads."""
        if PLACEHOLDER.fullmatch(file):
            return []
        problems = [f"-S {o}: the command reads no `{o.split('.')[0]}` section (it reads "
                    f"{', '.join(sorted(reads))})" for o in overrides
                    if o.split("=")[0].split(".")[0] not in reads]
        with self.params_file(file) as path:
            if path is None:
                return [*problems, f"{file} does not exist"]
            try:
                given = set(read_yaml_tree(path))
            except Exception as err:  # noqa: BLE001 - any refusal is the finding
                return [*problems, f"{file}: {err}"]
            try:
                load_params(path, overrides)
            except Exception as err:  # noqa: BLE001 - any refusal is the finding
                given_as = " ".join([file, *(f"-S {o}" for o in overrides)])
                problems.append(f"{given_as}: {err}")
        if not given & sections:
            problems.append(f"{file} sets none of the sections the command runs "
                            f"({', '.join(sorted(sections))}): it would run their defaults")
        return problems

    def command(self, example: Example) -> tuple[list[str], Program | None]:
        """The problems of a command, and what it parses with (for its fragments)."""
        words = _argv(example)
        if not words:
            return ["an empty command"], None
        bare = _bare(words, example)
        if bare and words[0] in ("dvc", "make", "torchrun", "deepspeed", "accelerate"):
            return [], None  # the program named
        if words[:2] == ["python", "-m"] and len(words) > 2:
            if words[2].startswith("flows."):
                return [f"`python -m {words[2]}` runs nothing: a flow runs through `brorl "
                        f"{words[2].removeprefix('flows.')} --params FILE`"], None
            if words[2] == "pytest":
                return _pytest_problems(words[3:]), None
        if _probed(words):
            return self.program(words, bare)
        if words[0] == "brorl":
            return self.brorl(words[1:], not example.fenced)
        if words[0] == "dvc":
            return _dvc_problems(words[1:]), None
        if words[0] == "make":
            return _make_problems(words[1:]), None
        if words[:3] == ["prefect", "deployment", "run"]:
            return _deployment_problems(words[3:]), None
        for pattern in ALLOWED:
            if example.fenced and re.fullmatch(pattern, example.text):
                return (_pip_problems(words) if words[:2] == ["pip", "install"] else []), None
        return ["no check for this command form: add one to tests/test_doc_examples.py, or "
                "its pattern and the reason it cannot be checked to ALLOWED"], None

    def program(self, words: list[str], bare: bool) -> tuple[list[str], Program | None]:
        found = self.probes(words, describe=bare)
        if found["error"]:
            return [found["error"]], None
        target, options = found["target"], found.get("options", {})
        dests: dict[str, list[str]] = {}
        for option, about in options.items():
            dests.setdefault(about["dest"], []).append(option)
        sets = options["-S"]["dest"] if "-S" in options else None
        values = found.get("values") or {}
        overrides = [str(o) for o in values.get(sets) or []] if sets else []
        program, problems = Program(set(options)), []
        for option, about in options.items():
            if not (option.startswith("--") and about["dest"].endswith("params")
                    and about["takes_value"]):
                continue
            sections = OPTION_SECTIONS.get((target, option))
            if sections is None:
                problems.append(f"{target} {option}: say in tests/command_sections.py "
                                "OPTION_SECTIONS which params sections it reads")
                continue
            reads = OPTION_SECTIONS.get((target, "--params"), sections)
            program.params_options[option] = (set(sections), set(reads))
            if not bare and any(_given(o, found["args"]) for o in dests[about["dest"]]):
                problems += self.params_problems(str(values[about["dest"]]), overrides,
                                                 set(sections), set(reads))
        return problems, program

    def brorl(self, args: list[str], bare: bool) -> tuple[list[str], Program | None]:
        if not args or args == ["--help"]:
            return [], None  # `brorl`: the program named
        name = args[0]
        if name not in COMMANDS:
            return [f"brorl has no command {name} (it has {', '.join(sorted(COMMANDS))})"], None
        command = COMMANDS[name]
        reads = SECTIONS[name] | {"tracking"}
        program = Program({o for p in command.params for o in [*p.opts, *p.secondary_opts]},
                          {"--params": (SECTIONS[name], reads)})
        if bare and len(args) == 1:
            return [], program  # `brorl model`: the command named
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                context = command.make_context(name, list(args[1:]))
        except typer.Exit:
            return [], program  # --help
        except typer.TyperException as err:
            return [f"brorl {name}: {getattr(err, 'format_message', err.__str__)()}"], program
        given, problems = context.params, []
        for stage in given.get("stages") or []:
            problems += _dvc_target_problems(stage)
        if given.get("params"):
            problems += self.params_problems(given["params"], list(given.get("overrides") or []),
                                             SECTIONS[name], reads)
        return problems, program

    def fragment(self, example: Example, program: Program) -> list[str]:
        words, problems = shlex.split(example.text), []
        for i, word in enumerate(words):
            option = word.split("=")[0]
            if not option.startswith("-") or PLACEHOLDER.fullmatch(option):
                continue
            if option not in program.options:
                problems.append(f"{option} is not an option of the command before it "
                                f"(its options: {', '.join(sorted(program.options))})")
            elif option in program.params_options and i + 1 < len(words):
                problems += self.params_problems(words[i + 1], [],
                                                 *program.params_options[option])
        return problems

    def block(self, example: Example) -> list[str]:
        if example.kind == "yaml":
            stem = f".doc_example_{Path(example.page).stem}_{example.line}"
            stand_in = ROOT / "params" / f"{stem}.yaml"
            try:
                stand_in.write_text(example.text)
                load_params(stand_in)
            except Exception as err:  # noqa: BLE001 - any refusal is the finding
                return [f"the params example does not load: {err}"]
            finally:
                stand_in.unlink(missing_ok=True)
            return []
        if example.kind == "python":
            return self.python_block(example.text)
        if example.kind == "text":
            names = [n.strip() for n in re.split(r"->|,", example.text) if n.strip()]
            stages = {s for f in _dvc_files() for s in _stages(f)}
            if "->" in example.text and all(n in stages for n in names):
                return []
            return ["a block without a language that is not a stage diagram (`a -> b, c` of DVC "
                    "stages): give it a language this test checks, or add its check"]
        return [f"no check for a `{example.kind.removeprefix('lang:')}` block: add one to "
                "tests/test_doc_examples.py"]

    def python_block(self, code: str) -> list[str]:
        try:
            tree = ast.parse(code)
        except SyntaxError as err:
            return [f"the Python block does not parse: {err}"]
        problems = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "load_params":
                try:
                    file, *rest = (ast.literal_eval(a) for a in node.args)
                except ValueError:
                    continue
                problems += self.params_problems(file, list(rest[0]) if rest else [],
                                                 _all_sections(), _all_sections())
        return problems

    def problems(self, examples: list[Example]) -> list[str]:
        """Every problem of a page's examples, `docs/PAGE:LINE: EXAMPLE: PROBLEM`."""
        for example in examples:
            first = example.text.splitlines()[0] if example.text else ""
            defined = re.fullmatch(r"#\s*(params/[\w.-]+\.ya?ml)\b.*", first)
            if example.kind == "yaml" and defined and not _waived(example):
                self.defined[defined[1]] = example.text
        found, programs = [], {}
        for example in examples:
            if _waived(example):
                continue
            if example.kind == "command":
                problems, program = self.command(example)
                if program is not None and example.paragraph is not None:
                    programs[example.paragraph] = program
            elif example.kind == "fragment":
                program = programs.get(example.paragraph)
                problems = self.fragment(example, program) if program else []
            else:
                problems = self.block(example)
            shown = example.text if example.kind in ("command", "fragment") else (
                f"{example.kind} block")
            found += [f"{example.where()}: `{shown}`: {p}" for p in problems]
        return found


def _given(option: str, args: list[str]) -> bool:
    return any(a == option or a.startswith(f"{option}=") for a in args)


def _all_sections() -> set[str]:
    return {s for sections in SECTIONS.values() for s in sections} | {"tracking"}


def _argparse(parse: Callable, args: list[str]):
    """`(namespace, None)`, or `(None, error line)` where the parser exits."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parse(list(args)), None
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if "error" in line]
        return None, (lines or ["the parser exited"])[-1]


def _pytest_problems(args: list[str]) -> list[str]:
    problems, skip = [], False
    for word in args:
        if skip or word.startswith("-"):
            skip = word in ("-k", "-m", "-p", "-o", "--count", "--durations") and not skip
            continue
        path, *names = word.split("::")
        if not (ROOT / path).exists():
            problems.append(f"{path} does not exist")
            continue
        source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
        problems += [f"{path} has no test {n}" for n in names if not re.search(
            rf"^\s*(?:async )?(?:def|class) {re.escape(n.split('[')[0])}\b", source, re.M)]
    return problems


def _makefile() -> str:
    return (ROOT / "Makefile").read_text()


def _make_problems(args: list[str]) -> list[str]:
    text = _makefile()
    targets = {t for t in re.findall(r"^([\w.-]+)\s*:(?!=)", text, re.M) if t[0] != "."}
    problems, named = [], False
    for word in args:
        if "=" in word:
            var = word.split("=")[0]
            if f"$({var})" not in text:
                problems.append(f"the Makefile uses no variable {var}")
        elif word in targets:
            named = True
        else:
            problems.append(f"no Makefile target {word} (its targets: "
                            f"{', '.join(sorted(targets))})")
    return problems if named or problems else ["name a Makefile target"]


def _dvc_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("**/dvc.yaml")
                  if not any(part.startswith(".") or part == "outputs" for part in
                             p.relative_to(ROOT).parts))


@functools.cache
def _tracked() -> frozenset[str]:
    """The files git tracks: a DVC metrics or plots file a pipeline run is rewriting is briefly
    absent from the working tree, and still a sound target."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True, timeout=60).stdout.decode()
    return frozenset(name for name in listed.split("\0") if name)


def _deployment_problems(args: list[str]) -> list[str]:
    """`prefect deployment run FLOW/NAME [-p KEY=VALUE]`: a deployment prefect.yaml declares
    (`commands.pools.check_deployments`), each `-p` key one of its flow's parameters."""
    from commands import pools

    names = pools.check_deployments(ROOT / "prefect.yaml", None)
    if not args or args[0] not in names:
        return [f"prefect deployment run {' '.join(args)}: no such deployment in prefect.yaml "
                f"(its deployments: {', '.join(names)})"]
    keys = [a.partition("=")[0] for flag, a in zip(args[1:], args[2:]) if flag in ("-p", "--param")]
    entry = next(e for e in pools.deployments(ROOT / "prefect.yaml")
                 if pools.deployment_name(e) == args[0])
    file, _, function = entry["entrypoint"].partition(":")
    tree = ast.parse((ROOT / file).read_text())
    [found] = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == function]
    known = {a.arg for a in found.args.args + found.args.kwonlyargs}
    return [f"prefect deployment run {args[0]}: -p {k}: not a parameter of {function} "
            f"({', '.join(sorted(known))})" for k in keys if k not in known]


def _stages(dvc_yaml: str) -> dict:
    return yaml.safe_load((ROOT / dvc_yaml).read_text())["stages"]


DVC_FORMS = {"repro", "status", "dag", "push", "pull", "fetch", "checkout", "exp run",
             "exp show", "metrics show", "metrics diff", "plots show", "params diff",
             "remote modify", "remote default", "remote list"}
"""The `dvc` subcommands whose examples this test checks (beyond DVC's own parse)."""


def _dvc_target_problems(target: str) -> list[str]:
    """A DVC target: `FILE:STAGE[@KEY]`, a stage of the root dvc.yaml, or a path."""
    path, sep, stage = target.rpartition(":")
    if sep:
        if not (ROOT / path).is_file():
            return [f"{path} does not exist"]
        if stage.split("@")[0] not in _stages(path):
            return [f"no stage {stage} in {path}"]
        return []
    if (target.split("@")[0] in _stages("dvc.yaml") or target in _tracked()
            or (ROOT / target).exists()):
        return []
    declared = any(re.search(rf"(^|[\s:/-]){re.escape(target)}\s*$",
                             (ROOT / f).read_text(), re.M) for f in _dvc_files())
    return [] if declared else [f"no stage {target} in dvc.yaml, nor such a path"]


def _dvc_set_problems(given: str) -> list[str]:
    """`dvc exp run -S [FILE:][+]KEY=VALUE`: `+` exactly where FILE lacks KEY, and it loads."""
    m = re.fullmatch(r"(?:(?P<file>[\w./-]+\.ya?ml):)?(?P<plus>\+?)(?P<key>[\w.]+)=(?P<value>.*)",
                     given)
    if not m:
        return [f"-S {given}: not DVC's [FILE:]KEY=VALUE"]
    file, override = m["file"] or "params.yaml", f"{m['key']}={m['value']}"
    if not (ROOT / file).is_file():
        return [f"-S {given}: {file} does not exist"]
    wanted = cli._dvc_set(str(ROOT / file), override).removeprefix(f"{ROOT / file}:")
    if wanted != f"{m['plus']}{override}":
        return [f"-S {given}: write {file}:{wanted} (DVC's `+` adds a key the file lacks; "
                "commands.cli._dvc_set)"]
    # DVC's default params.yaml holds the arms' B and N; params/brorl.yaml extends it
    loaded = "params/brorl.yaml" if file == "params.yaml" else file
    try:
        load_params(ROOT / loaded, [override])
    except Exception as err:  # noqa: BLE001 - any refusal is the finding
        return [f"-S {given}: {err}"]
    return []


def _dvc_parse(args: list[str]):
    """`(namespace, None)`, or `(None, DVC's error)` where DVC's own parser refuses `args`."""
    from dvc.cli import DvcParserError, parse_args

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            errors.append(record.getMessage())

    errors: list[str] = []
    kept, dvc_logger = Kept(logging.ERROR), logging.getLogger("dvc")
    dvc_logger.addHandler(kept)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return parse_args(list(args)), None
    except (DvcParserError, SystemExit):
        return None, (errors or ["DVC's parser refuses it"])[-1]
    finally:
        dvc_logger.removeHandler(kept)


def _dvc_problems(args: list[str]) -> list[str]:
    namespace, error = _dvc_parse(args)
    if error:
        return [f"dvc: {error}"]
    words = [w for w in args if not w.startswith("-")]
    form = " ".join(words[:2] if words[0] in ("exp", "metrics", "plots", "params", "remote")
                    else words[:1])
    if form not in DVC_FORMS:
        return [f"no check for `dvc {form}`: add it to DVC_FORMS and its check"]
    one = getattr(namespace, "target", None)  # `dvc dag` takes one target
    problems = [p for t in [*(getattr(namespace, "targets", None) or []), *([one] if one else [])]
                for p in _dvc_target_problems(t)]
    problems += [p for s in getattr(namespace, "set_param", None) or []
                 for p in _dvc_set_problems(s)]
    if form.startswith("remote") and getattr(namespace, "name", None):
        remotes = re.findall(r"^\['?remote \"([\w-]+)\"'?\]", (ROOT / ".dvc" / "config")
                             .read_text(), re.M)
        if namespace.name not in remotes:
            problems.append(f"no DVC remote {namespace.name} in .dvc/config ({remotes})")
    return problems


def _pip_problems(words: list[str]) -> list[str]:
    """What `pip install` names from the checkout: constraints files, extras, pins."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    pins = (ROOT / "requirements" / "constraints.txt").read_text().lower().splitlines()
    problems = []
    for i, word in enumerate(words):
        if word in ("-c", "-r", "--constraint", "--requirement") and i + 1 < len(words):
            if not (ROOT / words[i + 1]).is_file():
                problems.append(f"{words[i + 1]} does not exist")
        elif m := re.fullmatch(r"\.\[([\w,-]+)\]", word):
            problems += [f"pyproject.toml has no extra {e}" for e in m[1].split(",")
                         if e not in extras]
        elif re.fullmatch(r"[\w.-]+==[\w.+]+", word) and word.lower() not in pins:
            problems.append(f"{word} is not the pin of requirements/constraints.txt")
    return problems


@pytest.fixture(scope="module")
def probes() -> Probes:
    """The child-process parses of every page's commands, taken at once."""
    found = Probes()
    found.prefetch([r for page in PAGES
                    for r in probe_requests(examples_of(page.name, page.read_text()))])
    return found


def test_the_generated_page_is_left_out():
    assert GENERATED.read_text().startswith(HEADER), "docs/benchmarks.md is written by hand"
    assert GENERATED.parent == ROOT / "docs" and PAGES and GENERATED not in PAGES


def test_the_generated_page_shows_every_recorded_figure():
    assert GENERATED.read_text() == render(), (
        "docs/benchmarks.md differs from benchmarks/results/*.json: run python benchmarks/docs.py")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_example_of_the_page_holds(page, probes):
    examples = examples_of(page.name, page.read_text())
    # the README's own params files (tests/test_readme.py writes them) stand for themselves
    problems = Page(probes, {path: b.body for path, b in README_FILES.items()}).problems(
        examples)
    assert problems == [], "\n" + "\n".join(problems)


SYNTAX = ("brorl <stage>", "brorl run | ")
"""How the README's inline code writes a command's shape, not an example: a placeholder NAME,
the alternatives split by `|`."""


def test_every_inline_command_of_the_readme_holds(probes):
    """The README's fenced blocks run in tests/test_readme.py; its inline commands are checked
    here as a docs page's are."""
    readme = ROOT / "README.md"
    examples = [e for e in examples_of("README.md", readme.read_text())
                if not e.fenced and not e.text.startswith(SYNTAX)]
    assert examples
    probes.prefetch(probe_requests(examples))
    problems = Page(probes, {path: b.body for path, b in README_FILES.items()}).problems(examples)
    assert problems == [], "\n" + "\n".join(problems)


def test_every_waiver_and_allowed_form_is_still_used():
    examples = [e for p in PAGES for e in examples_of(p.name, p.read_text())]
    for (page, section), (why, waived) in WAIVED.items():
        there = {e.identity for e in examples if (e.page, e.section) == (page, section)}
        gone = sorted(set(waived) - there)
        assert gone == [], f"{page}, {section}: no longer there, remove from WAIVED: {gone}"
    commands = [e.text for e in examples if e.kind == "command" and e.fenced]
    for pattern in ALLOWED:
        assert any(re.fullmatch(pattern, c) for c in commands), f"ALLOWED {pattern} is unused"


BROKEN = '''# A page

Train with `brorl train --params params/simulate.yaml`.

Simulate with `brorl simulate --params params/prorl.yaml -S simulate.steps=2000`.

Reproduce with `dvc repro simulator` or `make benchmark`.

Measure with `python benchmarks/diagnostics_cost.py --arms prorl`; `--decomposed` costs more.

```bash
python -m pytest tests/test_nope.py
curl https://example.org
```

```yaml
extends: prorl.yaml
name: broken
train: {stepz: 3}
```
'''
"""A page whose every example is broken: (line, what its problem says) in `BROKEN_AT`."""
BROKEN_AT = [(3, "sets none of the sections the command runs"),
             (5, "sets none of the sections the command runs"),
             (7, "no stage simulator in dvc.yaml"), (7, "no Makefile target benchmark"),
             (9, "--decomposed is not an option of the command before it"),
             (12, "tests/test_nope.py does not exist"), (13, "no check for this command form"),
             (17, "the params example does not load")]
SOUND = '''## Your own file

```yaml
# params/mine.yaml
extends: smollm2.yaml
name: mine
```

Then `brorl model --params params/mine.yaml -S model.seed=1` (or `brorl model --params
FILE`) and `brorl study --params params/study.yaml --run <run>` (its `--report` too); `make` and
`accelerate launch` name programs, `python benchmarks/diagnostics_cost.py --help` options.
'''
"""A page whose examples hold, one of them on a params file the page itself defines."""


def test_a_broken_example_fails_naming_its_page_and_line(probes):
    problems = Page(probes).problems(examples_of("broken.md", BROKEN))
    for line, says in BROKEN_AT:
        assert any(p.startswith(f"docs/broken.md:{line}: ") and says in p for p in problems), (
            line, says, problems)
    assert len(problems) == len(BROKEN_AT), problems
    assert Page(probes).problems(examples_of("sound.md", SOUND)) == []
    assert not list((ROOT / "params").glob(".doc_example_*")), "a stand-in file was left"
