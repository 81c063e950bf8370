"""Run untrusted candidate code in a locked-down child process and bring back plain values.

`run_code(code, subjects)` starts one fresh interpreter (`python -I -S -c HARNESS`) that runs the
candidate's code once and evaluates each subject (a call such as `f(3)`, from a test) in a copy
of its globals; `run_tests(code, tests)` adds the judge: it splits each test into its subject and
the comparison (`brorl.verifiers.checks`), sends only the subjects, and compares the values that
come back here, so the expected values never enter the candidate's process and nothing the
candidate defines (`__eq__`, a patched `exec`, a fake report) takes part in the judgement.

Each run has:
- a fresh temporary directory as cwd, inside a folder only the verifier may write (both removed
  afterwards), and an empty environment;
- a new session and process group (`start_new_session`), killed whole at the wall-clock limit;
- stdout and stderr to files capped by RLIMIT_FSIZE, read back truncated to
  `SandboxLimits.output_bytes`;
- before any candidate code runs, the harness (trusted) moves into new network, mount and PID
  namespaces: no network interface; PID 1 of its own namespace, so it cannot see or signal any
  other process (the verifier, another rollout's sandbox) and everything left inside dies with
  it; a size-capped tmpfs (`disk_bytes`, `max_files`) over its directory as its whole file
  system (`chroot`: no data or test file to read, no disk to fill); then RLIMIT_CPU, RLIMIT_AS,
  RLIMIT_NOFILE, RLIMIT_FSIZE, the unprivileged `nobody` uid/gid with no supplementary groups,
  and RLIMIT_NPROC 0 (no fork, no threads).

Limits are set by the harness on itself rather than in a `preexec_fn`, because `preexec_fn` is
unsafe when the parent has threads (and `CodeVerifier` runs sandboxes from a thread pool).
Results come back on a private pipe (fd 3), read while the run goes on and capped at
`SandboxLimits.result_bytes`, as lines tagged with a random nonce: printing "passed" or exiting
early with status 0 earns nothing, and a forged line can only carry a value.

What holds depends on the OS; `capabilities()` reports it. As root (this project's machines) all
of it. As a non-root user the harness tries an unprivileged user namespace for the same
namespaces and jail (without the uid drop); where the kernel refuses, it carries on with the
resource limits only, and `CodeVerifier` warns once that the isolation is partial.
The harness imports the standard-library modules the code's import statements name before the
lock-down, from an allow-list of side-effect-free modules (`harness.PREIMPORTABLE`); other
imports fail (reward 0).

Deliberately ignored: seccomp (system calls stay open, but there is nothing left to reach).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from dataclasses import replace as dataclasses_replace
from typing import Literal

from brorl.verifiers.checks import decode, parse_tests
from brorl.verifiers.harness import HARNESS

NOBODY = 65534
"""The uid and gid the candidate runs as when the verifier is root."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run (the wall-clock limit is a `run_tests` argument)."""

    cpu_s: int = 5
    """RLIMIT_CPU, CPU seconds (ProRL's 5 s, spec paper.md §7.1)."""
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


TERM_GRACE_S = 1.0
"""How long the harness has to kill and reap its PID namespace at a time-out before SIGKILL."""

MISSING = object()
"""A subject's value when evaluating it raised, it was not plain data, or it never came back."""


