"""Verification infrastructure that the problem families share.

- `verdict`: `Verdict`, the `Verifier` Protocol, `verdict_for_score`, `error_verdict`;
- `config`: `VerifyConfig` (the params' `verify` section) and the sandbox's `SandboxLimits`;
- `workers`: forked workers with a time limit per item (math, reasoning);
- `sandbox`, `zygote`, `harness`, `checks`, `clock`: the code sandbox and its judge.

Each family's verifier lives in its module (`brorl.families.math`, `.code`, `.reasoning`,
`.instruction`), and `brorl.families.verify_batch` dispatches a batch to them: this package names
no family.
"""

from __future__ import annotations

from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.verdict import (
    REASONS,
    Verdict,
    Verifier,
    error_verdict,
    verdict_for_score,
)

__all__ = ["REASONS", "Verdict", "Verifier", "VerifyConfig", "error_verdict",
           "verdict_for_score"]
