"""Which sequences one model's next inference holds, as vLLM v1's scheduler decides it: every answer's work that
is waiting (a prompt's chunk, the main alone's token, a verify, a draft token), in the order it came, under a budget
of tokens a step, in one inference of the model runner (engines/own/model_runner.py).

Each answer runs in its own thread and asks for its work as it needs it (`infer`); one driver thread a model steps.
On the PagedAttention op a sequence's rows do not depend on which others share its inference (docs/exactness.md),
so batching is only a matter of speed: one inference of four sequences reads the weights once. A step waits briefly
for the sequences that took part in the last one (their threads are emitting its tokens, or drafting), so that
answers under load keep stepping together instead of splitting into groups out of step.

While answers step, a long prompt is read a small chunk a step (SHARED_CHUNK_TOKENS), as Sarathi-Serve's stall-free
batching does: their next tokens wait for the step a chunk joins, under half a second on two cores, not the seconds
of two full chunks; read alone, it goes in full chunks.

Work that can wait (the draft reading a conversation after its answer) yields to a user's prompt: a step holding only
such work does not start while `yields_while` says a prompt is being read, and one under way is cancelled when a
prompt starts (`preempt`); its asks are answered with Preempted and asked again once the prompt is read.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from inference.engines.own.model_runner import ModelRunner, Preempted, Work

log = logging.getLogger(__name__)
CHUNK_TOKENS = 256  # a long prompt is read in chunks of this many, other answers stepping between two
SHARED_CHUNK_TOKENS = 128  # ... and of this many, one a step, while other answers step (a token costs ~the same read)
GATHER_S = 0.02  # how long a step waits for the sequences of the last one to ask again
DRAFTING_GATHER_S = 0.5  # ... for a sequence that speculates (it drafts K tokens on the draft between two verifies)


class Ask:
    """A sequence's pending work, answered with its rows of logits or the error its inference raised."""

    def __init__(self, work: Work, member: object, *, drafting: bool, yields: bool, long_read: bool):
        self.work, self.member, self.drafting, self.yields, self.long_read = work, member, drafting, yields, long_read
        self.result: np.ndarray | BaseException | None = None
        self.done = threading.Event()


