"""The code sandbox's limits and isolation, one property per test (issue 3, item 3; issue 13).

Each hostile candidate must get reward 0 within its time limit and leave the test process (the
verifier's parent) unharmed: an infinite loop, a fork bomb, a memory bomb, huge output, writing
outside its directory, reading environment variables, opening a socket and killing its parent,
each a candidate that would pass its trivial test (`assert alive`, the last line of the
candidate) only if the attack worked. The larger corpus of reward hacks is tests/test_hostile.py.
Isolation that needs root (the uid drop) or namespaces is asserted where `capabilities()` says it
holds (as root, on this project's machines, all of it), and skipped, with the reason, where it
does not.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from brorl.families import verify_batch
from brorl.types import Problem
from brorl.verifiers import VerifyConfig, zygote
from brorl.verifiers.sandbox import (
    MISSING,
    NOBODY,
    SandboxLimits,
    capabilities,
    run_code,
    run_tests,
)
from tests.process_tree import descendants, settled

CAPS = capabilities()
IS_ROOT = os.geteuid() == 0
TIMEOUT_S = 2.0
HANG_S = 60.0
"""A ceiling on a verdict's wall time that only catches a hang (the hostile candidates run
forever or 1000 s): far above any limit here, whatever else shares the cores. That a limit was
enforced is asserted by the verdict's reason and the processes it leaves, not by seconds."""


def reward_of(
    code: str, tests=("assert alive",), timeout_s: float = TIMEOUT_S
) -> tuple[float, str, float]:
    """(reward, reason, seconds) for `code` (then `alive = True`) as a fenced response, through
    verify_batch."""
    problem = Problem("hostile", "code", "hostile", "?", tests=tuple(tests))
    start = time.monotonic()
    response = f"```python\n{code}\nalive = True\n```"
    [verdict] = verify_batch([problem], [response], VerifyConfig(workers=1, timeout_s=timeout_s))
    return verdict.reward, verdict.reason, time.monotonic() - start


