"""Reading params files: `extends` chains, `key.sub=value` overrides, validation that names the fix.

A file may start with `extends: other.yaml` or a list of files (paths relative to it): those are
loaded first, in order, and this file's keys are deep-merged over them. Overrides apply last.
A validation error becomes one `ParamsError` line naming the file, each bad key and its value;
so does a file that is not UTF-8, not YAML or empty, an override whose value is not YAML, and
params whose sizes could not fit in this machine's memory (`resources.check_memory`).
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from brorl.params.experiment import ExperimentParams
from brorl.params.resources import check_memory
from brorl.params.run import own_checkpoints

T = TypeVar("T")


class ParamsError(ValueError):
    """A params file or override is invalid; the message names the file, the key and the fix."""


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` merged in: nested mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def same_named(config: type[T], section: Any, **given: Any) -> T:
    """`config` (a dataclass) built from `section`'s fields of the same names, `given` taking
    precedence; a field `section` lacks fails with an AttributeError naming it."""
    names = [f.name for f in fields(config) if f.name not in given]
    return config(**{name: getattr(section, name) for name in names}, **given)


def read_yaml_tree(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The merged mapping of `path` and the files it `extends`, before validation."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ParamsError(f"{path}: `extends` forms a cycle ({chain}); remove one link.")
    if not path.is_file():
        raise ParamsError(f"{path}: params file not found; pass a file under params/.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ParamsError(f"{path}: not UTF-8 text (byte {err.start} is {err.object[err.start]:#04x}"
                          "); save the file as UTF-8.") from None
    except OSError as err:
        raise ParamsError(f"{path}: cannot be read ({err.strerror}); check its permissions.") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}{_yaml_where(err)}: not valid YAML ({_yaml_problem(err)}); fix "
                          "the syntax there.") from None
    if raw is None:
        raise ParamsError(f"{path}: the params file is empty; give at least `extends: tiny.yaml` "
                          "and a `name`, as the files under params/ do.")
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: top level must be a mapping of sections, got {type(raw).__name__}.")
    parents = raw.pop("extends", None) or []
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ParamsError(f"{path}: `extends` must be a file name or a list of them, got {parents!r}.")
    tree: dict[str, Any] = {}
    for parent in parents:  # later parents override earlier ones, this file overrides all
        tree = _deep_merge(tree, read_yaml_tree(path.parent / parent, (*_seen, path)))
    return _deep_merge(tree, raw)


def apply_override(tree: dict[str, Any], override: str) -> dict[str, Any]:
    """Return `tree` with one `dotted.key=value` override applied (value parsed as YAML)."""
    if "=" not in override:
        raise ParamsError(f"override {override!r}: expected KEY=VALUE, e.g. simulate.steps=200.")
    key, _, text = override.partition("=")
    parts = key.strip().split(".")
    if not all(part.strip() for part in parts):
        raise ParamsError(f"override {override!r}: the key {key!r} has an empty part; write "
                          "section.key=value, e.g. train.steps=3.")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ParamsError(f"override {override!r}: the value is not valid YAML "
                          f"({_yaml_problem(err)}); quote it, e.g. {key}='{text}'.") from None
    nested: Any = value
    for part in reversed(parts):
        nested = {part: nested}
    return _deep_merge(tree, nested)


def _yaml_where(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def _yaml_problem(err: yaml.YAMLError) -> str:
    return str(getattr(err, "problem", None) or err).splitlines()[0]


def _describe(err: ValidationError, source: str) -> str:
    """One line: the source, then each bad key with what is wrong and its value."""
    parts = []
    for e in err.errors():
        where = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            parts.append(f"{where}: unknown key; check its spelling against brorl/params/")
        elif isinstance(e.get("input"), dict):  # a rule over a section: its message names keys
            parts.append(f"{where}: {e['msg'].removeprefix('Value error, ').rstrip('.')}")
        else:
            parts.append(f"{where}: {e['msg'].removeprefix('Value error, ')} "
                         f"(got {e.get('input')!r})")
    return f"{source}: invalid params: " + "; ".join(parts) + "."


def load_params(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentParams:
    """Load, merge, override and validate a params file."""
    tree = read_yaml_tree(path)
    for override in overrides:
        tree = apply_override(tree, override)
    source = str(path) + (f" with overrides {list(overrides)}" if overrides else "")
    try:
        params = ExperimentParams.model_validate(tree)
    except ValidationError as err:
        raise ParamsError(_describe(err, source)) from None
    try:
        check_memory(params)
    except ValueError as err:
        raise ParamsError(f"{source}: {err}") from None
    return params


def pipeline_params_files(dvc_yaml: str | Path) -> list[Path]:
    """Every experiment params file a DVC pipeline's commands pass as `--params FILE`, with
    `${key.sub}` resolved from the files its `vars` lists (a `foreach` stage's `${item}` and
    unresolvable names are skipped); paths relative to the dvc.yaml's folder."""
    dvc_yaml = Path(dvc_yaml)
    root = dvc_yaml.parent
    spec = yaml.safe_load(dvc_yaml.read_text()) or {}
    names: dict[str, Any] = {}
    for entry in spec.get("vars", []):
        if isinstance(entry, str) and (root / entry).is_file():
            names = _deep_merge(names, yaml.safe_load((root / entry).read_text()) or {})

    def resolve(text: str) -> str | None:
        def value(match: re.Match) -> str:
            node: Any = names
            for part in match.group(1).split("."):
                if not isinstance(node, dict) or part not in node:
                    raise KeyError(match.group(1))
                node = node[part]
            return str(node)
        try:
            return re.sub(r"\$\{([^}]+)\}", value, text)
        except KeyError:
            return None

    files: list[Path] = []
    for stage in (spec.get("stages") or {}).values():
        body = stage.get("do", stage) if isinstance(stage, dict) else {}
        command = resolve(str(body.get("cmd", "")))
        for found in re.findall(r"--params\s+(\S+)", command or ""):
            path = root / found
            if path not in files:
                files.append(path)
    return files


