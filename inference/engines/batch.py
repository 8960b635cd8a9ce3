"""The main alone for many answers at once, on the own engine: one batched inference a step.

The own engine runs each answer in its own thread on its own infer request, which suits speculation
(each answer verifies its own K+1 tokens and cuts what the main rejected) but not load: four answers of
the main alone then cost four inferences of one token a step where one of four tokens costs far less on a
CPU (the weights are read once). So an answer of the main alone (K=0) takes a row of a shared batch: its
thread calls `feed` as it would on its own cache, and one driver thread runs the rows that asked, together.

A row joins by a prefill of its own (on a second infer request), whose cache is then copied into the
batch's, or with the cache it has (an answer that speculated on its own until more answers came: exact.py);
rows shorter than the batch are padded with masked slots. A row leaving is cut out of the cache,
and so are the slots no remaining row attends to. A row alone in the batch computes what it would on its
own cache, bitwise (same inputs, same kernels); beside other rows its logits can differ in the last bits
(the padded slots change the attention's summation order), as in any batched server: an answer of the main
alone is the main's either way, but two answers to one prompt at different loads may part at a near-tie.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import openvino as ov

from inference.engines.prefill import PrefillCache
from inference.engines.stepped_model import step_inputs

log = logging.getLogger(__name__)
GATHER_S = 0.02  # how long a step waits for rows that have not asked yet (their threads emit the last step)


class BatchRow:
    """One answer's place in the batch: a KvCache (engines/kv_cache.py), as a KvSequence is."""

    def __init__(self, batch: SharedBatch):
        self.batch = batch
        self.joined = False
        self.position = 0  # the next token's position
        self.tokens: list[int] = []  # what it asked to feed, until the driver answers
        self.logits: np.ndarray | BaseException | None = None
        self.answered = threading.Event()
        self.dead = 0  # a row never holds rejected tokens: the main alone rejects none
        self.failed: Exception | None = None  # the batch was reset under it (SharedBatch._reset)
        self.cache: dict[str, np.ndarray] | None = None  # joining with a cache of its own (adopt)

    def prefill(self, prompt_ids: list[int]) -> np.ndarray:
        """Joining the batch, by a prefill of its own (from the batch's cache of recent prompts)."""
        return self.feed(prompt_ids)

    def adopt(self, cache: dict[str, np.ndarray]) -> None:
        """Joining the batch with a cache of its own: each state [1, kv heads, slots, head size], every slot live."""
        self.cache = cache
        self.feed([])

    def feed(self, token_ids: list[int]) -> np.ndarray:
        """The last fed token's logits (a row [1, vocabulary]): the prompt's when joining, then one a step."""
        if self.failed is not None:
            raise RuntimeError("the batched main failed") from self.failed
        if self.joined and len(token_ids) != 1:
            raise ValueError("a row of the batch feeds one token a step")
        self.answered.clear()
        self.batch.ask(self, token_ids)
        self.answered.wait()
        result, self.logits = self.logits, None
        if isinstance(result, BaseException):
            raise RuntimeError("the batched step failed") from result
        assert result is not None
        return result

    def drop_last(self, n: int) -> None:
        if n:
            raise ValueError("the main alone rejects no token")

    def rebuild(self, live_ids: list[int]) -> None:
        raise ValueError("a row of the batch holds no dead slot")

    def close(self) -> None:
        self.batch.leave(self)


