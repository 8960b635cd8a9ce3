"""Grammars checked before they are accepted (engines/grammar/compilers.py says why), without one stalling the others.

A grammar's compile time has no useful bound: nested repetitions such as `(a{1,300}){1,300}` grow without one
(docs/api.md), and the library cannot be interrupted. So the web side compiles in a few checker processes of
its own (`python -m inference.engines.grammar.checks FD PID`), each with its own small pipeline used by one
grammar at a time (the library does not share a pipeline between threads). A checker still compiling when the budget
runs out (in CPU time, or a quarter as much again in wall time) is killed and replaced, and the grammar refused. A
requester's checks run one at a time: a second waits at most a budget, and after one ran out the budget the next
is told to retry until the replacement has started (a 429 saying why), never queued behind it. One key sending
slow grammars, at once or one after another, holds one checker at most, and the others serve everyone else. A
text over MAX_GRAMMAR_CHARS is refused before any compile. Verdicts are kept (the last KEPT_VERDICTS, refusals
too: a script sends the same grammar again), and requests sending a grammar already being checked wait for that
check rather than start their own.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection

from django.conf import settings

from inference import errors
from inference.engines.grammar.grammar import Grammar, GrammarError

log = logging.getLogger(__name__)
MAX_GRAMMAR_CHARS = 65_536  # a schema of 60 nested objects is 12,000; a longer text costs every step that carries it
CHECKERS = 2  # each holds the demo draft; one hostile grammar takes one of them, the other goes on
KEPT_VERDICTS = 256
CHECKER_START_S = 60  # loading a checker's pipeline takes about a second
WAIT_FOR_CHECKER_S = 30  # every checker busy this long: the request is told to retry
CPU_POLL_S = 0.02  # how often a check's CPU time is read while the checker compiles
# A compile is killed at this many budgets of wall time however little CPU its niced checker got (its refusal
# answered within 1.5 budgets), or once it spent the budget in CPU time.
WALL_BUDGETS = 1.25
RESTART_PAUSE_S = 1  # after a checker failed to start
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# A compile running out its budget, and a checker's start, yield the CPU to the web process and the workers
# (on a 2-core host a full-priority one stalled every other request); grammars that compile take milliseconds.
CHECKER_NICENESS = 10


BUSY = "Too many grammars are being checked at once: retry in a moment."
ONE_AT_A_TIME = "This key's previous grammar is still being checked (one at a time per key): retry once it is answered."
RESTARTING = ("This key's last grammar ran out the budget and the checker it held is still being replaced: retry in a "
              "second.")


class GrammarCheckBusy(RuntimeError):
    """No checker was free in time: not the grammar's fault, the request may be sent again."""


def check(grammar: Grammar, *, budget_s: float, requester: str) -> None:
    """Raise GrammarError unless the library and llguidance both compile `grammar` within `budget_s`
    (GrammarCheckBusy if no checker was free for WAIT_FOR_CHECKER_S). `requester`: who asks (an API key)."""
    if len(grammar.text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"it is {len(grammar.text):,} characters long, over this server's limit of "
                           f"{MAX_GRAMMAR_CHARS:,}.")
    if reason := _VERDICTS.get(grammar, lambda: _CHECKERS.refusal(grammar, budget_s=budget_s, requester=requester)):
        raise GrammarError(reason)


def require_compiled(grammar: Grammar, *, param: str, requester: str) -> None:
    """check() within the server's budget, its refusals as the request's errors naming `param`."""
    try:
        check(grammar, budget_s=settings.GRAMMAR_COMPILE_MS / 1000, requester=requester)
    except GrammarError as exc:
        raise errors.InvalidValue(f"{param} cannot be compiled: {exc}", param=param) from None
    except GrammarCheckBusy as exc:
        raise errors.ConcurrencyLimit(str(exc), param=param) from None


class Verdicts:
    """The last `size` grammars' verdicts ('' when the grammar compiles), each worked out once: a request
    asking for one being worked out waits for it."""

    def __init__(self, size: int):
        self.size = size
        self._kept: OrderedDict[Grammar, str] = OrderedDict()
        self._pending: dict[Grammar, Future[str]] = {}
        self._lock = threading.Lock()

    def get(self, grammar: Grammar, work_out: Callable[[], str]) -> str:
        with self._lock:
            if grammar in self._kept:
                self._kept.move_to_end(grammar)
                return self._kept[grammar]
            pending = self._pending.get(grammar)
            if pending is None:
                pending = self._pending[grammar] = Future()
                ours = True
            else:
                ours = False
        if not ours:
            return pending.result()
        try:
            verdict = work_out()
        except BaseException as exc:  # not kept: the next request tries again
            with self._lock:
                del self._pending[grammar]
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._pending[grammar]
            self._kept[grammar] = verdict
            if len(self._kept) > self.size:
                self._kept.popitem(last=False)
        pending.set_result(verdict)
        return verdict


