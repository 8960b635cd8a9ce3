"""Whether a worker's process is gone, told at once where the web side or another worker shares its machine.

A worker killed at once (SIGKILL: the OOM killer, `kill -9`, a crash) beats no more, but its last heartbeat looks
fresh until it is late (ROUTE_BEAT_LATE_S): a turn routed to it meanwhile waits in its queue for seconds. Each
heartbeat therefore names its process: host name, PID namespace, PID and the process's start time. A reader on the
same host and in the same PID namespace (workers beside each other, the web beside them, as `make serve` and the
benchmark run them) asks the kernel whether that process still runs; elsewhere (containers with hosts of their own,
other machines) nothing is known: the heartbeat's age decides, or a turn left unclaimed (housekeeping.py).
"""

from __future__ import annotations

import os
import socket
from functools import cache
from pathlib import Path


@cache
def this_process() -> dict:
    """What names this process in its heartbeat (read once: none of it changes while it lives)."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid_namespace": _pid_namespace(), "pid": pid, "started": _started(pid)}


def process_gone(process: dict | None) -> bool:
    """True when the process a heartbeat names is known to have ended: it ran on this host in this PID namespace, and
    its PID is free, a zombie's (killed, not reaped yet) or another process's (reused). False where it cannot be
    told (another host or namespace, no /proc): a stopped process is then found by its heartbeat's age."""
    here = this_process()
    if not process or not here["pid_namespace"] or (process.get("host"), process.get("pid_namespace")) != (
            here["host"], here["pid_namespace"]):
        return False
    pid = int(process.get("pid", 0))
    try:
        os.kill(pid, 0)  # no signal sent: whether the PID names a process (another user's too: PermissionError)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    stat = _stat(pid)
    return stat is not None and (stat[0] == "Z" or stat[1] != process.get("started"))


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int] | None:
    """The process's state letter and start time (clock ticks after boot), from /proc/<pid>/stat; None where it cannot
    be read (a mount with hidepid, a process gone meanwhile)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # after the command's name, which may hold spaces and parentheses
    return fields[0], int(fields[19])


def _started(pid: int) -> int:
    stat = _stat(pid)
    return stat[1] if stat else 0
