"""Many answers at once on the own engine: one batched inference a step for all of them.

The own engine runs each answer in its own thread on its own infer request, which suits one answer
speculating (it verifies its own K+1 tokens and cuts what the main rejected) but not load: four answers
then cost four inferences a step, where one inference of four rows costs far less on a CPU (the weights are
read once). So beyond the pair's speculating streams an answer takes a row of a shared batch: its thread calls
`feed` as it would on its own cache, and one driver thread runs the rows that asked, together. The main alone's
answers feed one token a step; answers speculating in the batch (DecodingParams.batch_k, engine.py) feed their K+1 to
verify to the main's batch and a token at a time to the draft's, a batch of its own.

A row joins with a cache of its own, copied into the batch's: its prompt's, prefilled in its own thread on an infer
request of its own (chunk by chunk, from the prefix cache: the batch steps on meanwhile), or the cache it has (an
answer that speculated on its own until more answers came: engine.py). A row leaving keeps its live slots in the
prefix cache, for the conversation's next turn.
Rows feeding fewer tokens than others in a step are padded before their tokens with masked slots; tokens the
main rejected are masked, not cut (the batch's cache is one array for every row); once the cache holds
COMPACT_SLOTS more slots than its longest row's live ones, each row's live slots are packed to the front. A row
leaving is cut out of the cache, and so are the slots no remaining row attends to. A row alone in the batch
computes what it would on its own cache (same inputs, same kernels, but for the masked slots); beside other
rows its logits can differ in the last bits (the padded slots change the attention's summation order), as in
any batched server; but under the CPU's dynamic quantization (int8 activations) masked slots, padded or rejected,
move the logits by up to 0.3 (docs/exactness.md): an answer is a computation of the main either way, but two answers
to one prompt at different loads may part at a near-tie, and a row speculating here parts from the batched main
alone's answer where one that cuts its rejections would not (docs/speculation.md#speculating-in-the-batch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import openvino as ov

from inference.engines.own.prefix_cache import PrefixCache, ProgressCallback
from inference.engines.own.stepped_model import step_inputs

log = logging.getLogger(__name__)
GATHER_S = 0.02  # how long a step waits for rows that have not asked yet (their threads emit the last step)
# ... and, where rows speculate, for those still drafting (K draft inferences): the main's batch steps all its rows
# at once only if it waits for them; stepping those that asked while the rest draft splits the rows into two groups
# that stay out of step, each batch then inferring while the other does, on the same cores (the real pair, four
# answers at K=1: half the main alone's batch so; docs/speculation.md#speculating-in-the-batch).
DRAFTING_GATHER_S = 1.0
LEAVE_WAIT_S = 5.0  # how long an answer waits for its slots to reach the prefix cache (a step or two)
COMPACT_SLOTS = 64  # dead or padded slots the cache holds beyond its longest row's live ones before it is packed


class BatchRow:
    """One answer's place in the batch: a KvCache (engines/own/kv_cache.py), as a KvSequence is."""

    def __init__(self, batch: SharedBatch):
        self.batch = batch
        self.joined = False
        self.cached = 0  # the prompt's tokens its prefill found in the prefix cache
        self.keep_ids: list[int] | None = None  # leaving: the tokens its live slots hold, for the prefix cache
        self.left = threading.Event()
        self.drafting = False  # it speculates: between its main steps it drafts (exact.Decoding)
        self.position = 0  # the next token's position
        self.tokens: list[int] = []  # what it asked to feed, until the driver answers
        self.logits: np.ndarray | BaseException | None = None
        self.answered = threading.Event()
        self.dead = 0  # the batch packs its cache itself: exact.Decoding never rebuilds a row's
        self.slots: list[int] = []  # the cache's columns of its live tokens, in order (the driver's to change)
        self.rejected = 0  # its last fed tokens the main rejected, masked at its next step by the driver
        self.failed: Exception | None = None  # the batch was reset under it (SharedBatch._reset)
        self.cache: dict[str, np.ndarray] | None = None  # joining with a cache of its own (adopt)

    def prefill(self, prompt_ids: list[int], *, on_chunk: ProgressCallback | None = None) -> np.ndarray:
        """Joining the batch with its prompt's cache, prefilled here (from the prefix cache where it can)."""
        request = self.batch.prefill_request()
        try:
            logits, self.cached = self.batch.prompts.prefill(request, prompt_ids, on_chunk=on_chunk)
            self.adopt({state.name: state.state.data for state in request.query_state()})
        finally:
            request.reset_state()
            self.batch.prefill_done(request)
        return logits

    def adopt(self, cache: dict[str, np.ndarray]) -> None:
        """Joining the batch with a cache of its own: each state [1, kv heads, slots, head size], every slot live."""
        self.cache = cache
        self._ask([])

    def feed(self, token_ids: list[int]) -> np.ndarray:
        """Logits for each fed token (the last one's alone in a batch of `last_row_only`); the first feed joins
        the batch, as a prefill."""
        if self.failed is not None:
            raise RuntimeError("the batched main failed") from self.failed
        if not self.joined:
            return self.prefill(token_ids)
        if not token_ids:
            raise ValueError("a row of the batch feeds a token at least")
        return self._ask(token_ids)

    def _ask(self, token_ids: list[int]) -> np.ndarray:
        self.answered.clear()
        self.batch.ask(self, token_ids)
        self.answered.wait()
        result, self.logits = self.logits, None
        if isinstance(result, BaseException):
            raise RuntimeError("the batched step failed") from result
        assert result is not None
        return result

    def drop_last(self, n: int) -> None:
        """The last n fed tokens were rejected: masked by the driver before this row's next step."""
        self.rejected += n
        self.position -= n

    def rebuild(self, live_ids: list[int]) -> None:
        raise ValueError("the batch packs its rows' live slots itself")

    def close(self, *, keep_ids: list[int] | None = None) -> None:
        """Leave the batch; with `keep_ids`, once its live slots are in the prefix cache."""
        self.keep_ids = keep_ids
        if self.batch.leave(self) and keep_ids:
            self.left.wait(timeout=LEAVE_WAIT_S)