_COMPARED = ("init_checkpoint", "max_rollouts", "max_seconds", "steps", "eval_per_family",
             "eval_samples", "eval_temperature", "eval_top_p")
"""`train` fields a comparison's arms must share: start, budget, and the evaluation protocol
(the paired test scores the same instances the same way)."""


def compare_arms(params: ExperimentParams, root: Path) -> dict[str, ExperimentParams]:
    """Each arm of `params.compare` with the comparison's shared start and budget applied: a
    params file's arm (under `root`), or the comparison's own params with the keys the arm sets
    over them (named `<name>-<arm>`). ValueError naming the arm and the fix if a file's arm reads
    other data or starts elsewhere (it belongs to another experiment), if two arms or the report
    share a folder, or if the arms would not start from the same checkpoint with the same budget
    and evaluation protocol (BroRL §4.2.1, App. D: the paired test of §4.2.2 scores the same
    instances the same way)."""
    c = params.compare
    shared = [f"train.{key}={value}" for key, value in (
        ("init_checkpoint", c.init_checkpoint), ("max_rollouts", c.budget_rollouts),
        ("max_seconds", c.budget_seconds)) if value is not None]
    arms: dict[str, ExperimentParams] = {}
    for name, arm in c.arms.items():
        if isinstance(arm, str):
            arms[name] = load_params(root / arm, shared)
            _check_belongs(params, name, arm, arms[name])
        else:
            arms[name] = _arm_over(params, name, arm, shared)
    _check_folders(params, arms)
    fixes = {"init_checkpoint": "set compare.init_checkpoint", "max_rollouts":
             "set compare.budget_rollouts", "max_seconds": "set compare.budget_seconds"}
    for key in _COMPARED:
        values = {name: getattr(p.train, key) for name, p in arms.items()}
        if len(set(values.values())) > 1:
            raise ValueError(f"compare: arms differ in train.{key} {values}; "
                             f"{fixes.get(key, 'give the arms equal values')}.")
    return arms


_OWN_ARMS = ("list this experiment's own arms in compare.arms: params files, or the keys each "
             "arm sets over this file (docs/real_model.md#your-own-checkpoint)")


def _arm_over(params: ExperimentParams, name: str, keys: dict[str, Any],
              shared: list[str]) -> ExperimentParams:
    """The comparison's params with an arm's `keys` merged over them and `shared` applied; a
    `train.checkpoint_dir` that was its `run_dir`'s default follows the arm's `run_dir`."""
    tree = params.model_dump(mode="json")
    train = tree["train"]
    if train["checkpoint_dir"] == own_checkpoints(train["run_dir"]):
        del train["checkpoint_dir"]
    tree = _deep_merge({**tree, "name": f"{params.name}-{name}"}, keys)
    for override in shared:
        tree = apply_override(tree, override)
    source = f"compare.arms.{name}"
    try:
        arm = ExperimentParams.model_validate(tree)
        check_memory(arm)
    except ValidationError as err:
        raise ParamsError(_describe(err, source)) from None
    except ValueError as err:
        raise ParamsError(f"{source}: {err}") from None
    return arm


def _check_belongs(params: ExperimentParams, name: str, path: str, arm: ExperimentParams) -> None:
    """A file's arm must train on the comparison's data from the comparison's start."""
    start = params.compare.init_checkpoint or params.train.init_checkpoint
    for key, ours, theirs in (("data.path", params.data.path, arm.data.path),
                              ("train.init_checkpoint", start, arm.train.init_checkpoint)):
        if ours != theirs:
            raise ValueError(f"compare.arms.{name} ({path}) has {key} {theirs}, not this "
                             f"comparison's {ours}: the arm belongs to another experiment; "
                             f"{_OWN_ARMS}.")


def _check_folders(params: ExperimentParams, arms: dict[str, ExperimentParams]) -> None:
    """Every arm writes a run folder of its own, and none of them is the report's."""
    owner: dict[str, str] = {params.compare.report_dir.rstrip("/"): "compare.report_dir"}
    for name, arm in arms.items():
        for field, folder in (("run_dir", arm.train.run_dir),
                              ("checkpoint_dir", arm.train.checkpoint_dir)):
            folder = folder.rstrip("/")
            if folder in owner:
                raise ValueError(f"compare.arms.{name}: train.{field} {folder} is also "
                                 f"{owner[folder]}'s; give each arm a train.run_dir of its own.")
            owner[folder] = f"arm {name}'s train.{field}"
