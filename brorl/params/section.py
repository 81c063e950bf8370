"""The base of every params section: a misspelt key fails, a loaded value never changes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A params section: `extra="forbid"` (an unknown key is an error), `frozen=True`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