class Checker:
    """One checker process, loaded and waiting for grammars on its socket."""

    def __init__(self):
        # A new interpreter, as for the step processes (engines/library/pipeline.py): not a fork of a threaded process.
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno()), str(os.getpid())],
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        os.setpriority(os.PRIO_PROCESS, self.process.pid, CHECKER_NICENESS)
        self.conn = Connection(ours.detach())
        try:
            ready = self.conn.poll(CHECKER_START_S) and self.conn.recv() == "ready"
        except EOFError:
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError(f"a grammar checker did not start within {CHECKER_START_S} s")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()


class CheckerPool:
    """`size` checkers, started by one thread of their own when first needed; a checker killed or dead is
    replaced in the background by that thread."""

    def __init__(self, size: int):
        self.size = size
        self._idle: queue.Queue[Checker] = queue.Queue()
        self._wanted: queue.Queue[threading.Event] = queue.Queue()  # each set once its checker is started
        self._owed: dict[str, threading.Event] = {}  # requester -> the replacement of a checker its grammar cost
        self._requesters: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)  # one check at a time each
        self._started = False
        self._lock = threading.Lock()

    def refusal(self, grammar: Grammar, *, budget_s: float, requester: str) -> str:
        self._start()
        with self._lock:
            own_turn = self._requesters[requester]
        # A requester's grammars queue at most one budget behind each other, and none waits for the checker its last
        # one cost to start again: refused at once instead, in words that say why (docs/security.md#limits).
        if not own_turn.acquire(timeout=budget_s):
            raise GrammarCheckBusy(ONE_AT_A_TIME)
        try:
            owed = self._owed.get(requester)
            if owed is not None and not owed.is_set():
                raise GrammarCheckBusy(RESTARTING)
            self._owed.pop(requester, None)
            return self._checked(grammar, budget_s=budget_s, requester=requester)
        finally:
            own_turn.release()

    def _checked(self, grammar: Grammar, *, budget_s: float, requester: str) -> str:
        while True:
            try:
                checker = self._idle.get(timeout=WAIT_FOR_CHECKER_S)
            except queue.Empty:
                raise GrammarCheckBusy(BUSY) from None
            try:
                checker.conn.send(grammar)
            except OSError:  # it died while idle (killed from outside): not this grammar's doing
                self._replace(checker)
                continue
            try:
                _await_verdict(checker, budget_s=budget_s)
                verdict = checker.conn.recv() or ""
            except TimeoutError:
                verdict = (f"it did not compile within this server's budget of {budget_s:g} s (nested repetitions "
                           "such as (a{1,300}){1,300} grow without bound); simplify it.")
            except (EOFError, OSError):
                verdict = "the library's compiler crashed on it."
            else:
                self._idle.put(checker)
                return verdict
            self._owed[requester] = self._replace(checker)
            return verdict

    def _replace(self, checker: Checker) -> threading.Event:
        checker.kill()
        started = threading.Event()
        self._wanted.put(started)
        return started

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            for _ in range(self.size):
                self._wanted.put(threading.Event())
            threading.Thread(target=self._start_checkers, name="grammar-checkers", daemon=True).start()

    def _start_checkers(self) -> None:
        """The one thread that starts checkers: they die with it (their parent-death signal names the thread
        that started them), so it lives as long as the process."""
        while True:
            wanted = self._wanted.get()
            try:
                self._idle.put(Checker())
            except Exception:
                log.exception("a grammar checker failed to start")
                time.sleep(RESTART_PAUSE_S)
                self._wanted.put(wanted)
            else:
                wanted.set()


def _await_verdict(checker: Checker, *, budget_s: float) -> None:
    """Returns once the checker has answered; TimeoutError once it has spent `budget_s` of CPU time on the
    grammar. CPU time, not wall time: on a host whose workers keep every core busy, the checker (niced) gets a
    fraction of a core, and quick schemas were refused as hostile (docs/security.md#limits). Wall time is still
    bounded, at WALL_BUDGETS budgets."""
    cpu_at_start, started = _cpu_seconds(checker.process.pid), time.monotonic()
    while not checker.conn.poll(CPU_POLL_S):
        spent, cpu = time.monotonic() - started, _cpu_seconds(checker.process.pid)
        used = cpu - cpu_at_start if cpu is not None and cpu_at_start is not None else spent
        if used > budget_s or spent > WALL_BUDGETS * budget_s:
            raise TimeoutError


def _cpu_seconds(pid: int) -> float | None:
    """The process's user and system CPU time so far (Linux's /proc), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime and stime, fields 14 and 15


_VERDICTS = Verdicts(KEPT_VERDICTS)
_CHECKERS = CheckerPool(CHECKERS)


def _die_with_parent(parent: int) -> None:
    """A compile that never ends must not outlive the web process: killed when the thread that started it goes."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it went before the signal was asked for
        os._exit(0)


def serve(fd: int, parent: int) -> None:
    """A checker: the verdict of each grammar its socket sends, one at a time, until the socket closes."""
    from inference.engines.grammar.compilers import checker_pipeline, refusal  # the compilers load here, not on the web

    _die_with_parent(parent)
    conn = Connection(fd)
    pipeline = checker_pipeline()
    conn.send("ready")
    while True:
        try:
            grammar = conn.recv()
        except EOFError:
            return
        conn.send(refusal(grammar, pipeline=pipeline))


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