@dataclass(frozen=True)
class SandboxResult:
    """What one run did: the subjects' decoded `values` (`MISSING` where none), `passed` of
    `total` tests (`run_tests`; 0 of 0 from `run_code`), and how it ended."""

    status: Literal["ok", "syntax_error", "runtime_error", "timeout"]
    """ok: every subject was evaluated (raising or not); runtime_error: the candidate's top level
    raised or the process died early; timeout: killed at the wall-clock limit."""
    values: tuple = field(repr=False)
    stdout: str
    stderr: str
    returncode: int
    elapsed_s: float
    isolation: str = ""
    """What the harness reported before running the candidate: `ns=<0|1>,fs=<0|1>,uid=<uid>`."""
    pid: int = 0
    """The harness's process id, also its process group's and session's."""
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
    root = tempfile.mkdtemp(prefix="brorl-sandbox-")  # 0700, the verifier's own
    workdir, logdir = os.path.join(root, "work"), os.path.join(root, "log")
    os.mkdir(workdir)
    os.mkdir(logdir)
    try:
        if os.geteuid() == 0:
            os.chown(workdir, NOBODY, NOBODY)  # `..` stays the verifier's: no writing beside it
        return _run(code, list(subjects), workdir, logdir, timeout_s, limits)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(code, subjects, workdir, logdir, timeout_s, limits) -> SandboxResult:
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    payload = json.dumps({"nonce": nonce, "fd": write_fd, "code": code, "subjects": subjects,
                          "limits": asdict(limits), "uid": NOBODY if os.geteuid() == 0 else None})
    start = time.monotonic()
    out_path, err_path = os.path.join(logdir, "out"), os.path.join(logdir, "err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", HARNESS], stdin=subprocess.PIPE, stdout=out,
            stderr=err, cwd=workdir, env={}, pass_fds=(write_fd,), start_new_session=True,
        )
    os.close(write_fd)
    received: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(read_fd, limits.result_bytes, received),
                              daemon=True)
    reader.start()
    timed_out = _feed_and_wait(proc, payload.encode(), timeout_s)
    reader.join(timeout=1.0)  # EOF once every process of the run is gone
    elapsed = time.monotonic() - start
    lines = b"".join(received).decode(errors="replace").splitlines()
    stdout = _head(out_path, limits.output_bytes)
    stderr = _head(err_path, limits.output_bytes)
    return _result(lines, nonce, len(subjects), timed_out, proc, stdout, stderr, elapsed)


def _drain(fd: int, limit: int, into: list[bytes]) -> None:
    """Read the result pipe to EOF, keeping the first `limit` bytes (the rest is discarded, so a
    writer never blocks on a full pipe)."""
    kept = 0
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            if kept < limit:
                into.append(chunk[: limit - kept])
                kept += len(into[-1])


def _feed_and_wait(proc: subprocess.Popen, payload: bytes, timeout_s: float) -> bool:
    """Send the payload, wait up to `timeout_s`; kill the process group on time-out."""
    try:
        proc.communicate(payload, timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return True
    except OSError:  # the child closed stdin early (e.g. died at start-up)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return True
        return False


def _kill_group(proc: subprocess.Popen) -> None:
    """End the run: SIGTERM to the harness, which kills its PID namespace and reaps it (nothing
    is left for another process to reap), then SIGKILL to the whole process group and the
    harness in case it did not end in time."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=TERM_GRACE_S)
        return
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for kill, target in ((os.killpg, proc.pid), (os.kill, proc.pid)):
        try:
            kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _head(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode(errors="replace")


def _result(lines, nonce, total, timed_out, proc, stdout, stderr, elapsed) -> SandboxResult:
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
    if timed_out:
        status = "timeout"
    elif "SYNTAX" in events:
        status = "syntax_error"
    elif "CANDIDATE_RAISED" in events or "DONE" not in events:
        status = "runtime_error"
    else:
        status = "ok"
    isolation = next((tag[1].strip() for tag in tagged if tag[0] == "ISO" and len(tag) == 2), "")
    return SandboxResult(status, tuple(values), stdout, stderr, proc.returncode, elapsed,
                         isolation, proc.pid)


def capabilities() -> dict[str, bool]:
    """What isolation holds here, as the harness reports it: the namespaces (network, mount,
    PID), the jail (a capped tmpfs as the whole file system) and the uid drop."""
    iso = dict(kv.split("=") for kv in run_code("", []).isolation.split(",") if "=" in kv)
    return {
        "namespaces": iso.get("ns") == "1",
        "jailed": iso.get("fs") == "1",
        "uid_dropped": iso.get("uid") == str(NOBODY),
    }
