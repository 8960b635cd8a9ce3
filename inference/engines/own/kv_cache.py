"""One answer's keys and values in one model's blocks (the KV manager of vLLM v1's engine): its block table, the
tokens it holds, and what a step asks of them. The main's and the draft's of an answer are each a PagedSequence.

- A prompt starts from the blocks the pool holds for its start (engines/own/block_pool.py), under the answer's cache
  scope, and the rest is read in chunks of the scheduler's budget (engines/own/scheduler.py), other answers stepping
  between two chunks.
- Rejected tokens are taken back by shortening the sequence: no copy, whatever the context (the next step writes over
  their slots).
- The main's sequence is `exact`: every query it makes holds two tokens at least (a lone token re-feeds the one
  before it), so the main alone's tokens, a verify's rows and a prompt's last row all run on the op's multi-token
  kernel and are bitwise alike whoever shares the step (docs/exactness.md#one-kernel-path); or, on a host where that
  costs less (engines/own/model_runner.py, `arranged`), every answer's token it feeds is a one-token sequence (a
  verify's, the main alone's, an earlier answer's in a prompt), a prompt's text queries (engines/own/answer_layout.py),
  alike too. The draft only proposes: its steps feed what they have.
- When the answer ends, its full blocks are cached under their hashes for the conversation's next turn, and every
  block goes back to the pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from inference.engines.own.answer_layout import one_token_layout
from inference.engines.own.block_pool import block_hashes, scope_root
from inference.engines.own.model_runner import ModelRunner, Preempted, Work
from inference.engines.own.scheduler import Scheduler

if TYPE_CHECKING:
    from inference.engines.own.draft_head import DraftHead

ProgressCallback = Callable[[int, int], object]  # (prompt tokens in the cache so far, prompt tokens)


class PagedModel:
    """A compiled model as the engine runs it: its runner (cache tensors, pool) and its scheduler; `head`, a draft's
    cut head whose rows are widened back to the whole vocabulary."""

    def __init__(self, runner: ModelRunner, *, head: DraftHead | None = None, caching: bool = True):
        self.runner, self.pool, self.head = runner, runner.pool, head
        self.caching = caching  # full blocks kept for prompts to come (off: every prompt read whole)
        self.scheduler = Scheduler(runner)
        self._reading = 0  # prompts being read now
        self._read = threading.Condition()
        self._on_reading: list[Callable[[], object]] = []  # called as a prompt starts being read
        self.answer_opener: tuple[int, ...] = ()  # the main's: where its template opens an answer (answer_layout.py)
        self.answer_ends: frozenset[int] = frozenset()

    def yield_to(self, other: PagedModel) -> None:
        """This model's work that can wait (a prefill given a `pause`) gives way to `other`'s prompts: it does not
        start while one is read, and one starting cancels it; it is run again after (engines/own/scheduler.py)."""
        self.scheduler.yields_while = lambda: bool(other._reading)
        other._on_reading.append(self.scheduler.preempt)

    @contextmanager
    def reading_prompt(self) -> Iterator[None]:
        with self._read:
            self._reading += 1
        for preempt in self._on_reading:
            preempt()
        try:
            yield
        finally:
            with self._read:
                self._reading -= 1
                self._read.notify_all()

    def prompts_read(self, *, timeout: float) -> None:
        """Once no prompt of this model is being read (at most `timeout` seconds): work that can wait yields to a
        user waiting for a first token."""
        with self._read:
            self._read.wait_for(lambda: not self._reading, timeout=timeout)

    def sequence(self, *, scope: str = "", exact: bool = False) -> PagedSequence:
        return PagedSequence(self, scope=scope, exact=exact)

    def one_token_layout(self, token_ids: list[int]) -> list[bool]:
        """Which of these tokens an exact sequence computes as one-token sequences (engines/own/answer_layout.py): none
        where the main's rows are queries, every one where its template opens no answer."""
        if not self.runner.steady.token_rows:
            return [False] * len(token_ids)
        if not self.answer_opener:
            return [True] * len(token_ids)
        return one_token_layout(token_ids, opener=self.answer_opener, ends=self.answer_ends)

    def hashes(self, token_ids: list[int], scope: str) -> list[bytes]:
        return block_hashes(token_ids, block_tokens=self.pool.block_tokens, scope=scope)

    def cached_tokens(self, token_ids: list[int], scope: str) -> int:
        """How many of the first tokens a prefill of `token_ids` would find cached (its last token is always fed)."""
        return len(self.pool.cached_prefix(self.hashes(token_ids[:-1], scope), hold=False)) * self.pool.block_tokens


