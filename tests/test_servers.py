"""brorl.system.servers against real processes: Python's http.server, a command that dies, one that hangs.

A few seconds in all: http.server answers within about 0.2 s and stops on SIGTERM at once.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from brorl.system.servers import HOST, free_port, port_in_use, running

START_S = 60
"""How long a server that answers may take to start: a ceiling that only catches a hang (it
answers in about 0.2 s when the machine is idle, seconds when other jobs share the cores)."""


def _gone(pid: int) -> bool:
    """Whether no process is left in the process group `pid`."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_server_answers_inside_the_block_and_its_whole_group_is_gone_after(tmp_path: Path):
    (tmp_path / "index.html").write_text("hello")
    port = free_port()
    # A grandchild (`sleep`) in the same process group must be stopped with the server.
    command = ["sh", "-c", f"sleep 60 & exec {sys.executable} -m http.server --bind {HOST} "
               f"--directory {tmp_path} {port}"]
    url = f"http://{HOST}:{port}/"
    with running(command, url, log=tmp_path / "server.log", timeout_s=START_S,
                 grace_s=3) as process:
        assert port_in_use(port)
        with urllib.request.urlopen(url, timeout=START_S) as reply:
            assert reply.read() == b"hello"
        assert not _gone(process.pid)
    assert process.returncode is not None
    assert _gone(process.pid)
    assert not port_in_use(port)
    assert "GET / HTTP" in (tmp_path / "server.log").read_text()  # output went to the log


def test_a_command_that_exits_at_once_raises_with_its_exit_code_and_log_tail(tmp_path: Path):
    command = [sys.executable, "-c", "import sys; print('cannot bind'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"exited with code 3 (.|\n)*cannot bind"):
        with running(command, f"http://{HOST}:{free_port()}/health", log=tmp_path / "log",
                     timeout_s=START_S):
            pytest.fail("the block must not run")


def test_a_server_that_never_answers_raises_after_the_timeout_and_is_stopped(tmp_path: Path):
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    with pytest.raises(RuntimeError, match="did not answer within 1 s"):
        with running([sys.executable, "-c", code], f"http://{HOST}:{free_port()}/health",
                     timeout_s=1, grace_s=3):
            pytest.fail("the block must not run")
    assert _gone(int(pid_file.read_text()))


def test_a_port_already_in_use_is_refused_before_anything_starts(tmp_path: Path):
    with socket.socket() as busy:
        busy.bind((HOST, 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert port_in_use(port)
        marker = tmp_path / "started"
        with pytest.raises(RuntimeError, match=f"port {port} on {HOST} is already in use"):
            with running([sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                         f"http://{HOST}:{port}/health"):
                pass
    assert not marker.exists()
    assert not port_in_use(port)
