"""Files written whole or not at all: a temporary sibling, flushed to disk, then `os.replace`;
and paths recorded relative to the checkout (`checkout_relative`).

A reader (a resumed run, DVC, the next stage) sees the old file or the new one, never half of
one. Torch-free, so light modules (the study's plan, the tasks' metrics files, preflight's
records) write through it without loading the trainer.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary sibling and `os.replace` (mode 0644)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; these are ordinary result files
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def checkout_relative(path: str | Path, root: str | Path) -> str:
    """`path` as a record inside an output names it: relative to the checkout `root` (POSIX
    separators) when it lies there, so two clones write the same bytes; a path outside `root`
    as it is. A relative `path` is taken as relative to `root` already."""
    path = Path(path)
    if not path.is_absolute():
        return path.as_posix()
    try:
        return path.resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return str(path)
