"""The hostile corpus (tests/hostile_programs.py) through the project's code verifier (issue 13).

All programs run in one batch through `CodeVerifier` (two sandboxes at a time, each beside an
honest rollout of the same problem, so every attack on a neighbour meets one), then each program
must have: reward 0; been ended by its limits; left no process (the zygote that forks every
sandbox has no descendant left), no file (the zygote's directory, every sandbox's mount point,
is still empty; nothing named `brorl-pwned` in the world-writable places) and no socket of its
uid in this network namespace; and the test process's own listener received nothing. Every
honest neighbour must score 1. The positive control: every reward hack (`HACKS`) earns reward
from the weak judge it names (tests/weak_judges.py), so its 0 here is the real judge's doing.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from brorl.families.code import CodeVerifier, generated_problem
from brorl.verifiers import sandbox, zygote
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.sandbox import NOBODY, capabilities
from tests.hostile_programs import ESCAPES, HACKS, HONEST, PROBES, PROGRAMS
from tests.process_tree import descendants, settled
from tests.weak_judges import WEAK_JUDGES

TIMEOUT_S = 2.0
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
NEVER_END = {
    "cpu_burn": "timeout", "sleep_past_the_limit": "timeout", "slow_correct_answer": "timeout",
    "setsid_and_sleep": "timeout", "network_listen": "timeout", "result_channel_bomb": "timeout",
}
"""Programs that would run a minute or forever, and how their run must end."""
UNCONFINED_S = 30.0
"""Far below what those programs take on their own (60 s or forever), far above the limit."""


def _fenced(code: str) -> str:
    return f"```python\n{code}\n```"


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
def problem():
    problem = generated_problem("add", 3, "f")
    assert problem.tests == ("assert f(0) == 3", "assert f(3) == 6", "assert f(-4) == -1")
    return problem


@pytest.fixture(scope="module")
def corpus(problem):
    """Run the whole corpus once; yield what each run did."""
    runs: list[tuple[str, sandbox.SandboxResult]] = []
    real_run_code = sandbox.run_code

    def recording(code, subjects, **kwargs):
        result = real_run_code(code, subjects, **kwargs)
        if subjects:  # not the once-per-process isolation probe
            runs.append((code.strip(), result))
        return result

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    names = sorted(PROGRAMS)
    responses, codes = [], {}
    for i, name in enumerate(names):
        codes[PROGRAMS[name].replace("PORT", str(port)).strip()] = name
        responses.append(_fenced(PROGRAMS[name].replace("PORT", str(port))))
        responses.append(_fenced(f"{HONEST}\n# neighbour {i}"))  # distinct: judged, not reused
    pwned_before = _pwned()
    forks_from = zygote.current()
    sandbox.run_code = recording
    try:
        verdicts = CodeVerifier(VerifyConfig(workers=2, timeout_s=TIMEOUT_S)).verify(
            [problem] * len(responses), responses)
    finally:
        sandbox.run_code = real_run_code
    try:
        listener.accept()
        reached = True
    except TimeoutError:
        reached = False
    finally:
        listener.close()
    left = settled(lambda: descendants(forks_from.pid))
    yield {
        "names": names, "verdicts": verdicts, "runs": [result for _, result in runs],
        "hostile_runs": {codes[code]: result for code, result in runs if code in codes},
        "left": left,
        "reached": reached, "pwned": sorted(set(_pwned()) - set(pwned_before)),
        "zygote": forks_from, "same_zygote": zygote.current() is forks_from,
    }


def test_every_program_is_a_declared_hack_probe_or_escape_and_compiles():
    assert not set(HACKS) & set(PROBES)
    assert set(HACKS) | set(PROBES) | ESCAPES == set(PROGRAMS)
    assert set(HACKS.values()) <= set(WEAK_JUDGES)
    for name, code in PROGRAMS.items():
        compile(code, name, "exec")  # a syntax error would score 0 without running


def test_every_reward_hack_earns_reward_from_its_weak_judge(problem):
    failed = {name: judge for name, judge in HACKS.items()
              if not WEAK_JUDGES[judge](PROGRAMS[name], problem.tests) > 0}
    assert failed == {}


def test_no_hostile_program_earns_any_reward(corpus):
    hostile = corpus["verdicts"][0::2]
    rewarded = {n: v for n, v in zip(corpus["names"], hostile) if v.reward != 0.0}
    assert rewarded == {}
    assert len(corpus["runs"]) == 2 * len(PROGRAMS)  # every program ran in a sandbox


def test_every_honest_neighbour_keeps_its_full_score(corpus):
    honest = corpus["verdicts"][1::2]
    hurt = {n: v for n, v in zip(corpus["names"], honest) if v.reward != 1.0}
    assert hurt == {}


def test_every_run_is_ended_by_its_limits(corpus):
    ended = {n: (r.status, r.elapsed_s) for n, r in corpus["hostile_runs"].items()}
    assert set(ended) == set(PROGRAMS)
    assert {n: ended[n][0] for n in NEVER_END} == NEVER_END  # killed at the wall-clock limit
    assert {n: round(s, 1) for n, (_, s) in ended.items() if s >= UNCONFINED_S} == {}


def test_nothing_is_left_behind(corpus):
    assert corpus["same_zygote"]  # every run forked from the one zygote watched here
    assert corpus["left"] == []  # no process below it: every run's processes are gone
    assert os.listdir(corpus["zygote"].directory) == []  # every sandbox's files were its tmpfs
    assert corpus["pwned"] == []
    assert _sockets_of(NOBODY) == []
    assert not corpus["reached"]  # the test's own listener got no connection


@pytest.mark.skipif(not all(capabilities().values()), reason="isolation is partial here")
def test_every_run_was_fully_isolated(corpus):
    assert {r.isolation for r in corpus["runs"]} == {f"ns=1,fs=1,uid={NOBODY}"}
