"""`VerifyConfig`: how responses are judged, the params' `verify` section as one record.

Every judgement of a run reads it: the rewards of training (`Trainer`), every evaluation
(`EvalProtocol.score`, the base warm-up's checks and held-out test, the study's pool), so a
`verify.timeout_s` or sandbox limit set in a params file holds for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from brorl.verifiers.sandbox import SandboxLimits

if TYPE_CHECKING:
    from brorl.params import VerifyParams


@dataclass(frozen=True)
class VerifyConfig:
    """The verifiers' settings; the defaults are the schema's (`verify_batch` outside a run)."""

    workers: int | None = None
    """verify.workers: parallel verifier processes (code: sandboxes) per family; None: every
    available core."""
    timeout_s: float = 5.0
    """verify.timeout_s: wall-clock limit per item (math and reasoning: one check; code: all
    tests of one response; ProRL's 5 s, spec §7.1)."""
    limits: SandboxLimits = SandboxLimits()
    """The code sandbox's resource limits (verify.cpu_s, memory_mib, open_files, file_bytes,
    output_bytes; the rest `SandboxLimits`' own)."""

    @classmethod
    def from_params(cls, verify: VerifyParams) -> VerifyConfig:
        limits = SandboxLimits(cpu_s=verify.cpu_s, memory_bytes=verify.memory_mib * 2**20,
                               open_files=verify.open_files, file_bytes=verify.file_bytes,
                               output_bytes=verify.output_bytes)
        return cls(workers=verify.workers, timeout_s=verify.timeout_s, limits=limits)
