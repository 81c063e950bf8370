"""Files written whole or not at all: a temporary sibling, flushed to disk, then `os.replace`.

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