class Scheduler:
    """One model's steps. `infer` blocks its caller until its work has run."""

    def __init__(self, runner: ModelRunner, *, chunk_tokens: int = CHUNK_TOKENS):
        self.runner = runner
        self.chunk_tokens = chunk_tokens  # what a sequence asks at most at once (PagedSequence.prefill)
        self.step_tokens = 2 * chunk_tokens  # a step's budget: a chunk and every other answer's tokens, or two chunks
        if most := runner.steady.most_tokens:  # beyond it this host's kernels round a row otherwise (model_runner.py)
            self.chunk_tokens, self.step_tokens = min(chunk_tokens, most // 2), min(self.step_tokens, most)
        self.shared_chunk_tokens = min(SHARED_CHUNK_TOKENS, self.chunk_tokens)
        self._waiting: list[Ask] = []
        self._reading: dict[int, int] = {}  # id(member) -> the order its prompt's first chunk asked in
        self._arrivals = itertools.count()
        self._last: dict[object, bool] = {}  # the members of the last step: whether each drafts between its steps
        self._changed = threading.Condition()
        self._driver: threading.Thread | None = None
        self.steps = 0
        self.yields_while: Callable[[], bool] | None = None  # work that can wait gives way while it is true

    def preempt(self) -> None:
        """The step under way is cancelled if it holds only work that can wait."""
        self.runner.preempt()

    def infer(self, work: Work, *, member: object, drafting: bool = False, yields: bool = False,
              long_read: bool = False) -> np.ndarray:
        """`work`'s rows of logits; `member` is the sequence asking (the step waits for the last step's members);
        `yields`: the work can wait (Preempted: nothing ran for it, ask again); `long_read`: a chunk of a prompt with
        a full chunk or more after it (it waits behind answers' tokens; a short prompt, a follow-up, does not)."""
        ask = Ask(work, member, drafting=drafting, yields=yields, long_read=long_read)
        with self._changed:
            if long_read:
                self._reading.setdefault(id(member), next(self._arrivals))
            else:
                self._reading.pop(id(member), None)
            self._waiting.append(ask)
            if self._driver is None or not self._driver.is_alive():
                self._driver = threading.Thread(target=self._drive, name="own-scheduler", daemon=True)
                self._driver.start()
            self._changed.notify_all()
        ask.done.wait()
        if isinstance(ask.result, Preempted):
            raise ask.result
        if isinstance(ask.result, BaseException):
            raise RuntimeError("the model's step failed") from ask.result
        assert ask.result is not None
        return ask.result

    def chunk_budget(self, member: object) -> int:
        """The most tokens `member`'s next prompt chunk holds: a small chunk while other answers step."""
        with self._changed:
            others = {id(ask.member) for ask in self._waiting} | {id(other) for other in self._last}
            answering = any(other != id(member) and other not in self._reading for other in others)
        return self.shared_chunk_tokens if answering else self.chunk_tokens

    def leave(self, member: object) -> None:
        """The sequence is done: the next step does not wait for it."""
        with self._changed:
            self._last.pop(member, None)
            self._reading.pop(id(member), None)
            self._changed.notify_all()

    def _drive(self) -> None:
        while True:
            with self._changed:
                if not self._changed.wait_for(lambda: self._waiting, timeout=30):
                    self._driver = None
                    return
                self._gather()
                step = self._take()
            self._run(step)

    def _gather(self) -> None:
        """Wait (the lock held by wait_for's caller) for the last step's members to ask again, within the gather."""
        drafting = any(self._last.values())
        deadline = time.monotonic() + (DRAFTING_GATHER_S if drafting else GATHER_S)
        while self._missing() and self._changed.wait(timeout=max(deadline - time.monotonic(), 0)):
            pass

    def _missing(self) -> bool:
        asked = {id(ask.member) for ask in self._waiting}
        return any(id(member) not in asked for member in self._last)

    def _take(self) -> list[Ask]:
        """The waiting asks within the step's budget (one at least): the running answers' tokens first, so that a
        long prompt being read delays no other answer's next token; then prompts' chunks, the prompt that came first
        read first, as vLLM's scheduler does: four pastes at once get their first tokens one after another, not all
        four at the end of the last read; then the reads that can wait."""
        step: list[Ask] = []
        tokens = read = 0
        answering = any(not ask.long_read for ask in self._waiting)
        read_budget = self.shared_chunk_tokens if answering else self.step_tokens
        for ask in sorted(self._waiting, key=self._order):
            n = len(ask.work.tokens)
            if (step and tokens + n > self.step_tokens) or (ask.long_read and read and read + n > read_budget):
                continue  # a prompt's chunk asked before answers came runs once beside them (read 0), whatever its size
            step.append(ask)
            tokens += n
            read += n if ask.long_read else 0
        for ask in step:
            self._waiting.remove(ask)
        self._last = {ask.member: ask.drafting for ask in step}
        return step

    def _order(self, ask: Ask) -> tuple[bool, bool, int]:
        return ask.long_read, ask.yields, self._reading.get(id(ask.member), 0) if ask.long_read else 0

    def _run(self, step: list[Ask]) -> None:
        results: list[np.ndarray | BaseException]
        yields = self.yields_while if all(ask.yields for ask in step) else None
        try:
            results = [*self.runner.run([ask.work for ask in step], yields_while=yields)]
        except Preempted as preempted:
            results = [preempted] * len(step)
        except Exception as exc:  # the step's answers fail, the model steps on
            log.exception("a step of %d sequences failed", len(step))
            results = [exc] * len(step)
        self.steps += 1
        for ask, result in zip(step, results, strict=True):
            ask.result = result
            ask.done.set()