class SharedBatch:
    """The rows of one compiled main, stepped by one driver thread, started with the first row: the driver gathers the
    rows that asked, and its cache (BatchCache) joins, steps, packs and cuts them."""

    def __init__(self, compiled: ov.CompiledModel, *, prompts: PrefixCache, last_row_only: bool = False):
        self.prompts = prompts
        self.compiled = compiled
        self.cache = BatchCache(compiled.create_infer_request(), prompts=prompts, last_row_only=last_row_only)
        self._prefill_requests: list[ov.InferRequest] = []  # idle ones, for the next rows' prefills
        self._asked: list[BatchRow] = []
        self._leaving: list[BatchRow] = []
        self._changed = threading.Condition()
        self._driver: threading.Thread | None = None

    @property
    def rows(self) -> list[BatchRow]:
        """The rows in the cache's batch order."""
        return self.cache.rows

    @property
    def mask(self) -> np.ndarray:
        """[rows, slots]: 1 where a row attends."""
        return self.cache.mask

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

    def prefill_request(self) -> ov.InferRequest:
        with self._changed:
            return self._prefill_requests.pop() if self._prefill_requests else self.compiled.create_infer_request()

    def prefill_done(self, request: ov.InferRequest) -> None:
        with self._changed:
            self._prefill_requests.append(request)

    def leave(self, row: BatchRow) -> bool:
        """Whether the row was in the batch (the driver takes it out, and sets `row.left`)."""
        with self._changed:
            if row.joined and row.failed is None:
                self._leaving.append(row)
                self._changed.notify_all()
                return True
            return False

    def _drive(self) -> None:
        """Until no row is left: take the rows that asked (joining rows first), step them, answer them."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked or self._leaving, timeout=60)
                if not (self._asked or self._leaving or self.rows):
                    self._driver = None
                    return
                deadline = time.monotonic() + (DRAFTING_GATHER_S if any(row.drafting for row in self.rows)
                                               else GATHER_S)
                while (not self._leaving and self._asked and len(self._asked) < len(self.rows)
                       and all(row.joined for row in self._asked)):
                    if not self._changed.wait(timeout=max(deadline - time.monotonic(), 0)):
                        break  # the rest are late: they take the next step
                asked, self._asked = self._asked, []
                leaving, self._leaving = self._leaving, []
            try:
                for row in leaving:
                    self.cache.remove(row)
                self.cache.mask_rejected([row for row in asked if row.joined])
                self.cache.pack_if_sparse()
            except Exception as exc:
                log.exception("a row could not leave the batch")
                self._reset(exc, waiting=asked)
                continue
            finally:
                for row in leaving:
                    row.left.set()
            joining = [row for row in asked if not row.joined]
            stepping = [row for row in asked if row.joined]
            for row in joining:
                self._answer([row], self.cache.join)
            if stepping:
                self._answer(stepping, self.cache.step)

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
        self.cache.reset()


class BatchCache:
    """The batch's keys and values: one infer request's states [rows, kv heads, slots, head size], its rows in their
    batch order and the slots each attends (`mask`). Only the batch's driver thread changes it."""

    def __init__(self, request: ov.InferRequest, *, prompts: PrefixCache, last_row_only: bool):
        self.request = request
        self.prompts = prompts  # where a leaving row's live slots are kept
        self.last_row_only = last_row_only  # a draft's batch: each row proposes from its last token's logits
        self.rows: list[BatchRow] = []  # in the cache's batch order
        self.mask = np.zeros((0, 0), dtype=np.int64)  # [rows, slots]: 1 where a row attends

    def reset(self) -> None:
        """No row left, no slot (the batch's answers failed: SharedBatch._reset)."""
        self.rows, self.mask = [], np.zeros((0, 0), dtype=np.int64)
        self.request.reset_state()

    def join(self, rows: list[BatchRow]) -> list[np.ndarray]:
        """Copy the row's cache into the batch's as a new row."""
        [row] = rows
        own = row.cache
        assert own is not None, "a row joins with its cache (BatchRow.prefill, adopt)"
        n = next(iter(own.values())).shape[2]
        width = max(self.mask.shape[1], n)
        if self.rows:
            for state in self.request.query_state():
                state.state = ov.Tensor(np.concatenate([_padded(state.state.data, width),
                                                        _padded(own[state.name], width)]))
        else:
            for state in self.request.query_state():
                state.state = ov.Tensor(np.ascontiguousarray(own[state.name]))
        row.cache = None
        mask = np.zeros((len(self.rows) + 1, width), dtype=np.int64)
        mask[:-1, : self.mask.shape[1]] = self.mask
        mask[-1, :n] = 1
        self.mask = mask
        self.rows.append(row)
        row.joined, row.position, row.slots = True, n, list(range(n))
        return [np.zeros((1, 0), dtype=np.float32)]

    def step(self, stepping: list[BatchRow]) -> list[np.ndarray]:
        """One inference for every row: each that asked feeds its tokens, after masked slots where others feed
        more; a row that did not ask takes masked slots."""
        n = max(len(row.tokens) for row in stepping)
        width, asked = self.mask.shape[1], set(map(id, stepping))
        tokens = np.zeros((len(self.rows), n), dtype=np.int64)
        positions = np.zeros((len(self.rows), n), dtype=np.int64)
        columns = np.zeros((len(self.rows), n), dtype=np.int64)
        for index, row in enumerate(self.rows):
            fed = len(row.tokens) if id(row) in asked else 0
            positions[index] = row.position  # the padding's, masked
            if fed:
                tokens[index, n - fed:] = row.tokens
                positions[index, n - fed:] = np.arange(row.position, row.position + fed)
                columns[index, n - fed:] = 1
        mask = np.concatenate([self.mask, columns], axis=1)
        self.request.infer(step_inputs(tokens, positions=positions, attention_mask=mask,
                                       rows=1 if self.last_row_only else n))
        logits = self.request.get_output_tensor(0).data
        self.mask = mask  # a failed inference appended no slot
        answers = []
        for row in stepping:
            fed = len(row.tokens)
            row.slots += range(width + n - fed, width + n)
            row.position += fed
            first = logits.shape[1] - (1 if self.last_row_only else fed)  # its rows among the last n positions'
            answers.append(logits[self.rows.index(row), first:].copy())
        return answers

    def mask_rejected(self, rows: list[BatchRow]) -> None:
        """The slots of tokens the main rejected, masked from now on."""
        for row in rows:
            if row.rejected:
                self.mask[self.rows.index(row), row.slots[-row.rejected:]] = 0
                del row.slots[-row.rejected:]
                row.rejected = 0

    def pack_if_sparse(self) -> None:
        """Each row's live slots packed to the front of the cache, once it holds COMPACT_SLOTS more than its
        longest row's (the rest: rejected tokens, padding)."""
        live = self.mask.sum(axis=1)
        if not self.rows or self.mask.shape[1] - int(live.max()) < COMPACT_SLOTS:
            return
        width = int(live.max())
        for state in self.request.query_state():  # [batch, kv heads, slots, head size]
            data = state.state.data
            packed = np.zeros((*data.shape[:2], width, data.shape[3]), data.dtype)
            for index, row in enumerate(self.rows):
                packed[index, :, : len(row.slots)] = data[index][:, row.slots]
            state.state = ov.Tensor(packed)
        self.mask = (np.arange(width)[None, :] < live[:, None]).astype(np.int64)
        for row in self.rows:
            row.slots = list(range(len(row.slots)))

    def remove(self, row: BatchRow) -> None:
        """Cut the row out of the cache, and the slots no row left attends to."""
        index = self.rows.index(row)
        if row.keep_ids:
            self.prompts.keep(row.keep_ids, {state.name: state.state.data[index][None][:, :, row.slots]
                                             for state in self.request.query_state()})
        del self.rows[index]
        if not self.rows:
            self.request.reset_state()
            self.mask = np.zeros((0, 0), dtype=np.int64)
            return
        mask = np.delete(self.mask, index, axis=0)
        kept = np.flatnonzero(mask.any(axis=0))
        for state in self.request.query_state():  # [batch, kv heads, slots, head size]
            data = np.delete(state.state.data, index, axis=0)
            state.state = ov.Tensor(np.ascontiguousarray(data[:, :, kept]))
        self.mask = mask[:, kept]
        for other in self.rows:
            other.slots = np.searchsorted(kept, other.slots).tolist()


def _padded(cache: np.ndarray, width: int) -> np.ndarray:
    """A cache [batch, kv heads, slots, head size] widened to `width` slots by zeros at the end."""
    missing = width - cache.shape[2]
    if not missing:
        return cache
    return np.concatenate([cache, np.zeros((*cache.shape[:2], missing, *cache.shape[3:]), cache.dtype)], axis=2)
