"""One inference of one model on the PagedAttention op (engines/own/paged_model.py), for every sequence a step holds:
the op's inputs filled as openvino-genai's `model_runner.hpp` fills them, and the rows of logits each sequence reads.

The cache tensors are made once, sized by the model's block pool (engines/own/block_pool.py), and set on the one
infer request; the op writes each new token's keys and values into the block its sequence's table names.

On some hosts a row's bits depend on how many rows the inference holds: on AVX2 (AMD Zen 3, where the CPU plugin has
no dynamic quantization) the main's matrix products round one way for 2-4 tokens and another for 5-80, and its head
one way for one row and another for several, so a verify of K+1 would part from the main alone's 2-token query.
`steady_rows` finds, at load, the fewest tokens and rows from which a row's bits stop changing, and `run` pads a
smaller step up to them with a filler nobody reads (docs/exactness.md#avx2-hosts).

The main's rows can be arranged two exact ways (docs/exactness.md#one-kernel-path): each step of an answer one
sequence (the main alone's token as a 2-token query, a verify as one query of K+1, a prompt's chunk as one query), or
every answer's token a one-token sequence of its own on the answer's blocks (`Work.token_rows`), earlier answers in a
prompt too, the prompt's text as queries (engines/own/answer_layout.py): a token's keys and values depend on the
kernel its attention ran on, so a conversation read again from the cache and read cold stay alike only if every token
of both ran on the same one, and a step of fewer one-token sequences than the kernel's threads gets a filler, else
the kernel takes a path of its own that sums a long context otherwise. Their
costs differ by host: `arranged` probes both at load and keeps the second where it costs less (on AVX2 a lone token
0.85x, four answers' tokens at once 0.6x, a verify of 9 1.07x, a prompt 1.1x), unless the operator asks for one
(SPECCHAT_MAIN_ROWS).
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import openvino as ov

from inference.engines.own.block_pool import BlockPool
from inference.engines.own.paged_model import LOGITS_INDICES, cache_layout

log = logging.getLogger(__name__)
# The step sizes `steady_rows` compares a row at; the largest is the reference (well below a verify beside a few
# others): tokens fed, and rows of logits read (through the head)
PROBED_TOKENS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 32)
PROBED_ROWS = (1, 2, 3, 4, 6, 8)
# ... and from there up, the steps a prompt's chunk makes (where the fewest are not 1: the kernels depend on the size)
PROBED_MOST = (48, 64, 80, 96, 128, 256, 512)
# How `arranged` times the two arrangements: after this many tokens of context, medians of so many interleaved rounds
# of a lone answer's token, four answers' tokens at once, a verify of VERIFIED tokens and a prompt's chunk (of at most
# PROMPT_CHUNK tokens)
ARRANGEMENT_CONTEXT, ARRANGEMENT_ROUNDS, VERIFIED, PROMPT_CHUNK = 256, 7, 9, 64


class Steady(NamedTuple):
    """The fewest tokens a step feeds and rows it reads for a row's bits not to depend on the step's size, and the
    most tokens it may feed for that (0: any)."""

    tokens: int = 1
    rows: int = 1
    most_tokens: int = 0
    token_rows: bool = False  # every token the main feeds is a one-token sequence (Work.token_rows)


ANY_SIZE = Steady()  # one computation at every step size (AVX-512 hosts)


class Preempted(Exception):
    """An inference of work that can wait, not run or cancelled (`ModelRunner.preempt`) for a user's prompt: nothing
    it would have given is read, and the keys and values it wrote lie past its sequence's end, written over when the
    work is run again."""


@dataclass
class Work:
    """One sequence's part of a step: `tokens` after the `past` it has in the blocks of `block_table`, and how many
    of the last fed tokens get a row of logits."""

    block_table: list[int]
    past: int
    tokens: list[int]
    rows: int = 1
    # each token a one-token sequence of its own on these blocks, the last `rows` read; or, token by token, which
    # are (the others, each run of them one query: engines/own/answer_layout.py)
    token_rows: bool | tuple[bool, ...] = False

    def split(self) -> list[Work]:
        """The sequences the op is given for it."""
        n = len(self.tokens)
        layout = self.token_rows if isinstance(self.token_rows, tuple) else (self.token_rows,) * n
        if not any(layout):
            return [self]
        works, first, read_from = [], 0, n - self.rows
        for one_token, run in itertools.groupby(range(n), key=layout.__getitem__):
            end = first + len(list(run))
            if one_token:
                works += [Work(self.block_table, self.past + i, [self.tokens[i]], int(i >= read_from))
                          for i in range(first, end)]
            else:
                works.append(Work(self.block_table, self.past + first, self.tokens[first:end],
                                  max(end - max(first, read_from), 0)))
            first = end
        return works


def kernel_threads(compiled: ov.CompiledModel) -> int:
    """The threads of the stream an inference runs on: the PagedAttention kernel takes its one-token path
    (`exec_loop_bhl`) for a step of one-token sequences fewer than these (a model compiled for several streams
    splits the host's threads between them); a device that does not say is taken to have more threads than any step
    has sequences (its fillers are of two tokens, which keep a step on the mixed path whatever the threads)."""
    try:
        streams = int(compiled.get_property("NUM_STREAMS"))
        return max(int(compiled.get_property("INFERENCE_NUM_THREADS")) // max(streams, 1), 1)
    except (RuntimeError, TypeError, ValueError):
        return 2**31


class ModelRunner:
    """One compiled model, its cache tensors and its block pool; `run` is called by one thread at a time (the
    model's scheduler, engines/own/scheduler.py)."""

    def __init__(self, compiled: ov.CompiledModel, *, pool_bytes: int, steady: Steady = ANY_SIZE):
        self.compiled = compiled
        self.layout = cache_layout(compiled)
        blocks = max(pool_bytes // self.layout.block_bytes, 1)
        self.pool = BlockPool(blocks=blocks, block_tokens=self.layout.block_tokens,
                              block_bytes=self.layout.block_bytes)
        self.request = compiled.create_infer_request()
        self.cache = self.layout.tensors(blocks + 1)
        self.scratch = blocks  # a block past the pool's, which a step's filler writes (see run)
        for name, tensor in self.cache.items():
            self.request.set_tensor(name, tensor)
        self.steady = steady  # a step feeds and reads at least so many (padded): see steady_rows
        self.threads = kernel_threads(compiled)
        self._yielding = threading.Lock()  # held while an inference that yields (run's `yields_while`) starts or ends
        self._yields_now = False  # one is under way
        self._preempted = False
        self.gave_way = 0  # inferences that yielded: not started, or cancelled

    def arranged(self, *, token_rows: bool | None = None, prompts_as_queries: bool = False) -> Steady:
        """The arrangement of the main's rows this host runs cheaper, with its steady sizes: one-token sequences where
        four answers' tokens at once cost 10% less than as queries, a lone answer's token and a verify (what it
        speculates with) no more than 10% more, and a prompt no more than 15% more (unless `prompts_as_queries`: the
        pair's prompts' text is read as queries either way, engines/own/answer_layout.py): margins wider than a shared
        host's drift between two probes (asked at load, before any answer); `token_rows` says which, whatever the
        costs."""
        query, tokens = self.steady_rows(token_rows=False), self.steady_rows(token_rows=True)
        # a step holds one-token sequences and a filler's query: the sizes that keep both kinds of row alike
        most = min((each.most_tokens for each in (query, tokens) if each.most_tokens), default=0)
        tokens = Steady(max(query.tokens, tokens.tokens), max(query.rows, tokens.rows), most, token_rows=True)
        if token_rows is None:
            costs = self._arrangement_costs(query, tokens)
            shown = [[round(cost, 4) for cost in costs[each]] for each in (query, tokens)]
            log.info("the main's rows as queries, as one-token sequences: %s, %s s (a lone answer's token, four "
                     "answers' at once, a verify of %d, a prompt's chunk)", *shown, VERIFIED)
            lone, batch, verify, prompt = (costs[tokens][i] / costs[query][i] for i in range(4))
            token_rows = batch < 0.9 and lone <= 1.1 and verify <= 1.1 and (prompts_as_queries or prompt <= 1.15)
            if token_rows and not self.alike_as_tokens(tokens):
                log.warning("one-token sequences cost less here but part a verify's rows from the main alone's: "
                            "the main's rows run as queries")
                token_rows = False
        return tokens if token_rows else query

    def alike_as_tokens(self, tokens: Steady) -> bool:
        """Whether one-token sequences give a verify's tokens, and a token beside a verify, the rows the main alone
        gives them, bitwise: every verify up to VERIFIED tokens, after prompts of three lengths around the blocks'
        ends. Not on every host and configuration: on an Intel Xeon (family 6 model 167) with dynamic quantization
        they parted by up to 0.2; on an AMD EPYC Zen 4 in bf16, verifies of 4 tokens and more after some prompts and
        not others (docs/exactness.md). Queries hold on both."""
        size = self.block_tokens
        lengths = [min(length, tokens.most_tokens or length) for length in (size + 8, 2 * size - 3, 3 * size + 4)]
        per_table = -(-(max(lengths) + VERIFIED) // size)
        blocks = self.pool.allocate(min(3 * per_table, self.pool.blocks))
        if len(blocks) < 3 * per_table:
            self.pool.release(blocks)
            return False  # a pool too small to tell: the arrangement every host computes alike
        verified, alone, beside = (blocks[i * per_table:(i + 1) * per_table] for i in range(3))
        fed = [21 + i for i in range(VERIFIED)]
        kept, self.steady = self.steady, tokens
        try:
            for length in lengths:
                prompt = [11 + i % 50 for i in range(length)]
                for table in (verified, alone, beside):
                    self.run([Work(table, 0, prompt, 1, token_rows=True)])
                one_by_one = np.concatenate([self.run([Work(alone, length + i, [token], 1, token_rows=True)])[0]
                                             for i, token in enumerate(fed)])
                for n in range(1, VERIFIED + 1):  # each verify writes over the one before: the same positions
                    together = self.run([Work(verified, length, fed[:n], n, token_rows=True),
                                         Work(beside, length, fed[:1], 1, token_rows=True)])
                    if not (np.array_equal(together[0], one_by_one[:n])
                            and np.array_equal(together[1], one_by_one[:1])):
                        return False
            return True
        finally:
            self.steady = kept
            self.pool.release(blocks)

    def _arrangement_costs(self, *arrangements: Steady) -> dict[Steady, list[float]]:
        """Median seconds of a lone answer's token, four answers' tokens, a verify of VERIFIED and a prompt's chunk,
        in each."""
        per_answer = -(-(ARRANGEMENT_CONTEXT + max(VERIFIED, PROMPT_CHUNK)) // self.block_tokens)
        blocks = self.pool.allocate(min(4 * per_answer, self.pool.blocks))
        tables = [blocks[i * per_answer:(i + 1) * per_answer] for i in range(len(blocks) // per_answer)] or [blocks]
        past = min(ARRANGEMENT_CONTEXT, len(tables[0]) * self.block_tokens - max(VERIFIED, PROMPT_CHUNK))
        kept = self.steady

        def steps(arranged: Steady) -> list[list[Work]]:
            one = [9] if arranged.token_rows else [9, 9]  # a token, or as a query with the one before it re-fed
            start, chunk = past - len(one) + 1, min(PROMPT_CHUNK, arranged.most_tokens // 2 or PROMPT_CHUNK)
            return [[Work(tables[0], start, one, 1, arranged.token_rows)],
                    [Work(table, start, one, 1, arranged.token_rows) for table in tables],
                    [Work(tables[0], past, [9] * VERIFIED, VERIFIED, arranged.token_rows)],
                    [Work(tables[0], past, [9] * chunk, 1, arranged.token_rows)]]

        seconds: dict[Steady, list[list[float]]] = {arranged: [[], [], [], []] for arranged in arrangements}
        try:
            for _ in range(ARRANGEMENT_ROUNDS + 1):  # the first round compiles the shapes: not counted
                for arranged in arrangements:
                    self.steady = arranged
                    for timed, works in zip(seconds[arranged], steps(arranged), strict=True):
                        began = time.perf_counter()
                        self.run(works)
                        timed.append(time.perf_counter() - began)
        finally:
            self.steady = kept
            self.pool.release(blocks)
        return {arranged: [statistics.median(each[1:]) for each in timed] for arranged, timed in seconds.items()}

    def steady_rows(self, *, token_rows: bool = False) -> Steady:
        """The fewest tokens and rows an inference must hold for a sequence's row to come out bitwise alike at any
        size up to the largest probed, and where the steps holding more than that change it: a 2-token query (or one
        token, its own sequence), the rest a filler, in blocks of the pool (asked at load, before any answer)."""
        blocks = self.pool.allocate(min(1 + -(-PROBED_MOST[-1] // self.block_tokens), self.pool.blocks))
        try:
            return self._steady(blocks[0], blocks[1:], first=[11] if token_rows else [11, 13])
        finally:
            self.pool.release(blocks)

    def _steady(self, probe: int, filler: list[int], *, first: list[int]) -> Steady:
        token_rows = len(first) == 1

        def row(tokens: int, rows: int) -> bytes:
            works = [Work([probe], 0, first, 1)]
            if tokens > len(first):
                works.append(Work(filler, 0, [17] * (tokens - len(first)), min(rows - 1, tokens - len(first))))
            return self._infer(works)[0].tobytes()

        def fewest(sizes: tuple[int, ...], at: Callable[[int], bytes]) -> int:
            reference, steady = at(sizes[-1]), sizes[-1]
            for size in reversed(sizes[:-1]):
                if at(size) != reference:
                    break
                steady = size
            return 1 if steady == sizes[0] else steady

        rows = fewest(PROBED_ROWS, lambda rows: row(PROBED_TOKENS[-1], rows))
        tokens = fewest(tuple(n for n in PROBED_TOKENS if n >= len(first)), lambda tokens: row(tokens, rows))
        if (tokens, rows) == (1, 1):
            return Steady(token_rows=token_rows)  # one computation at every size: prompts are read in full chunks
        reference, most = row(PROBED_TOKENS[-1], rows), PROBED_TOKENS[-1]
        for size in PROBED_MOST:
            if size - len(first) > self.block_tokens * len(filler) or row(size, rows) != reference:
                break
            most = size
        return Steady(tokens=tokens, rows=rows, most_tokens=most, token_rows=token_rows)

    @property
    def block_tokens(self) -> int:
        return self.layout.block_tokens

    def run(self, works: list[Work], *, yields_while: Callable[[], bool] | None = None) -> list[np.ndarray]:
        """Each work's rows of logits [rows, vocabulary], from one inference holding the steady tokens and rows.
        `yields_while`: the works can wait, and give way (Preempted) while it is true, before the inference or, at
        `preempt`, during it."""
        rows = self.steady.rows - sum(work.rows for work in works)
        tokens = max(self.steady.tokens - sum(len(work.tokens) for work in works), rows, 0)
        splits = [work.split() for work in works]
        parts = [part for split in splits for part in split]
        if self.steady.token_rows and len(parts) < self.threads and all(len(part.tokens) == 1 for part in parts):
            # The main's one-token sequences only, fewer than the kernel's threads: it would take its other path
            # (`exec_loop_bhl`), which sums a long context's blocks otherwise. A filler of one more sequence, or of two
            # tokens, keeps the step on the mixed path every verify runs on (docs/exactness.md#one-kernel-path).
            tokens = max(tokens, 1 if len(parts) + 1 >= self.threads else 2)
        filler = [Work([self.scratch], 0, [0] * tokens, max(rows, 0))] if tokens else []
        answers, first = self._infer(parts + filler, yields_while), 0
        joined = []
        for split in splits:
            joined.append(answers[first] if len(split) == 1 else np.concatenate(answers[first:first + len(split)]))
            first += len(split)
        return joined

    def preempt(self) -> None:
        """Cancel the inference under way if it yields (run's `yields_while`): the CPU plugin stops it between two
        of the graph's nodes, within 20-100 ms on the demo main, and the request infers as before after it."""
        with self._yielding:
            if self._yields_now:
                self._preempted = True
                self.request.cancel()

    def _infer_yielding(self, inputs: dict, yields_while: Callable[[], bool]) -> None:
        with self._yielding:
            if yields_while():
                self.gave_way += 1
                raise Preempted
            self._yields_now, self._preempted = True, False
            self.request.start_async(inputs)
        try:
            self.request.wait()
        except RuntimeError:
            if self._preempted:
                self.gave_way += 1
                raise Preempted from None
            raise
        finally:
            with self._yielding:
                self._yields_now = False

    def _infer(self, works: list[Work], yields_while: Callable[[], bool] | None = None) -> list[np.ndarray]:
        size = self.block_tokens
        lengths = [len(work.tokens) for work in works]
        begins = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tables = [work.block_table[: -(-(work.past + n) // size)] for work, n in zip(works, lengths, strict=True)]
        table_begins = np.concatenate([[0], np.cumsum([len(table) for table in tables])]).astype(np.int32)
        rows = np.concatenate([np.arange(end - work.rows, end) for work, end in zip(works, begins[1:], strict=True)])
        inputs = {
            "input_ids": np.concatenate([np.asarray(work.tokens, dtype=np.int64) for work in works]),
            "position_ids": np.concatenate([np.arange(work.past, work.past + n, dtype=np.int64)
                                            for work, n in zip(works, lengths, strict=True)]),
            "past_lens": np.array([work.past for work in works], dtype=np.int32),
            "subsequence_begins": begins,
            "block_indices": np.concatenate([np.asarray(table, dtype=np.int32) for table in tables]),
            "block_indices_begins": table_begins,
            "max_context_len": np.array(max(work.past + n for work, n in zip(works, lengths, strict=True)),
                                        dtype=np.int32),
            LOGITS_INDICES: rows.astype(np.int64),
        }
        if yields_while is None:
            self.request.infer(inputs)
        else:
            self._infer_yielding(inputs, yields_while)
        logits = self.request.get_output_tensor(0).data  # [rows, 1, vocabulary]
        answers, first = [], 0
        for work in works:
            answers.append(logits[first:first + work.rows, 0].copy())
            first += work.rows
        return answers
