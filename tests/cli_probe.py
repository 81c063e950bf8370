"""What a command's own argparse parser makes of an example, without running the command.

`probe(requests)` runs one child process (`python -m tests.cli_probe IN OUT`) that, for each
request's argv (`python -m MODULE ARGS`, `python SCRIPT.py ARGS`, or either under `torchrun`,
`deepspeed` or `accelerate launch`), runs the module or script as `__main__` with
`ArgumentParser.parse_args` and `parse_known_args` replaced: the first parse of the command line
goes through argparse as usual (unknown options, types, choices, required arguments) and then
stops the program, before it does any work. A launcher's argv is first parsed by the launcher's
own parser (`torch.distributed.run`, `deepspeed.launcher.runner`, `accelerate launch`) and the
program it starts is probed the same way. With `describe`, the parser is returned unparsed (its
options and their help texts, for the `--help` examples).

A module or script without an `ArgumentParser` in its source is never run: it takes no
arguments (`takes_args: false`), and an example that gives it some is an error.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class _Parsed(BaseException):
    """Raised at the program's first parse: the parser and what it made of the argv."""

    def __init__(self, parser: argparse.ArgumentParser, namespace: Any = None) -> None:
        super().__init__()
        self.parser, self.namespace = parser, namespace


@contextlib.contextmanager
def _patched(describe: bool):
    """Within it, the program's first `parse_args` / `parse_known_args` parses (with
    `describe`: does not), then raises `_Parsed`; calls made inside that parse (subparsers,
    `parse_args` -> `parse_known_args`) pass."""
    cls = argparse.ArgumentParser
    originals = {"parse_args": cls.parse_args, "parse_known_args": cls.parse_known_args}
    state = {"depth": 0, "describe": describe}

    def wrap(name: str):
        def method(self, args=None, namespace=None):
            if state["depth"]:
                return originals[name](self, args, namespace)
            if state["describe"]:
                raise _Parsed(self)
            state["depth"] += 1
            try:
                result = originals[name](self, args, namespace)
            finally:
                state["depth"] -= 1
            raise _Parsed(self, result[0] if name == "parse_known_args" else result)
        return method

    cls.parse_args, cls.parse_known_args = wrap("parse_args"), wrap("parse_known_args")
    try:
        yield
    finally:
        cls.parse_args = originals["parse_args"]
        cls.parse_known_args = originals["parse_known_args"]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _parser_info(parser: argparse.ArgumentParser) -> dict[str, Any]:
    shown = [a for a in parser._actions if a.help != argparse.SUPPRESS]
    return {"prog": parser.prog, "description": parser.description or "",
            "options": {s: {"dest": a.dest, "help": a.help or "", "takes_value": a.nargs != 0}
                        for a in shown for s in a.option_strings},
            "positionals": [a.dest for a in shown if not a.option_strings]}


def _launched(words: list[str]) -> list[str]:
    """The `python ...` command line a launcher's argv starts (SystemExit on a bad one)."""
    if words[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        a = get_args_parser().parse_args(words[1:])
        module, script, rest = a.module, a.training_script, a.training_script_args
    elif words[0] == "deepspeed":
        from deepspeed.launcher.runner import parse_args

        a = parse_args(words[1:])
        module, script, rest = a.module, a.user_script, a.user_args
    elif words[:2] == ["accelerate", "launch"]:
        from accelerate.commands.launch import launch_command_parser

        a = launch_command_parser().parse_args(words[2:])
        module, script, rest = a.module, a.training_script, a.training_script_args
    else:
        return words
    return ["python", "-m", script, *rest] if module else ["python", script, *rest]


def _source(words: list[str]) -> tuple[str, Path | None]:
    """The module or script a `python ...` argv runs, and its source file (None: not found)."""
    if words[:2] == ["python", "-m"] and len(words) > 2:
        name = words[2]
        try:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations is not None:
                spec = importlib.util.find_spec(f"{name}.__main__")
        except ImportError:
            spec = None
        return name, Path(spec.origin) if spec and spec.origin else None
    script = words[1] if len(words) > 1 else ""
    path = ROOT / script
    return script, path if script.endswith(".py") and path.is_file() else None


def _one(request: dict[str, Any]) -> dict[str, Any]:
    words, describe = list(request["argv"]), bool(request.get("describe"))
    out: dict[str, Any] = {"argv": words, "error": None}
    err, saved_argv = io.StringIO(), sys.argv
    sys.argv = [" ".join(words[:2] if words[0] == "accelerate" else words[:1])]  # its usage name
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            words = _launched(words)
    except SystemExit:
        out["error"] = _last_error(err.getvalue())
        return out
    finally:
        sys.argv = saved_argv
    target, source = _source(words)
    args = words[3:] if words[:2] == ["python", "-m"] else words[2:]
    out.update(command=words, target=target, args=args)
    if source is None:
        out["error"] = f"{target}: no such module or script"
        return out
    text = source.read_text(encoding="utf-8")
    out["takes_args"] = "ArgumentParser(" in text
    if not out["takes_args"]:
        if args:
            out["error"] = f"{target} takes no arguments (it has no argparse parser)"
        return out
    saved_argv, err = sys.argv, io.StringIO()
    sys.argv = [str(source), *args]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
                _patched(describe):
            if words[:2] == ["python", "-m"]:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(source), run_name="__main__")
        out["error"] = f"{target}: ran to its end without parsing its arguments"
    except _Parsed as parsed:
        out.update(_parser_info(parsed.parser))
        if parsed.namespace is not None:
            out["values"] = {k: _jsonable(v) for k, v in vars(parsed.namespace).items()}
    except SystemExit as exit_:
        if exit_.code not in (0, None):  # 0: `--help`, which argparse answers while parsing
            out["error"] = f"{target}: " + _last_error(err.getvalue())
    except Exception as exc:  # noqa: BLE001 - a program that breaks before parsing
        out["error"] = f"{target}: {type(exc).__name__}: {exc}"
    finally:
        sys.argv = saved_argv
    return out


def _last_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    return (errors or lines or ["exited before parsing"])[-1].strip()


def probe(requests: list[dict[str, Any]], timeout_s: float = 600) -> list[dict[str, Any]]:
    """Each request's parse (`{"argv": [...], "describe": bool}`), in one child process."""
    if not requests:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        given, taken = Path(tmp) / "in.json", Path(tmp) / "out.json"
        given.write_text(json.dumps(requests))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-m", "tests.cli_probe", str(given), str(taken)],
                              cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        assert done.returncode == 0 and taken.is_file(), done.stderr[-3000:]
        return json.loads(taken.read_text())


def main(argv: list[str]) -> int:
    requests = json.loads(Path(argv[0]).read_text())
    sys.path.insert(0, str(ROOT))
    results = [_one(r) for r in requests]
    Path(argv[1]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
