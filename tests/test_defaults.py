"""A default lives in the params schema only: no function or class of brorl/ disagrees with it.

Every function, class (its constructor, dataclass fields included) and method defined in a module
of brorl/ (the schema itself, brorl/params/, aside) is read with `inspect`. A parameter with a
default whose name is a knob (a field of a params section, `KNOBS`) must carry that field's
schema default, and the same default as every other section's field of that name: a default
that agrees with one section only is a copy of the wrong knob.

Which defaults may stay:
- defaults of parameters whose names are no knob: the pure-math and plumbing arguments
  (`normaliser`, `k_values`, `first_prompt`, `cpu_threads`, a server's `grace_s`);
- a default equal to the schema's, on a helper that tests and benchmarks call outside a run
  (`VerifyConfig(workers=None, timeout_s=5.0)`, `split_problems(validation_fraction=0.1, ...)`).
  What a params section configures in a run takes its config record instead, built by one
  `from_params` (`LossConfig`, `EngineConfig`, `BaseConfig`, `EvalProtocol`, `DataConfig`,
  `VerifyConfig`);
- `ALLOWED`: a parameter named like a knob that is another quantity, each with why.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

import brorl
from brorl.params import ExperimentParams

REQUIRED = object()
"""The schema default of a field that has none."""
ALLOWED: Mapping[tuple[str, str], str] = {
    ("brorl.system.servers.wait_healthy", "timeout_s"): "seconds a server may take to start, not "
                                                 "verify.timeout_s (a verifier's per-item limit)",
    ("brorl.system.servers.running", "timeout_s"): "the same start-up wait, passed to wait_healthy",
    ("brorl.evaluation.stats.seed_test", "margin"): "a statistics primitive: NaN is no equivalence test; "
                                         "the study passes study.margin",
    ("brorl.train.run.Run.train", "max_steps"): "how many more steps this call may run (None: "
                                                "until a stop rule fires), not base.max_steps",
}
"""(qualified name, parameter) -> why its default is not a knob's."""


def _plain(value: Any) -> Any:
    """A default as the schema would hold it: tuples as lists, torch dtypes and paths by name."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _models(annotation: Any) -> Iterator[type[BaseModel]]:
    """The params models an annotation names (`StudyParams`, `dict[str, StudyArm]`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models(arg)


def schema_knobs(root: type[BaseModel] = ExperimentParams) -> dict[str, dict[str, Any]]:
    """Knob name -> {"section.name": schema default (REQUIRED when none)}, for every field of
    every model below `root` (its own top-level fields are sections, not knobs)."""
    knobs: dict[str, dict[str, Any]] = {}
    seen: set[type[BaseModel]] = set()
    stack = [m for f in root.model_fields.values() for m in _models(f.annotation)]
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            default = field.get_default(call_default_factory=True) if not field.is_required() \
                else REQUIRED
            knobs.setdefault(name, {})[f"{model.__name__}.{name}"] = _plain(default)
            stack.extend(_models(field.annotation))
    return knobs


KNOBS = schema_knobs()


def _defaults(obj: Any) -> Iterator[tuple[str, Any]]:
    """(parameter, default) of a callable, or of a class's constructor (dataclass fields with
    their defaults or factories' values)."""
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                yield f.name, f.default
            elif f.default_factory is not dataclasses.MISSING:
                yield f.name, f.default_factory()
        return
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # builtins, some Protocols
        return
    for p in signature.parameters.values():
        if p.default is not inspect.Parameter.empty:
            yield p.name, p.default


def definitions(module: types.ModuleType) -> Iterator[tuple[str, Any]]:
    """(qualified name, object) of every function, class and method the module defines."""

    def walk(owner: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        for name, obj in vars(owner).items():
            if name.startswith("__"):  # a class's constructor is read with the class
                continue
            if isinstance(obj, (classmethod, staticmethod)):
                obj = obj.__func__
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", None) != module.__name__:
                continue  # imported, not defined here
            yield f"{prefix}.{name}", obj
            if inspect.isclass(obj):
                yield from walk(obj, f"{prefix}.{name}")

    yield from walk(module, module.__name__)


def disagreements(modules: Iterable[types.ModuleType],
                  knobs: Mapping[str, Mapping[str, Any]] = KNOBS,
                  allowed: Mapping[tuple[str, str], str] = ALLOWED) -> list[str]:
    """`qualname(parameter=default): schema {section.name: default}` for every default that a
    same-named knob of the schema does not have, `allowed` aside."""
    found = []
    for module in modules:
        for qualname, obj in definitions(module):
            for name, default in _defaults(obj):
                schema = knobs.get(name)
                if schema is None or (qualname, name) in allowed:
                    continue
                if any(value is REQUIRED or value != _plain(default) for value in schema.values()):
                    found.append(f"{qualname}({name}={default!r}): schema {dict(schema)}")
    return found


def brorl_modules() -> list[types.ModuleType]:
    """Every module of brorl/ but the schema's."""
    names = sorted(m.name for m in pkgutil.walk_packages(brorl.__path__, "brorl."))
    return [importlib.import_module(n) for n in names
            if n != "brorl.params" and not n.startswith("brorl.params.")]


def test_no_function_or_class_of_brorl_has_a_default_that_differs_from_the_schema():
    modules = brorl_modules()
    assert {"brorl.algorithm.losses", "brorl.base.supervised", "brorl.engines.vllm"} <= \
        {m.__name__ for m in modules}
    assert disagreements(modules) == []


def test_every_allowed_default_still_exists_and_is_named_like_a_knob():
    """An entry of ALLOWED whose parameter was renamed or removed is stale: drop it."""
    defined = {(q, name) for m in brorl_modules() for q, obj in definitions(m)
               for name, _ in _defaults(obj)}
    for key in ALLOWED:
        assert key in defined and key[1] in KNOBS, key


PLANTED = '''
from dataclasses import dataclass, field


def loss(kl_coef=0.0, cap=5.0):  # the schema's kl_coef is 1e-4; `cap` is no knob
    pass


def agrees(kl_coef=1e-4, clip_eps_low=0.2, math_jsonl=()):
    pass


def temperature_of_one_section(temperature=1.2):  # generate's 1.2, not simulate's 1.0
    pass


def allowed(timeout_s=180.0):
    pass


@dataclass
class Warm:
    micro_batches: int = 1  # the schema's base.micro_batches is 3
    eval_splits: list = field(default_factory=lambda: ["test"])  # agrees, through a factory


class Engine:
    def __init__(self, seed=0, enforce_eager=True):  # generate.enforce_eager is False
        pass

    @classmethod
    def build(cls, dtype="bfloat16"):  # generate.dtype and train.dtype are float32
        pass

    @staticmethod
    def rollouts(rollouts_per_prompt=16):  # StudyArm.rollouts_per_prompt has no default
        pass
'''


def test_the_check_finds_each_planted_disagreement_and_only_those(tmp_path, monkeypatch):
    (tmp_path / "planted.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("planted")
    found = disagreements([module], allowed={("planted.allowed", "timeout_s"): "a test"})
    assert [line.split(":")[0] for line in found] == [
        "planted.loss(kl_coef=0.0)",
        "planted.temperature_of_one_section(temperature=1.2)",
        "planted.Warm(micro_batches=1)",
        "planted.Engine(enforce_eager=True)",
        "planted.Engine.build(dtype='bfloat16')",
        "planted.Engine.rollouts(rollouts_per_prompt=16)",
    ]
    assert "'UpdateParams.kl_coef': 0.0001" in found[0]
