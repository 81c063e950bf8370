"""The base of every params section: a misspelt key fails, a loaded value never changes, and a
number is a finite number (not `.inf`, `.nan` or a boolean)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def _accepts_bool(annotation: Any) -> bool:
    """Whether a field of this type takes True/False (bool, Any, a union or Literal with one)."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return any(_accepts_bool(a) for a in typing.get_args(annotation))
    return False


class Section(BaseModel):
    """A params section: `extra="forbid"` (an unknown key is an error), `frozen=True`, no
    infinite or NaN floats, and no boolean where the field is not one (YAML's `true` would
    otherwise pass as the number 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_non_bool(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if isinstance(value, bool) and field and not _accepts_bool(field.annotation):
                    kind = _bounded(_type_name(field.annotation), field.metadata)
                    raise ValueError(f"{key} = {value!r} is a boolean, but {key} takes {kind} "
                                     "(YAML reads on, off, yes and no as booleans); give one of "
                                     "those")
        return data


def _bounded(name: str, metadata: list[Any]) -> str:
    """`name` with the bounds of its constraints (annotated-types' Gt, Ge, Lt, Le): "a number
    >= 0 and < 1"."""
    bounds = [f"{sign} {getattr(m, attr)}" for m in metadata
              for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
              if getattr(m, attr, None) is not None]
    return " ".join([name, " and ".join(bounds)]) if bounds else name


_NAMES = {int: "an integer", float: "a number", str: "a string", type(None): "null"}


def _type_name(annotation: Any) -> str:
    """What a field takes, in words: `PositiveInt | Literal["auto"] | None` -> "an integer > 0,
    'auto' or null"."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_name(a) for a in typing.get_args(annotation)]
        return ", ".join(parts[:-1]) + f" or {parts[-1]}" if len(parts) > 1 else parts[0]
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        return _bounded(_type_name(base), metadata)
    return _NAMES.get(annotation) or getattr(annotation, "__name__", None) or \
        str(annotation).replace("typing.", "")
