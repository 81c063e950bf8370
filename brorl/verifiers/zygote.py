"""The verifier's side of the code sandbox: one zygote per process, one socket per run.

Starting a fresh interpreter per sandbox cost most of a code verification (interpreter start-up,
imports, then waiting on it); the lock-down itself is a few system calls. So each verifier
process starts one zygote (`python -I -S -c HARNESS`, `brorl.verifiers.harness`) on first use:
a single-threaded, trusted process that has imported everything a candidate may use, and forks
one supervisor per run, which locks down and forks the sandbox. The set-up is paid once per
process; a run costs three forks of an already warm process.

A run (`Zygote.run`): the verifier sends the zygote three file descriptors and nothing else (one
end of a fresh socket pair, and memfds for the candidate's stdout and stderr); the payload goes
straight to the forked supervisor over that socket, so no candidate's code or nonce ever enters
the zygote and no sandbox inherits another's. The supervisor answers with the read end of the
run's result pipe, whose write end only the run's own processes hold: its end of file means the
whole run is over, and the pid of the run's first process. At the time limit, counted on a
`clock.RunClock` of that process and its child (the candidate): wall time less their waits for a
CPU, so that load never ends a run early, the verifier shuts its end of the socket down; the
supervisor then kills the run's PID namespace and exits. A run that a starved machine has not
ended by the wall-clock ceiling (`clock.CEILING_FACTOR` times the limit) is ended the same way
and reported as stalled. The candidate's stdout and stderr are
memfds (capped by its RLIMIT_FSIZE), read back from offset 0 after the run.

Processes: each process that verifies gets its own zygote (a fork of a verifier, such as a
worker of `workers.map_with_deadline`, starts its own), so two processes verifying at once share
nothing but the kernel. The verifier itself never forks for a run: the zygote is started by
`subprocess` (fork and exec, safe beside other threads: torch's, or a caller verifying from a
background thread), and every call here is a plain system call on descriptors of its own, safe
from any thread and from several threads at once. When the verifier process exits, the zygote
reads the end of its control socket and exits; every supervisor dies with it
(PR_SET_PDEATHSIG) and each sandbox with its supervisor.

Deliberately ignored: kernels without pidfds (before Linux 5.3: the supervisor waits on one) and
a pool of zygotes (one forks far faster than sandboxes run).
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass

from brorl.verifiers.clock import CEILING_FACTOR, CHECK_S, STALLED, RunClock, children
from brorl.verifiers.harness import HARNESS

START_TIMEOUT_S = 120.0
"""How long the zygote may take to start and import its modules (a loaded machine)."""

KILL_GRACE_S = 2.0
"""How long a run may take to end after its time-out before the verifier stops waiting for it."""


@dataclass(frozen=True)
class Finished:
    """What one run left: its result channel (the first `result_bytes`), the head of its stdout
    and stderr, its wall time, and how the verifier ended it: None (it ended by itself),
    `timeout` (the limit) or `stalled` (the wall-clock ceiling, the limit not reached)."""

    channel: bytes
    stdout: str
    stderr: str
    elapsed_s: float
    ended: str | None = None

    @property
    def timed_out(self) -> bool:
        """Whether the verifier ended it (at its limit or at the ceiling)."""
        return self.ended is not None


class Zygote:
    """A started zygote: `run` sends it one sandbox; `close` stops it (also when collected)."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="brorl-zygote-")  # 0700: each sandbox's mount
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", HARNESS, str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=self.directory, env={},
                pass_fds=(theirs.fileno(),), start_new_session=True,
            )
        except BaseException:
            ours.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        finally:
            theirs.close()
        self.control = ours
        self.owner = os.getpid()
        self._finalizer = weakref.finalize(self, _stop, ours, self.process, self.directory)
        ours.settimeout(START_TIMEOUT_S)
        try:
            ready = ours.recv(16)
        except OSError:
            ready = b""
        if ready != b"ready":
            self.close()
            raise RuntimeError(f"the code sandbox's zygote did not start ({sys.executable} -I -S "
                               "exited or hung): see its error above")
        ours.settimeout(None)

    @property
    def pid(self) -> int:
        """The zygote's process id (every sandbox's ancestor)."""
        return self.process.pid

    def alive(self) -> bool:
        """Whether the zygote runs and belongs to this process (not to the one it forked from)."""
        return self.process.poll() is None and self.owner == os.getpid()

    def close(self) -> None:
        """Stop the zygote (its running sandboxes die with it) and remove its directory."""
        self._finalizer()

    def run(self, payload: bytes, *, timeout_s: float, result_bytes: int,
            output_bytes: int) -> Finished:
        """One sandbox for `payload` (the harness's JSON), ended at `timeout_s` of its time
        (`clock.RunClock`) or at the wall-clock ceiling."""
        start = time.monotonic()
        ceiling = start + CEILING_FACTOR * timeout_s
        ours, theirs = socket.socketpair()
        out, err = os.memfd_create("brorl-stdout"), os.memfd_create("brorl-stderr")
        try:
            try:
                socket.send_fds(self.control, [b"R"], [theirs.fileno(), out, err])
            finally:
                theirs.close()
            try:
                ours.settimeout(ceiling - start)
                ours.sendall(len(payload).to_bytes(8, "big") + payload)
                ours.settimeout(max(ceiling - time.monotonic(), 0.0))
                message, fds, _, _ = socket.recv_fds(ours, 16, 1)
            except TimeoutError:  # not even started by then (a machine far too loaded)
                return Finished(b"", "", "", time.monotonic() - start, STALLED)
            if len(fds) != 1:
                raise RuntimeError("the sandbox's supervisor ended before starting the sandbox")
            first = int(message[1:]) if message[1:].isdigit() else None
            clock = RunClock(lambda: [] if first is None else [first, *children(first)])
            try:
                channel, ended = _collect(fds[0], ours, clock, timeout_s, ceiling, result_bytes)
            finally:
                os.close(fds[0])
            return Finished(channel, _head(out, output_bytes), _head(err, output_bytes),
                            time.monotonic() - start, ended)
        finally:
            _end(ours)
            os.close(out)
            os.close(err)


