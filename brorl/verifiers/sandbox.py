"""Run untrusted candidate code against test snippets in a locked-down child process.

Each run is one fresh interpreter (`python -I -S -c HARNESS`) with:
- a fresh temporary directory as cwd, inside a folder only the verifier may write (both removed
  afterwards), and an empty environment;
- a new session and process group (`start_new_session`), killed whole at the wall-clock limit;
- stdout and stderr to files capped by RLIMIT_FSIZE (a process writing past it dies of
  SIGXFSZ), read back truncated to `SandboxLimits.output_bytes`;
- before any candidate code runs, the harness (trusted, still root) moves into a new network
  namespace (`unshare(CLONE_NEWNET)`: no interfaces, so no network) and a new mount namespace
  with an empty root-owned tmpfs over `/tmp`, `/var/tmp`, `/dev/shm` and `/run/lock` (the
  world-writable places: nothing written there outlives the run or reaches other processes),
  sets RLIMIT_CPU, RLIMIT_AS,
  RLIMIT_NOFILE and RLIMIT_FSIZE, drops to the unprivileged `nobody` uid/gid with no
  supplementary groups, then sets RLIMIT_NPROC to 0 (so fork and threads fail) and closes stdin.

Limits are set by the harness on itself rather than in a `preexec_fn`, because `preexec_fn` is
unsafe when the parent has threads (and `CodeVerifier` runs sandboxes from a thread pool).
Results come back on a private pipe (fd 3) as lines tagged with a random nonce, so printing
"passed" or exiting early with status 0 earns nothing.

What holds depends on the OS; `capabilities()` reports it. Measured on the development machine
(root in a container, Linux): the network namespace and the uid drop both hold. As `nobody` the
candidate cannot signal the verifier (EPERM), cannot read `/proc/<ppid>/environ`, cannot write
anywhere but its own directory, and cannot fork. Run as a non-root user, the uid drop and the
network and mount namespaces are skipped (the harness carries on):
RLIMIT_NPROC still stops forks, but the candidate then runs as the verifier's own user and could
signal it. The pyenv stdlib under `/root` is unreadable to `nobody`, so before dropping the
harness imports the modules the code's import statements name, from an allow-list of common
side-effect-free stdlib modules (`harness.PREIMPORTABLE`); other imports fail (reward 0).
A candidate as `nobody` can still signal other sandboxes running as `nobody` (`kill(-1)`).

Deliberately ignored: a chroot (the candidate can still read world-readable files), seccomp,
and hostile code that reads the nonce out of the harness's own frames (deliberate reward
hacking, not an accident).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Literal

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


@dataclass(frozen=True)
class SandboxResult:
    """What one run did: `passed` of `total` tests, and how it ended."""

    status: Literal["ok", "syntax_error", "runtime_error", "timeout"]
    """ok: every test ran (pass or fail); runtime_error: the candidate's top level raised or the
    process died early; timeout: killed at the wall-clock limit."""
    passed: int
    total: int
    stdout: str
    stderr: str
    returncode: int
    elapsed_s: float
    isolation: str = ""
    """What the harness reported before running the candidate: `netns=<0|1>,fs=<0|1>,uid=<uid>`."""


def run_tests(
    code: str, tests: tuple[str, ...] | list[str], *, timeout_s: float = 5.0,
    limits: SandboxLimits = SandboxLimits(),
) -> SandboxResult:
    """Run `code` once, then each test snippet in a copy of its globals; count passing tests.

    A test passes when it runs to the end without raising. `timeout_s` bounds the whole run.
    """
    root = tempfile.mkdtemp(prefix="brorl-sandbox-")  # 0700, the verifier's own
    workdir, logdir = os.path.join(root, "work"), os.path.join(root, "log")
    os.mkdir(workdir)
    os.mkdir(logdir)
    try:
        if os.geteuid() == 0:
            os.chown(workdir, NOBODY, NOBODY)  # `..` stays the verifier's: no writing beside it
        return _run(code, list(tests), workdir, logdir, timeout_s, limits)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(code, tests, workdir, logdir, timeout_s, limits) -> SandboxResult:
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    payload = json.dumps({"nonce": nonce, "fd": write_fd, "code": code, "tests": tests,
                          "limits": asdict(limits), "uid": NOBODY if os.geteuid() == 0 else None})
    start = time.monotonic()
    out_path, err_path = os.path.join(logdir, "out"), os.path.join(logdir, "err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", HARNESS], stdin=subprocess.PIPE, stdout=out,
            stderr=err, cwd=workdir, env={}, pass_fds=(write_fd,), start_new_session=True,
        )
    os.close(write_fd)
    timed_out = _feed_and_wait(proc, payload.encode(), timeout_s)
    elapsed = time.monotonic() - start
    with os.fdopen(read_fd, "rb") as results:
        lines = results.read(2**20).decode(errors="replace").splitlines()
    stdout = _head(out_path, limits.output_bytes)
    stderr = _head(err_path, limits.output_bytes)
    return _result(lines, nonce, len(tests), timed_out, proc.returncode, stdout, stderr, elapsed)


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
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()


def _head(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode(errors="replace")


def _result(lines, nonce, total, timed_out, returncode, stdout, stderr, elapsed) -> SandboxResult:
    """Parse the harness's nonce-tagged lines into a result."""
    tagged = [line.split(" ", 2)[1:] for line in lines if line.startswith(nonce + " ")]
    passed = sum(1 for tag in tagged if len(tag) == 2 and tag[0].startswith("T") and tag[1] == "1")
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
    return SandboxResult(
        status, min(passed, total), total, stdout, stderr, returncode, elapsed, isolation
    )


def capabilities() -> dict[str, bool]:
    """What isolation holds here, as the harness reports it: network and mount namespaces and
    the uid drop."""
    iso = dict(kv.split("=") for kv in run_tests("", ()).isolation.split(",") if "=" in kv)
    return {
        "network_isolated": iso.get("netns") == "1",
        "filesystem_isolated": iso.get("fs") == "1",
        "uid_dropped": iso.get("uid") == str(NOBODY),
    }