class PagedSequence:
    """One answer's cache in one model: `position` tokens in the blocks of `block_table`."""

    def __init__(self, model: PagedModel, *, scope: str, exact: bool):
        self.model, self.scope, self.exact = model, scope, exact
        self.block_table: list[int] = []
        self.tokens: list[int] = []  # whose keys and values the blocks hold, in order
        self.one_token: list[bool] = []  # for each, whether it was computed as a one-token sequence
        self.cached = 0  # the prompt's tokens its prefill found in the pool
        self.drafting = False  # the main's sequence of an answer that speculates: its steps come between drafts
        self._cached_blocks = 0  # the leading blocks already findable by hash

    @property
    def position(self) -> int:
        return len(self.tokens)

    def prefill(self, prompt_ids: list[int], *, on_chunk: ProgressCallback | None = None,
                pause: Callable[[], object] | None = None) -> np.ndarray:
        """The prompt after the blocks the pool holds for its start: the last token's logits [1, vocabulary].
        `pause`, called before each chunk, holds back a read that can wait (its chunks yield to the prompts of the
        model it yields to: PagedModel.yield_to)."""
        if self.tokens:
            raise ValueError("a sequence reads one prompt, first")
        pool, n = self.model.pool, len(prompt_ids)
        hashes = self.model.hashes(prompt_ids, self.scope)
        layout = self.layout(prompt_ids)
        found = pool.cached_prefix(hashes[: (n - 1) // pool.block_tokens], hold=True) if self.model.caching else []
        self.block_table, self._cached_blocks = found, len(found)
        self.tokens = prompt_ids[: len(found) * pool.block_tokens]
        before = hashes[len(found) - 1] if found else scope_root(self.scope)
        if self.model.caching and (tail := pool.take_tail(after=before, tokens=prompt_ids[self.position:n - 1])):
            self.block_table.append(tail[0])  # the last turn's partly filled block: its tokens are not read again
            self.tokens = prompt_ids[: self.position + tail[1]]
        self.one_token = layout[: self.position]  # what is cached was computed so (_cacheable)
        self.cached = len(self.tokens)
        pool.count_lookup(queried=n, hit=self.cached)
        self.reserve(n)  # the whole prompt's blocks at once: one that cannot fit fails before it evicts anything
        scheduler = self.model.scheduler
        logits = None
        with self.model.reading_prompt():
            while self.position < n:
                if pause is not None:
                    pause()
                end = self._chunk_end(layout, scheduler.chunk_budget(self))
                try:
                    logits = self.feed(prompt_ids[self.position:end], rows=1, layout=layout[self.position:end],
                                       yields=pause is not None, long_read=n - end >= scheduler.chunk_tokens)
                except Preempted:
                    continue  # read again once the prompt it gave way to is read (`pause`)
                if on_chunk is not None:
                    on_chunk(self.position, n)
        self._cache_full_blocks(hashes, cacheable=self.position)  # read as its layout says
        assert logits is not None
        return logits

    def _chunk_end(self, layout: list[bool], budget: int) -> int:
        """Where a prompt's chunk from here ends: within the budget, before an answer that follows a query (one-token
        sequences reading keys and values a query wrote in the same inference compute otherwise: they come next),
        and never after a query's lone first token (cut from the rest of its query: it starts the next chunk)."""
        start, n = self.position, len(layout)
        end = min(start + budget, n)
        end = next((j for j in range(start + 1, end) if layout[j] and not layout[j - 1]), end)
        if end < n and end - 1 > start and not layout[end - 1] and not layout[end] and layout[end - 2]:
            end -= 1
        return end

    def feed(self, token_ids: list[int], *, rows: int | None = None, layout: list[bool] | None = None,
             yields: bool = False, long_read: bool = False) -> np.ndarray:
        """Logits for the last `rows` fed tokens (each one's on the main, the last one's on the draft; a prompt's
        chunk names its one row); `layout`: a prompt chunk's, which tokens are answers' (`layout`), else every fed
        token is, as an answer's own; `yields`: work that can wait (Preempted, the sequence unchanged); `long_read`:
        a chunk with a full chunk of the prompt after it (engines/own/scheduler.py)."""
        self.reserve(self.position + len(token_ids))
        scheduler = self.model.scheduler
        token_rows = self.exact and self.model.runner.steady.token_rows
        layout = layout if layout is not None and token_rows else [token_rows] * len(token_ids)
        logits = scheduler.infer(self.work(token_ids, rows=rows, layout=layout), member=self, drafting=self.drafting,
                                 yields=yields, long_read=long_read)
        self.tokens += token_ids
        self.one_token += layout
        head = self.model.head
        return logits if head is None else np.stack([head.widen(row) for row in logits])

    def layout(self, token_ids: list[int]) -> list[bool]:
        """Which of a prompt's tokens this sequence computes as one-token sequences (engines/own/answer_layout.py):
        none on the draft, which only proposes."""
        return self.model.one_token_layout(token_ids) if self.exact else [False] * len(token_ids)

    def work(self, token_ids: list[int], *, rows: int | None = None, layout: list[bool] | None = None) -> Work:
        """The runner's work a feed of these tokens makes, in the arrangement of the main's rows (its blocks
        reserved: `reserve`); `layout`: which are one-token sequences (all where the main's rows are so arranged)."""
        token_rows = self.exact and self.model.runner.steady.token_rows
        rows = rows or (len(token_ids) if self.exact else 1)
        past, fed = self.position, token_ids
        if token_rows and layout is not None and not all(layout):
            arranged = tuple(layout)
            if past and not arranged[0] and (len(arranged) == 1 or arranged[1]) and not self.one_token[-1]:
                # a query of one token, the rest of its query before it: re-fed with the one before, as below
                past, fed, arranged = past - 1, [self.tokens[-1], *token_ids], (False, *arranged)
            return Work(self.block_table, past, fed, rows, arranged)
        if self.exact and len(token_ids) == 1 and past and not token_rows:
            past, fed = past - 1, [self.tokens[-1], *token_ids]  # re-fed: the multi-token kernel, as a verify's
        return Work(self.block_table, past, fed, rows, token_rows)

    def drop_last(self, n: int) -> None:
        """The last n fed tokens were rejected: the sequence ends before them, its blocks beyond given back."""
        if not n:
            return
        del self.tokens[-n:]
        del self.one_token[-n:]
        needed = -(-self.position // self.model.pool.block_tokens)
        if len(self.block_table) > needed:
            self.model.pool.release(self.block_table[needed:])
            del self.block_table[needed:]

    def close(self, *, keep_ids: list[int] | None = None) -> None:
        """The answer is over: its full blocks cached (where `keep_ids`, the answer's tokens, say what they hold),
        every block given back."""
        if keep_ids is not None and self.tokens[: len(keep_ids)] == keep_ids[: self.position]:
            # An answer can end inside a verify's accepted run (an end of answer among the proposals): what was fed
            # past its end is not the conversation's
            self.drop_last(max(self.position - len(keep_ids), 0))
            hashes = self.model.hashes(self.tokens, self.scope)
            cacheable = self._cacheable()
            self._cache_full_blocks(hashes, cacheable=cacheable)
            self._keep_tail(hashes, cacheable=cacheable)
        self.model.pool.release(self.block_table)
        self.block_table, self.tokens, self.one_token = [], [], []
        self.model.scheduler.leave(self)

    def reserve(self, tokens: int) -> None:
        """Blocks for `tokens` tokens in all (taken before a feed; a measurement takes them to step past the
        scheduler)."""
        needed = -(-tokens // self.model.pool.block_tokens) - len(self.block_table)
        if needed > 0:
            self.block_table += self.model.pool.allocate(needed)

    def _keep_tail(self, hashes: list[bytes], *, cacheable: int) -> None:
        """The last, partly filled block kept as the pool's tail after the full ones (`hashes`): a follow-up that
        continues these tokens takes it over and reads only what is new."""
        full, size = len(hashes), self.model.pool.block_tokens
        if (self.model.caching and self.position > full * size and len(self.block_table) > full
                and cacheable == self.position):
            self.model.pool.keep_tail(self.block_table[full], after=hashes[-1] if hashes else scope_root(self.scope),
                                      tokens=self.tokens[full * size:])

    def _cacheable(self) -> int:
        """How many leading tokens were computed as the layout says a cold read computes them (an answer fed after no
        opener was not: a raw completion's), which blocks holding them may be cached."""
        if not self.exact:
            return self.position
        expected = self.layout(self.tokens)
        return next((i for i, (was, cold) in enumerate(zip(self.one_token, expected, strict=True)) if was != cold),
                    self.position)

    def _cache_full_blocks(self, hashes: list[bytes], *, cacheable: int) -> None:
        """Cache the full blocks among the first `cacheable` tokens (`_cacheable`)."""
        size = self.model.pool.block_tokens
        full = min(len(hashes), self.position // size, cacheable // size) if self.model.caching else 0
        if full > self._cached_blocks:
            self.model.pool.cache(self.block_table[self._cached_blocks:full], hashes[self._cached_blocks:full])
            self._cached_blocks = full
