"""Run untrusted candidate code in a locked-down process and bring back plain values.

`run_code(code, subjects)` runs the candidate's code once in a fresh sandbox and evaluates each
subject (a call such as `f(3)`, from a test) in a copy of its globals; `run_tests(code, tests)`
adds the judge: it splits each test into its subject and the comparison
(`brorl.verifiers.checks`), sends only the subjects, and compares the values that come back here,
so the expected values never enter the candidate's process and nothing the candidate defines
(`__eq__`, a patched `exec`, a fake report) takes part in the judgement.

Each sandbox is forked from this process's zygote (`brorl.verifiers.zygote`, started once per
process: the interpreter and its imports are paid once, not per run) and, before any candidate
code runs, locks down (`brorl.verifiers.harness`): new network, mount and PID namespaces (no
network interface; PID 1 of its own namespace, so it cannot see or signal any other process,
the verifier or another rollout's sandbox, and everything left inside dies with it); a
size-capped tmpfs (`disk_bytes`, `max_files`) as its whole file system (`chroot`: no data or
test file to read, no disk to fill); an empty environment; then RLIMIT_CPU, RLIMIT_AS,
RLIMIT_NOFILE, RLIMIT_FSIZE, the unprivileged `nobody` uid/gid with no supplementary groups, and
RLIMIT_NPROC 0 (no fork, no threads). Nothing of an earlier run reaches a later one: the zygote
never holds a candidate's code, and each sandbox is a fresh fork of it with fresh namespaces and
a fresh tmpfs. At the time limit (`timeout_s` of wall time less the run's waits for a CPU:
`brorl.verifiers.clock`, so that a loaded machine never fails a correct program) the run's PID
namespace is killed whole; a run returns only once every one of its processes has ended.

stdout and stderr go to memfds capped by RLIMIT_FSIZE and are read back truncated to
`SandboxLimits.output_bytes`. Results come back on a private pipe (fd 3), read while the run
goes on and capped at `SandboxLimits.result_bytes`, as lines tagged with a random nonce:
printing "passed" or exiting early with status 0 earns nothing, and a forged line can only carry
a value.

What holds depends on the OS; `capabilities()` reports it. As root (this project's machines) all
of it. As a non-root user the harness tries an unprivileged user namespace for the same
namespaces and jail (without the uid drop); where the kernel refuses, it carries on with the
resource limits only, and `CodeVerifier` warns once that the isolation is partial.
The candidate may use the standard-library modules of an allow-list of side-effect-free modules
(`harness.PREIMPORTABLE`), which the zygote imports; other imports fail (reward 0).

Deliberately ignored: seccomp (system calls stay open, but there is nothing left to reach).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from dataclasses import replace as dataclasses_replace
from typing import Literal

from brorl.verifiers import zygote
from brorl.verifiers.checks import decode, parse_tests
from brorl.verifiers.clock import STALLED
from brorl.verifiers.config import SandboxLimits

NOBODY = 65534
"""The uid and gid the candidate runs as when the verifier is root."""


MISSING = object()
"""A subject's value when evaluating it raised, it was not plain data, or it never came back."""


@dataclass(frozen=True)
class SandboxResult:
    """What one run did: the subjects' decoded `values` (`MISSING` where none), `passed` of
    `total` tests (`run_tests`; 0 of 0 from `run_code`), and how it ended."""

    status: Literal["ok", "syntax_error", "runtime_error", "timeout", "stalled"]
    """ok: every subject was evaluated (raising or not); runtime_error: the candidate's top level
    raised or the process died early; timeout: ended at its time limit (`timeout_s` of
    `clock.RunClock`, wall time less waits for a CPU) or killed by its CPU limit; stalled: ended
    at the wall-clock ceiling before that (a machine too loaded: `brorl.verifiers.clock`)."""
    values: tuple = field(repr=False)
    stdout: str
    stderr: str
    elapsed_s: float
    isolation: str = ""
    """What the harness reported before running the candidate: `ns=<0|1>,fs=<0|1>,uid=<uid>`."""
    passed: int = 0
    total: int = 0


def run_tests(
    code: str, tests: tuple[str, ...] | list[str], *, timeout_s: float = 5.0,
    limits: SandboxLimits = SandboxLimits(),
) -> SandboxResult:
    """Run `code` once, evaluate each test's subject beside it, and judge each value here.

    A test passes when its subject's value satisfies its comparison (`checks.Check.passes`).
    `timeout_s` bounds the whole run. A test of a form the judge cannot check raises ValueError.
    """
    checks = parse_tests(tuple(tests))
    result = run_code(code, [c.subject for c in checks], timeout_s=timeout_s, limits=limits)
    passed = sum(1 for check, value in zip(checks, result.values)
                 if value is not MISSING and check.passes(value))
    return dataclasses_replace(result, passed=passed, total=len(checks))


def run_code(
    code: str, subjects: list[str], *, timeout_s: float = 5.0,
    limits: SandboxLimits = SandboxLimits(),
) -> SandboxResult:
    """Run `code` once, then evaluate each subject expression in a copy of its globals."""
    nonce = secrets.token_hex(16)
    payload = json.dumps({"nonce": nonce, "code": code, "subjects": list(subjects),
                          "limits": asdict(limits), "uid": NOBODY if os.geteuid() == 0 else None})
    run = zygote.run(payload.encode(), timeout_s=timeout_s, result_bytes=limits.result_bytes,
                     output_bytes=limits.output_bytes)
    lines = run.channel.decode(errors="replace").splitlines()
    return _result(lines, nonce, len(subjects), run)


def _result(lines: list[str], nonce: str, total: int, run: zygote.Finished) -> SandboxResult:
    """Parse the harness's nonce-tagged lines into a result; values are decoded, never run."""
    tagged = [line.split(" ", 2)[1:] for line in lines if line.startswith(nonce + " ")]
    values = [MISSING] * total
    for tag in tagged:
        if len(tag) == 2 and tag[0][:1] == "V" and tag[0][1:].isdigit():
            i = int(tag[0][1:])
            if i < total and values[i] is MISSING and tag[1] not in ("!", "?"):
                try:
                    values[i] = decode(tag[1])
                except ValueError:
                    pass
    events = {tag[0] for tag in tagged}
    if run.ended == STALLED:
        status = STALLED
    elif run.timed_out or "CPU_LIMIT" in events:
        status = "timeout"
    elif "SYNTAX" in events:
        status = "syntax_error"
    elif "CANDIDATE_RAISED" in events or "DONE" not in events:
        status = "runtime_error"
    else:
        status = "ok"
    isolation = next((tag[1].strip() for tag in tagged if tag[0] == "ISO" and len(tag) == 2), "")
    return SandboxResult(status, tuple(values), run.stdout, run.stderr, run.elapsed_s, isolation)


def capabilities() -> dict[str, bool]:
    """What isolation holds here, as the harness reports it: the namespaces (network, mount,
    PID), the jail (a capped tmpfs as the whole file system) and the uid drop."""
    iso = dict(kv.split("=") for kv in run_code("", []).isolation.split(",") if "=" in kv)
    return {
        "namespaces": iso.get("ns") == "1",
        "jailed": iso.get("fs") == "1",
        "uid_dropped": iso.get("uid") == str(NOBODY),
    }
