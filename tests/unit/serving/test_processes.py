"""A heartbeat's process, told gone or not by a reader on its host: real child processes, killed, reaped or not."""

import os
import signal
import subprocess
import sys
import time

import pytest

from inference.serving.processes import process_gone, this_process

pytestmark = pytest.mark.skipif(not this_process()["pid_namespace"], reason="no /proc here: nothing is told")


@pytest.fixture
def child():
    """A process of this host's, named as its heartbeat would name it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc, {**this_process(), "pid": proc.pid, "started": _started(proc.pid)}
    proc.kill()
    proc.wait()


def _fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()


def _started(pid: int) -> int:
    return int(_fields(pid)[19])


def _state(pid: int) -> str:
    return _fields(pid)[0]


def test_a_running_process_is_not_gone(child):
    _, process = child
    assert not process_gone(process)
    assert not process_gone(this_process())


def test_a_killed_process_is_gone_before_and_after_it_is_reaped(child):
    proc, process = child
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while _state(proc.pid) != "Z" and time.time() < deadline:
        time.sleep(0.01)  # killed, its parent has not waited for it yet: a zombie
    assert _state(proc.pid) == "Z"
    assert process_gone(process)
    proc.wait()
    assert process_gone(process)  # its PID free


@pytest.mark.parametrize(("changed", "gone"), [
    ({"started": -1}, True),  # the PID now names another process (reused)
    ({"host": "elsewhere"}, False),  # another host's process: only its heartbeat's age tells
    ({"pid_namespace": "pid:[1]"}, False),  # another container's, sharing the host name: the same
    ({"host": None, "pid_namespace": None, "pid": None}, False),  # a heartbeat of a version that named no process
])
def test_only_a_process_of_this_host_and_namespace_is_judged(child, changed, gone):
    _, process = child
    assert process_gone({**process, **changed}) is gone


def test_a_heartbeat_without_a_process_is_not_judged():
    assert not process_gone(None) and not process_gone({})