def _collect(fd: int, ours: socket.socket, clock: RunClock, timeout_s: float, ceiling: float,
             limit: int) -> tuple[bytes, str | None]:
    """Read the result pipe to its end of file (every process of the run gone), keeping the
    first `limit` bytes; once `clock` passes `timeout_s` (`timeout`), or the monotonic clock
    `ceiling` (`stalled`), end the run and wait `KILL_GRACE_S` more for it. Returns what was
    read and why the run was ended (None: it ended by itself)."""
    kept: list[bytes] = []
    size, ended, grace = 0, None, 0.0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        if ended is None:  # a run's time grows no faster than the wall clock
            timed_out = clock.over(timeout_s)
            left = 0.0 if timed_out else min(max(timeout_s - clock.elapsed(), CHECK_S),
                                             ceiling - time.monotonic())
        else:
            left = grace - time.monotonic()
        if left <= 0:
            if ended is not None:
                break  # not ended within the grace: stop waiting (its processes still die)
            _end(ours)
            ended = "timeout" if timed_out else STALLED
            grace = time.monotonic() + KILL_GRACE_S
            continue
        if not poller.poll(int(left * 1000) + 1):
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        if size < limit:
            kept.append(chunk[: limit - size])
            size += len(kept[-1])
    return b"".join(kept), ended


def _end(ours: socket.socket) -> None:
    """Shut our end of a run's socket down: its supervisor kills the run (a shutdown, not a
    close, so a copy of the descriptor in a forked process cannot keep the run alive)."""
    try:
        ours.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    ours.close()


def _head(fd: int, limit: int) -> str:
    return os.pread(fd, limit, 0).decode(errors="replace")


def _stop(control: socket.socket, process: subprocess.Popen, directory: str) -> None:
    try:
        control.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    control.close()
    try:
        process.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(directory, ignore_errors=True)


_lock = threading.Lock()
_zygotes: list[Zygote] = []
"""This process's zygote (at most one): a process-wide resource, like an open connection."""


def current() -> Zygote:
    """This process's zygote, started (or restarted, if it died) on first use."""
    with _lock:
        if _zygotes and _zygotes[0].alive():
            return _zygotes[0]
        if _zygotes:
            _zygotes.pop().close()
        _zygotes.append(Zygote())
        return _zygotes[0]


def run(payload: bytes, *, timeout_s: float, result_bytes: int, output_bytes: int) -> Finished:
    """`Zygote.run` on this process's zygote; a zygote found dead is restarted once."""
    zygote = current()
    try:
        return zygote.run(payload, timeout_s=timeout_s, result_bytes=result_bytes,
                          output_bytes=output_bytes)
    except (BrokenPipeError, ConnectionError):
        if zygote.alive():
            raise
        return current().run(payload, timeout_s=timeout_s, result_bytes=result_bytes,
                             output_bytes=output_bytes)


def _forget_after_fork() -> None:
    """In a forked child: a new lock, and the parent's zygote is the parent's alone."""
    global _lock
    _lock = threading.Lock()
    for zygote in _zygotes:
        zygote._finalizer.detach()
        zygote.control.close()
    _zygotes.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
