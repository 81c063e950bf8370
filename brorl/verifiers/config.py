"""`VerifyConfig`: how responses are judged, the params' `verify` section as one record, with
the code sandbox's `SandboxLimits` (settings only: the sandbox itself is `sandbox.py`, loaded when
code is judged).

Every judgement of a run reads it: the rewards of training (`Trainer`), every evaluation
(`EvalProtocol.score`, the base warm-up's checks and held-out test, the study's pool), so a
`verify.timeout_s` or sandbox limit set in a params file holds for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brorl.params.rl import VerifyParams


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run (the wall-clock limit is a `run_tests` argument)."""

    cpu_s: int = 5
    """RLIMIT_CPU, CPU seconds (ProRL's 5 s, ProRL (arXiv 2505.24864) App. E)."""
    memory_bytes: int = 512 * 2**20
    """RLIMIT_AS, bytes of address space (the interpreter itself needs about 30 MiB)."""
    open_files: int = 32
    """RLIMIT_NOFILE, open file descriptors."""
    file_bytes: int = 2**20
    """RLIMIT_FSIZE, the largest file (stdout and stderr included) the candidate may write."""
    output_bytes: int = 16 * 2**10
    """How much of stdout and of stderr is read back."""
    disk_bytes: int = 8 * 2**20
    """Size of the tmpfs that is the candidate's whole file system (all its files together)."""
    max_files: int = 256
    """Inodes of that tmpfs: how many files and directories the candidate may create."""
    result_bytes: int = 2**20
    """How much of the result channel is read: values past it count as missing (test failed)."""


@dataclass(frozen=True)
class VerifyConfig:
    """The verifiers' settings; the defaults are the schema's (`verify_batch` outside a run)."""

    workers: int | None = None
    """verify.workers: parallel verifier processes (code: sandboxes) per family; None: every
    available core."""
    timeout_s: float = 5.0
    """verify.timeout_s: time limit per item (math and reasoning: one check; code: all tests of
    one response; ProRL's 5 s, ProRL (arXiv 2505.24864) App. E), counted as wall time less the
    time the item's processes waited for a CPU (`clock.RunClock`: load never times a check out);
    a wall-clock ceiling of `clock.CEILING_FACTOR` times it ends a starved one as `stalled`."""
    limits: SandboxLimits = SandboxLimits()
    """The code sandbox's resource limits (verify.cpu_s, memory_mib, open_files, file_bytes,
    output_bytes; the rest `SandboxLimits`' own)."""

    @classmethod
    def from_params(cls, verify: VerifyParams) -> VerifyConfig:
        limits = SandboxLimits(cpu_s=verify.cpu_s, memory_bytes=verify.memory_mib * 2**20,
                               open_files=verify.open_files, file_bytes=verify.file_bytes,
                               output_bytes=verify.output_bytes)
        return cls(workers=verify.workers, timeout_s=verify.timeout_s, limits=limits)
