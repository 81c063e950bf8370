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
                    kind = _type_name(field.annotation)
                    raise ValueError(f"{key} = {value!r} is a boolean, but {key} takes {kind}; "
                                     f"give a value of that type")
        return data


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