class SharedBatch:
    """The rows of one compiled main, stepped by one driver thread, started with the first row."""

    def __init__(self, compiled: ov.CompiledModel, *, prompts: PrefillCache):
        self.prompts = prompts
        self.step_request = compiled.create_infer_request()
        self.prefill_request = compiled.create_infer_request()
        self.rows: list[BatchRow] = []  # in the cache's batch order
        self.mask = np.zeros((0, 0), dtype=np.int64)  # [rows, slots]: 1 where a row attends
        self._asked: list[BatchRow] = []
        self._leaving: list[BatchRow] = []
        self._changed = threading.Condition()
        self._driver: threading.Thread | None = None

    def row(self) -> BatchRow:
        return BatchRow(self)

    def ask(self, row: BatchRow, token_ids: list[int]) -> None:
        with self._changed:
            row.tokens = list(token_ids)
            self._asked.append(row)
            if self._driver is None or not self._driver.is_alive():
                self._driver = threading.Thread(target=self._drive, name="exact-batch", daemon=True)
                self._driver.start()
            self._changed.notify_all()

    def leave(self, row: BatchRow) -> None:
        with self._changed:
            if row.joined and row.failed is None:
                self._leaving.append(row)
                self._changed.notify_all()

    def _drive(self) -> None:
        """Until no row is left: take the rows that asked (joining rows first), step them, answer them."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked or self._leaving, timeout=60)
                if not (self._asked or self._leaving or self.rows):
                    self._driver = None
                    return
                deadline = time.monotonic() + GATHER_S
                while (not self._leaving and self._asked and len(self._asked) < len(self.rows)
                       and all(row.joined for row in self._asked)):
                    if not self._changed.wait(timeout=max(deadline - time.monotonic(), 0)):
                        break  # the rest are late: they take the next step
                asked, self._asked = self._asked, []
                leaving, self._leaving = self._leaving, []
            try:
                for row in leaving:
                    self._remove(row)
            except Exception as exc:
                log.exception("a row could not leave the batch")
                self._reset(exc, waiting=asked)
                continue
            joining = [row for row in asked if not row.joined]
            stepping = [row for row in asked if row.joined]
            for row in joining:
                self._answer([row], self._join)
            if stepping:
                self._answer(stepping, self._step)

    def _answer(self, rows: list[BatchRow], run: Callable[[list[BatchRow]], list[np.ndarray]]) -> None:
        """Each row's logits from `run(rows)`, or the exception it raised: the answers fail, the batch goes on."""
        results: list[np.ndarray | BaseException]
        try:
            results = [*run(rows)]
        except Exception as exc:
            log.exception("a batched step of the main failed")
            results = [exc] * len(rows)
        self._wake(rows, results)

    @staticmethod
    def _wake(rows: list[BatchRow], results: list[np.ndarray | BaseException]) -> None:
        for row, result in zip(rows, results, strict=True):
            row.logits = result
            row.answered.set()

    def _reset(self, exc: Exception, *, waiting: list[BatchRow]) -> None:
        """The cache is in doubt: every row's answer fails, and the batch starts afresh."""
        for row in {*self.rows, *waiting}:
            row.failed = exc
        self._wake(waiting, [exc] * len(waiting))
        self.rows, self.mask = [], np.zeros((0, 0), dtype=np.int64)
        self.step_request.reset_state()

    def _join(self, rows: list[BatchRow]) -> list[np.ndarray]:
        """Prefill the row's prompt on its own (unless it brings its cache), then copy its cache into the
        batch's as a new row."""
        [row] = rows
        if row.cache is None:
            request = self.prefill_request
            request.reset_state()
            logits = self.prompts.prefill(request, row.tokens)
            own = {state.name: state.state.data for state in request.query_state()}
        else:
            own, logits = row.cache, np.zeros((1, 0), dtype=np.float32)
        n = next(iter(own.values())).shape[2]
        width = max(self.mask.shape[1], n)
        if self.rows:
            for state in self.step_request.query_state():
                state.state = ov.Tensor(np.concatenate([_padded(state.state.data, width),
                                                        _padded(own[state.name], width)]))
        else:
            for state in self.step_request.query_state():
                state.state = ov.Tensor(np.ascontiguousarray(own[state.name]))
        self.prefill_request.reset_state()  # its copy of the prompt's cache is in the batch now
        row.cache = None
        mask = np.zeros((len(self.rows) + 1, width), dtype=np.int64)
        mask[:-1, : self.mask.shape[1]] = self.mask
        mask[-1, :n] = 1
        self.mask = mask
        self.rows.append(row)
        row.joined, row.position = True, n
        return [logits]

    def _step(self, stepping: list[BatchRow]) -> list[np.ndarray]:
        """One inference of one token for every row; a row that did not ask takes a masked slot."""
        asked = set(map(id, stepping))
        tokens = np.array([[row.tokens[0] if id(row) in asked else 0] for row in self.rows], dtype=np.int64)
        column = np.array([[1 if id(row) in asked else 0] for row in self.rows], dtype=np.int64)
        mask = np.concatenate([self.mask, column], axis=1)
        positions = np.array([[row.position] for row in self.rows], dtype=np.int64)
        self.step_request.infer(step_inputs(tokens, positions=positions, attention_mask=mask, rows=1))
        logits = self.step_request.get_output_tensor(0).data
        self.mask = mask  # a failed inference appended no slot
        for row in stepping:
            row.position += 1
        return [logits[self.rows.index(row)].copy() for row in stepping]

    def _remove(self, row: BatchRow) -> None:
        """Cut the row out of the cache, and the slots no row left attends to."""
        index = self.rows.index(row)
        del self.rows[index]
        if not self.rows:
            self.step_request.reset_state()
            self.mask = np.zeros((0, 0), dtype=np.int64)
            return
        mask = np.delete(self.mask, index, axis=0)
        kept = np.flatnonzero(mask.any(axis=0))
        for state in self.step_request.query_state():  # [batch, kv heads, slots, head size]
            data = np.delete(state.state.data, index, axis=0)
            state.state = ov.Tensor(np.ascontiguousarray(data[:, :, kept]))
        self.mask = mask[:, kept]


def _padded(cache: np.ndarray, width: int) -> np.ndarray:
    """A cache [batch, kv heads, slots, head size] widened to `width` slots by zeros at the end."""
    missing = width - cache.shape[2]
    if not missing:
        return cache
    return np.concatenate([cache, np.zeros((*cache.shape[:2], missing, *cache.shape[3:]), cache.dtype)], axis=2)
