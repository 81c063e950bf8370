"""The hostile corpus (tests/hostile_programs.py) through the project's code verifier (issue 13).

All programs run in one batch through `CodeVerifier` (two sandboxes at a time, each beside an
honest rollout of the same problem, so every attack on a neighbour meets one), then each program
must have: reward 0; finished within its time limit; left no process (its session and process
group are empty), no file (the sandboxes' temporary root is empty, nothing named `brorl-pwned`
in the world-writable places) and no socket of its uid in this network namespace; and the test
process's own listener received nothing. Every honest neighbour must score 1.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from brorl.data.code import generated_problem
from brorl.verifiers import sandbox
from brorl.verifiers.code import CodeVerifier
from brorl.verifiers.sandbox import NOBODY, capabilities
from tests.hostile_programs import HONEST, PROGRAMS

TIMEOUT_S = 2.0
MARGIN_S = 3.0  # start-up, clean-up, a loaded 2-core machine, a memory bomb filling 512 MiB
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def _fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def _sessions_alive(ids: set[int]) -> list[int]:
    """Processes whose session or process group is one of `ids`."""
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp session ...
            if int(fields[2]) in ids or int(fields[3]) in ids:
                alive.append(int(entry))
    return alive


def _sockets_of(uid: int) -> list[str]:
    """Sockets in this network namespace owned by `uid` (the uid column of /proc/net/*)."""
    found = []
    for name in ("tcp", "tcp6", "udp", "udp6"):
        path = Path("/proc/net") / name
        if path.exists():
            for line in path.read_text().splitlines()[1:]:
                if line.split()[7] == str(uid):
                    found.append(f"{name}: {line.strip()}")
    return found


def _pwned() -> list[str]:
    return [f"{where}/{name}" for where in WORLD_WRITABLE if os.path.isdir(where)
            for name in os.listdir(where) if "brorl-pwned" in name]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Run the whole corpus once; yield what each run did."""
    problem = generated_problem("add", 3, "f")
    assert problem.tests == ("assert f(0) == 3", "assert f(3) == 6", "assert f(-4) == -1")
    root = tmp_path_factory.mktemp("sandboxes")
    runs: list[sandbox.SandboxResult] = []
    real_run_code = sandbox.run_code

    def recording(code, subjects, **kwargs):
        result = real_run_code(code, subjects, **kwargs)
        if subjects:  # not the once-per-process isolation probe
            runs.append(result)
        return result

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    names = sorted(PROGRAMS)
    responses = []
    for i, name in enumerate(names):
        responses.append(_fenced(PROGRAMS[name].replace("PORT", str(port))))
        responses.append(_fenced(f"{HONEST}\n# neighbour {i}"))  # distinct: judged, not reused
    pwned_before = _pwned()
    saved_tempdir, tempfile.tempdir = tempfile.tempdir, str(root)
    sandbox.run_code = recording
    try:
        start = time.monotonic()
        verdicts = CodeVerifier(workers=2, timeout_s=TIMEOUT_S).verify(
            [problem] * len(responses), responses)
        seconds = time.monotonic() - start
    finally:
        sandbox.run_code = real_run_code
        tempfile.tempdir = saved_tempdir
    try:
        listener.accept()
        reached = True
    except TimeoutError:
        reached = False
    finally:
        listener.close()
    time.sleep(0.2)  # let the kernel reap what the last kills left
    yield {
        "names": names, "verdicts": verdicts, "runs": runs, "seconds": seconds, "root": root,
        "reached": reached, "pwned": sorted(set(_pwned()) - set(pwned_before)),
        "alive": _sessions_alive({r.pid for r in runs}),
    }


def test_the_corpus_has_at_least_60_programs():
    assert len(PROGRAMS) >= 60


def test_no_hostile_program_earns_any_reward(corpus):
    hostile = corpus["verdicts"][0::2]
    rewarded = {n: v for n, v in zip(corpus["names"], hostile) if v.reward != 0.0}
    assert rewarded == {}


def test_every_honest_neighbour_keeps_its_full_score(corpus):
    honest = corpus["verdicts"][1::2]
    hurt = {n: v for n, v in zip(corpus["names"], honest) if v.reward != 1.0}
    assert hurt == {}


def test_every_run_ends_within_its_time_limit(corpus):
    slow = [round(r.elapsed_s, 2) for r in corpus["runs"] if r.elapsed_s > TIMEOUT_S + MARGIN_S]
    assert slow == []
    assert len(corpus["runs"]) == 2 * len(PROGRAMS)  # no syntax error: every program ran


def test_nothing_is_left_behind(corpus):
    assert corpus["alive"] == []  # no process of any run's session or group
    assert list(corpus["root"].iterdir()) == []  # every sandbox's directory removed
    assert corpus["pwned"] == []
    assert _sockets_of(NOBODY) == []
    assert not corpus["reached"]  # the test's own listener got no connection


@pytest.mark.skipif(not all(capabilities().values()), reason="isolation is partial here")
def test_every_run_was_fully_isolated(corpus):
    assert {r.isolation for r in corpus["runs"]} == {f"ns=1,fs=1,uid={NOBODY}"}
