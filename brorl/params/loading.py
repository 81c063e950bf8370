"""Reading params files: `extends` chains, `key.sub=value` overrides, validation that names the fix.

A file may start with `extends: other.yaml` or a list of files (paths relative to it): those are
loaded first, in order, and this file's keys are deep-merged over them. Overrides apply last.
A validation error becomes one `ParamsError` naming the file, each bad key and its value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from brorl.params.experiment import ExperimentParams


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


def read_yaml_tree(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The merged mapping of `path` and the files it `extends`, before validation."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ParamsError(f"{path}: `extends` forms a cycle ({chain}); remove one link.")
    if not path.is_file():
        raise ParamsError(f"{path}: params file not found; pass a file under params/.")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from err
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
    value = yaml.safe_load(text)
    nested: Any = value
    for part in reversed(parts):
        nested = {part: nested}
    return _deep_merge(tree, nested)


def _describe(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid params:"]
    for e in err.errors():
        where = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key; check its spelling against brorl/params/.")
        elif isinstance(e.get("input"), dict):  # a rule over a section: its message names keys
            lines.append(f"  {where}: {e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  {where}: {e['msg']} (got {e.get('input')!r}).")
    return "\n".join(lines)


def load_params(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentParams:
    """Load, merge, override and validate a params file."""
    tree = read_yaml_tree(path)
    for override in overrides:
        tree = apply_override(tree, override)
    source = str(path) + (f" with overrides {list(overrides)}" if overrides else "")
    try:
        return ExperimentParams.model_validate(tree)
    except ValidationError as err:
        raise ParamsError(_describe(err, source)) from None
