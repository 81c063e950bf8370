"""The code sandbox's zygote (brorl/verifiers/zygote.py): every sandbox forked from the one warm
process starts clean, each verifier process has its own zygote, and verification is right from
any thread, beside torch's threads (issue 30, item 1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from brorl.families import verify_batch
from brorl.types import Problem
from brorl.verifiers import Verdict, VerifyConfig, zygote
from brorl.verifiers.sandbox import capabilities, run_code, run_tests
from tests.process_tree import descendants, settled, stat_fields

ROOT = Path(__file__).resolve().parents[1]
CAPS = capabilities()
TIMEOUT_S = 5.0
PATIENT_S = 60.0
"""A time limit no check reaches on a loaded machine: a `timeout` then means a hang (a lock
inherited by a fork beside other threads), not a slow spell."""

FIRST = """
import builtins, json, os, random, sys, types
MARKER = 'zygote-leak-marker-4451'
open('left_behind.txt', 'w').write(MARKER)
for place in ('/tmp', '/dev/shm'):
    try:
        open(place + '/left_behind.txt', 'w').write(MARKER)
    except OSError:
        pass
json.LEAK = builtins.LEAK = MARKER
os.environ['LEAK'] = MARKER
sys.modules['leaked_module'] = types.ModuleType('leaked_module')
sys.path.append('/leak')
sys.setrecursionlimit(77)
random.seed(4451)
import atexit
atexit.register(print, MARKER)
"""

SECOND = """
import builtins, gc, json, os, random, sys
marker = 'zygote-leak-' + 'marker-4451'
files = os.listdir('/')
modules = [hasattr(json, 'LEAK'), hasattr(builtins, 'LEAK'), 'leaked_module' in sys.modules]
environment = dict(os.environ)
path = '/leak' in sys.path
limit = sys.getrecursionlimit()

def holds_marker(v):
    return (type(v) is str and marker in v and v is not marker
            or type(v) is bytes and marker.encode() in v)

in_memory = [o for o in gc.get_objects() if type(o) in (list, tuple, dict)
             and any(holds_marker(v) for v in (o.values() if type(o) is dict else o))]
draw = random.random()
"""


def test_a_sandbox_starts_clean_after_another_candidate():
    forks_from = zygote.current()
    first = run_code(FIRST, ["random.random()"], timeout_s=TIMEOUT_S)
    assert first.status == "ok"
    subjects = ["files", "modules", "environment", "path", "limit", "len(in_memory)", "draw"]
    second = run_code(SECOND, subjects, timeout_s=TIMEOUT_S)
    assert zygote.current() is forks_from  # both forked from the same warm zygote
    assert second.status == "ok", second.stderr
    files, modules, environment, path, limit, in_memory, draw = second.values
    assert files == []  # the first one's file went with its tmpfs
    assert modules == [False, False, False]  # its module and built-in changes were its own
    assert environment in ({}, {"LC_CTYPE": "C.UTF-8"})  # empty but for PEP 538's locale
    assert (path, limit) == (False, 1000)  # Python's default recursion limit, not 77
    assert in_memory == 0  # no string of the first candidate's code anywhere in the second
    assert draw != first.values[0]  # random is reseeded in every fork
    assert first.stdout == ""  # and the atexit hook never ran: the sandbox leaves with _exit
    assert not [w for w in ("/tmp", "/dev/shm") if os.path.exists(f"{w}/left_behind.txt")]


def test_each_process_has_its_own_zygote_and_a_dead_one_is_replaced():
    ours = zygote.current()
    code = ("import os, sys\nfrom brorl.verifiers import zygote\nfrom brorl.verifiers.sandbox "
            "import run_tests\nassert run_tests('x = 1', ['assert x == 1']).passed == 1\n"
            "print(zygote.current().pid, zygote.current().directory, flush=True)\n"
            "os._exit(0)")  # no clean-up at exit
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    theirs, directory = out.stdout.split()
    assert int(theirs) != ours.pid and directory != ours.directory
    # its verifier is gone: the zygote reads the end of its socket, removes its folder, exits
    assert settled(lambda: (stat_fields(int(theirs)) or ["Z"])[0] != "Z", attempts=100) is False
    assert not os.path.exists(directory)
    ours.process.kill()
    ours.process.wait()
    assert run_tests("x = 1", ["assert x == 1"], timeout_s=TIMEOUT_S).passed == 1
    assert zygote.current() is not ours and zygote.current().alive()


def _mixed_batch() -> tuple[list[Problem], list[str], list[tuple[float, str]]]:
    import reasoning_gym

    problems, responses, expected = [], [], []
    for n in range(4):
        math = Problem(f"m{n}", "math", "generated", "?", answer=str(n))
        problems += [math, math]
        responses += [f"<answer>{n}</answer>", f"<answer>{n + 1}</answer>"]
        expected += [(1.0, "correct"), (0.0, "wrong")]
        code = Problem(f"c{n}", "code", "add", "?", tests=(f"assert f(1) == {n + 1}",
                                                           f"assert f(2) == {n + 2}"))
        problems += [code, code, code]
        responses += [f"```python\ndef f(x):\n    return x + {n}\n```",
                      f"```python\ndef f(x):\n    return {n + 1}\n```",
                      "```python\ndef f(x):\n    return None\n```"]
        expected += [(1.0, "correct"), (0.5, "partial"), (0.0, "wrong")]
    entry = reasoning_gym.create_dataset("chain_sum", size=1, seed=3)[0]
    gym = Problem("r", "reasoning", "chain_sum", entry["question"], answer=entry["answer"],
                  metadata=entry["metadata"])
    problems += [gym, gym]
    responses += [f"<answer>{entry['answer']}</answer>", "<answer>nope</answer>"]
    expected += [(1.0, "correct"), (0.0, "wrong")]
    return problems, responses, expected


def test_verify_batch_is_right_from_background_threads_beside_torch_threads():
    import torch

    problems, responses, expected = _mixed_batch()
    results: list[list[Verdict]] = []
    errors: list[BaseException] = []

    def verify_three_times():
        try:
            for _ in range(3):
                results.append(verify_batch(problems, responses,
                                            VerifyConfig(workers=2, timeout_s=PATIENT_S)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=verify_three_times) for _ in range(2)]
    torch.set_num_threads(2)
    a = torch.randn(256, 256)
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):  # the main thread decodes, say
        a = torch.tanh(a @ a / 256)
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(results) == 6
    wrong = [(i, got, want) for verdicts in results for i, (got, want) in
             enumerate(zip([(v.reward, v.reason) for v in verdicts], expected)) if got != want]
    assert wrong == []


@pytest.mark.skipif(not CAPS["namespaces"], reason="no PID namespace on this machine")
def test_a_run_killed_at_its_limit_takes_every_process_with_it():
    forks_from = zygote.current()
    result = run_code("import time\ntime.sleep(60)", [], timeout_s=1.0)
    assert result.status == "timeout"
    assert settled(lambda: descendants(forks_from.pid)) == []