HOSTILE = {
    "infinite_loop": ("while True:\n    pass", "timeout"),
    "sleep_forever": ("import time\ntime.sleep(1000)", "timeout"),  # wall clock, not CPU
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", "runtime_error"),
    "thread_bomb": ("import threading\nwhile True:\n    threading.Thread(target=input).start()",
                    "runtime_error"),
    "memory_bomb": ("chunks = []\nwhile True:\n    chunks.append(bytearray(2**26))",
                    "runtime_error"),
    "huge_output": ("while True:\n    print('x' * 100000)", "runtime_error"),
    "huge_file": ("with open('big', 'w') as f:\n    while True:\n        f.write('x' * 100000)",
                  "runtime_error"),
    "exit_early_with_success": ("import sys\nsys.exit(0)", "runtime_error"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_candidate_gets_zero_within_its_limit(name):
    code, reason = HOSTILE[name]
    # filling 512 MiB takes over a second on a loaded machine: give it room to hit the limit
    timeout_s = 10.0 if name == "memory_bomb" else TIMEOUT_S
    forks_from = zygote.current()
    reward, got, seconds = reward_of(code, timeout_s=timeout_s)
    assert (reward, got) == (0.0, reason)  # "timeout": killed at its limit, not left to run
    if CAPS["namespaces"]:  # every process of the run (forks, threads) is gone with it
        assert settled(lambda: descendants(forks_from.pid)) == []
    assert seconds < HANG_S


def test_fork_and_threads_fail_inside_the_sandbox():
    code = (
        "import os, threading\n"
        "try:\n    os.fork()\n    forked = True\nexcept OSError:\n    forked = False\n"
        "try:\n    threading.Thread(target=print).start()\n    threaded = True\n"
        "except RuntimeError:\n    threaded = False\n"
    )
    result = run_tests(code, ("assert not forked", "assert not threaded"), timeout_s=TIMEOUT_S)
    assert (result.status, result.passed) == ("ok", 2)


def test_huge_output_is_truncated_to_the_output_limit():
    limits = SandboxLimits(output_bytes=1000)
    result = run_code("print('y' * 10**7)", [], timeout_s=TIMEOUT_S, limits=limits)
    assert result.status == "runtime_error"  # the write past RLIMIT_FSIZE fails
    assert len(result.stdout) <= 1000


def test_secrets_in_the_environment_do_not_leak(monkeypatch):
    monkeypatch.setenv("BRORL_TEST_SECRET", "s3cr3t-value")
    code = (
        "import os\nprint(sorted(os.environ))\n"
        "try:\n    print(open(f'/proc/{os.getppid()}/environ').read())\n"
        "except OSError as e:\n    print('blocked', type(e).__name__)\n"
    )
    result = run_code(code, [], timeout_s=TIMEOUT_S)
    assert result.status == "ok"
    assert "s3cr3t" not in result.stdout + result.stderr
    # empty but for LC_CTYPE, which Python itself sets under the C locale (PEP 538)
    assert result.stdout.splitlines()[0] in ("[]", "['LC_CTYPE']")
    if CAPS["jailed"]:  # no /proc in the jail
        assert "blocked FileNotFoundError" in result.stdout
    elif CAPS["uid_dropped"]:
        assert "blocked PermissionError" in result.stdout


OUTSIDE = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/etc"]
"""Places outside the candidate's directory: the world-writable ones and a system one (its
parent, `..`, is its own directory again: the jail's root)."""


@pytest.mark.skipif(not CAPS["jailed"], reason="needs the mount namespace and the jail")
@pytest.mark.parametrize("where", OUTSIDE)
def test_writing_outside_its_directory_gets_zero_and_leaves_nothing(where, tmp_path):
    name = f"brorl-pwned-{tmp_path.name}"
    reward, reason, seconds = reward_of(f"open({where!r} + '/{name}', 'w').write('x')")
    assert (reward, reason) == (0.0, "runtime_error")  # PermissionError at the top level
    assert seconds < HANG_S
    assert not [w for w in OUTSIDE if (Path(w) / name).exists()]


def test_its_own_directory_is_writable():
    code = "open('own_file', 'w').write('fine')\nimport os\nassert os.path.exists('own_file')"
    assert reward_of(code)[:2] == (1.0, "correct")


def test_reading_the_verifiers_environment_gets_zero(monkeypatch):
    monkeypatch.setenv("BRORL_TEST_SECRET", "s3cr3t-value")
    code = ("import os\n"
            "found = os.environ.get('BRORL_TEST_SECRET', '')\n"
            "for pid in (os.getppid(), os.getpgid(0), 1):\n"
            "    try:\n        found += open(f'/proc/{pid}/environ').read()\n"
            "    except OSError:\n        pass\n"
            "assert 's3cr3t' in found")
    reward, reason, seconds = reward_of(code)
    assert (reward, reason) == (0.0, "runtime_error")  # AssertionError: nothing found
    assert seconds < HANG_S


@pytest.mark.skipif(not CAPS["namespaces"], reason="no network namespace on this machine")
def test_opening_a_socket_to_the_host_gets_zero():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        server.settimeout(0.2)
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
        reward, reason, seconds = reward_of(code)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing reached the test process's listener
    assert (reward, reason) == (0.0, "runtime_error")  # no interface: the connect raises
    assert seconds < HANG_S


@pytest.mark.skipif(not CAPS["uid_dropped"], reason="without the uid drop a candidate can kill us")
@pytest.mark.parametrize(
    "code",
    ["import os\nos.kill(os.getppid(), 9)", "import os\nos.killpg(os.getpgid(os.getppid()), 9)"],
)
def test_candidate_cannot_kill_its_parent(code):
    reward, reason, _ = reward_of(code)
    assert (reward, reason) == (0.0, "runtime_error")  # PermissionError at the top level
    assert os.environ.get("PYTEST_CURRENT_TEST")  # we are alive and still the same process


@pytest.mark.skipif(not (CAPS["namespaces"] and CAPS["uid_dropped"]),
                    reason="needs the PID namespace and the uid drop")
@pytest.mark.parametrize("signal_all", [
    "os.kill(-1, 9)",  # every process the caller may signal but itself and its namespace's init
    "os.killpg(0, 9)",  # the caller's process group, which reaches past its PID namespace
])
def test_signalling_every_process_spares_a_sandbox_running_beside_it(signal_all):
    # As `nobody` every other sandbox (all run as `nobody`) may be signalled: here the sleeper.
    # kill(-1) in a namespace of its own finds no other process (ESRCH); a process group is
    # not confined by the PID namespace, so each sandbox leads a session of its own and
    # killpg(0) reaches only its own processes.
    forks_from = zygote.current()
    slept: list = []
    sleeper = threading.Thread(target=lambda: slept.append(run_code(
        "import time\ntime.sleep(60)", [], timeout_s=120)))
    sleeper.start()
    settled(lambda: not _running_as_nobody(forks_from.pid), attempts=300)
    asleep = _running_as_nobody(forks_from.pid)
    killer = run_code(f"import os\ntry:\n    {signal_all}\n    sent = 'sent'\n"
                      "except OSError as e:\n    sent = type(e).__name__\n", ["sent"],
                      timeout_s=TIMEOUT_S)
    survivors = _running_as_nobody(forks_from.pid)
    for pid in asleep:
        os.kill(pid, 9)  # done: end the sleeper rather than wait a minute
    sleeper.join()
    assert asleep and set(asleep) <= set(survivors)  # running before the kill and after it
    if signal_all.startswith("os.kill("):
        assert killer.values == ("ProcessLookupError",)
    assert slept[0].status == "runtime_error"  # ended by the test's own kill, not its limit


def _running_as_nobody(pid: int) -> list[int]:
    """The processes below `pid` that run as `nobody` and are not zombies."""
    found = []
    for child in descendants(pid):
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["Uid"].split()[0] == str(NOBODY) and fields["State"].split()[0] != "Z":
            found.append(child)
    return found


def test_uid_drop_holds_when_running_as_root():
    assert CAPS["uid_dropped"] == IS_ROOT


@pytest.mark.skipif(not IS_ROOT, reason="namespaces need root (CAP_SYS_ADMIN)")
def test_namespaces_and_jail_hold_as_root():
    assert CAPS["namespaces"] and CAPS["jailed"]


def test_subjects_come_back_as_plain_values_and_anything_else_as_missing():
    code = ("def f(x):\n    return x\nclass Mine(int):\n    pass\n"
            "def boom():\n    raise ValueError\n")
    subjects = ["f(3)", "f([1, (2.5, 'a')])", "f({'k': {1, 2}})", "f(None)", "f(b'xy')",
                "Mine(3)", "f(lambda: 1)", "boom()", "undefined_name"]
    result = run_code(code, subjects, timeout_s=TIMEOUT_S)
    assert result.status == "ok"
    plain = [3, [1, (2.5, "a")], {"k": {1, 2}}, None, b"xy"]
    assert list(result.values[:5]) == plain
    assert [type(v) for v in result.values[:5]] == [type(v) for v in plain]
    assert result.values[5:] == (MISSING,) * 4  # a subclass, a function, a raise, a NameError


def test_the_whole_file_system_is_a_capped_tmpfs():
    code = ("import os\nlisted = os.listdir('/')\nwritten = 0\ntry:\n"
            "    for i in range(100):\n"
            "        open(f'f{i}', 'w').write('x' * (2**20 - 1))\n        written += 1\n"
            "except OSError:\n    pass\n")
    result = run_code(code, ["listed", "written"], timeout_s=TIMEOUT_S,
                      limits=SandboxLimits(disk_bytes=4 * 2**20))
    if not CAPS["jailed"]:
        pytest.skip("needs the mount namespace and the jail")
    assert result.values == ([], 4)  # nothing else to see; 4 MiB of files, then ENOSPC


def test_partial_solution_gets_the_fraction_of_tests_passed():
    code = "def f(x):\n    return abs(x)"
    tests = ["assert f(3) == 3", "assert f(-3) == -3", "assert f(0) == 0"]  # 2 of 3 pass
    reward, reason, _ = reward_of(code, tests)
    assert (reward, reason) == (pytest.approx(2 / 3), "partial")


def test_the_verifier_process_is_unharmed_after_the_corpus():
    cwd = os.getcwd()
    for name, (code, _) in HOSTILE.items():
        if name != "memory_bomb":
            reward_of(code)
    assert os.getcwd() == cwd
    assert reward_of("def f():\n    return 1", ["assert f() == 1"])[:2] == (1.0, "correct")
