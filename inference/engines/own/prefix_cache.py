"""One model's prefix cache on the own engine: KV blocks of a fixed number of tokens, keyed by every token before
them, shared by every answer the engine serves (a conversation's next turn, the same system prompt or pasted file
in another conversation or another user's), bounded in bytes, least recently used evicted first.

A prompt is prefilled in chunks of BLOCK_TOKENS on a grid from its first token, and each chunk it completes is kept
as a block: a new prompt restores the longest run of kept blocks it starts with and prefills only the rest, chunk by
chunk. Because the grid is fixed, a prompt whose kept blocks came from prefills computes bitwise what a cold prefill
of it computes (a first chunk, with no cache before it, runs other attention kernels than a later one: chunks cut
elsewhere parted the real pair's greedy answers). An answer's tokens are kept too when it ends (`keep`): the next turn
reads only its own question and the tokens of the last block the answer left partial. Those blocks hold what the
decoding computed, which can differ from a prefill's in the last bits, so a warm follow-up and a cold one may part at
a near-tie, as in every server with a prefix cache; speculation and the main alone read the same blocks, so they give
the same answer (docs/exactness.md#the-prefix-cache).

Between chunks other answers' inferences take their turn on the CPU, so one long prompt does not stall the other
streams; `on_chunk` hears how far a prefill got (the chat shows "Reading the prompt 40%").
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import openvino as ov

from inference.engines.own.stepped_model import step_inputs

BLOCK_TOKENS = 64  # a block, and a prefill's chunk: short enough that other streams step between two and that a
# follow-up reads little of the turn before again, long enough that a chunked prefill costs next to a whole one

ProgressCallback = Callable[[int, int], object]  # (prompt tokens in the cache so far, prompt tokens)


@dataclass
class PrefixCacheStats:
    """vLLM's counters: prompt tokens asked for and found in the cache, and what it holds."""

    queries: int = 0
    hits: int = 0
    blocks: int = 0
    bytes: int = 0
    evicted_blocks: int = 0


def _block_key(parent: bytes, tokens: list[int]) -> bytes:
    return hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=16, key=parent).digest()


class PrefixCache:
    """The blocks of one compiled model, least recently used first; `capacity_bytes` 0 keeps none."""

    def __init__(self, *, capacity_bytes: int, block_tokens: int = BLOCK_TOKENS):
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[bytes, dict[str, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = PrefixCacheStats()

    def keys(self, token_ids: list[int]) -> list[bytes]:
        """The keys of the whole blocks `token_ids` spans, in order."""
        keys, parent = [], b""
        for start in range(0, len(token_ids) - self.block_tokens + 1, self.block_tokens):
            parent = _block_key(parent, token_ids[start:start + self.block_tokens])
            keys.append(parent)
        return keys

    def cached_tokens(self, token_ids: list[int]) -> int:
        """How many of the first tokens a prefill of `token_ids` would find kept (its last token is always fed)."""
        with self._lock:
            found = 0
            for key in self.keys(token_ids[:-1]):
                if key not in self._blocks:
                    break
                found += 1
        return found * self.block_tokens

    def prefill(self, request: ov.InferRequest, prompt_ids: list[int], *,
                on_chunk: ProgressCallback | None = None) -> tuple[np.ndarray, int]:
        """The last prompt token's logits [1, vocabulary] and how many prompt tokens came from the cache;
        `request` (fresh or reset) then holds the prompt."""
        n, size = len(prompt_ids), self.block_tokens
        keys = self.keys(prompt_ids)
        with self._lock:
            found: list[dict[str, np.ndarray]] = []
            for key in keys[: (n - 1) // size]:  # the last token is fed, for its logits
                if (block := self._blocks.get(key)) is None:
                    break
                found.append(block)
            self.stats.queries += n
            self.stats.hits += len(found) * size
        start = len(found) * size
        if found:
            for state in request.query_state():
                state.state = ov.Tensor(np.concatenate([block[state.name] for block in found], axis=2))
        for chunk in range(start, n, size):
            end = min(chunk + size, n)
            request.infer(step_inputs(np.array([prompt_ids[chunk:end]], dtype=np.int64),
                                      positions=np.arange(chunk, end, dtype=np.int64)[None],
                                      attention_mask=np.ones((1, end), dtype=np.int64), rows=1))
            if on_chunk is not None:
                on_chunk(end, n)
        logits = request.get_output_tensor(0).data[0].copy()
        if self.capacity_bytes and len(keys) > len(found):
            states = {state.name: state.state.data for state in request.query_state()}
            self._store(keys, prompt_ids, states, first=len(found))
        with self._lock:
            self._touch(keys[: len(found)])
        return logits, start

    def keep(self, token_ids: list[int], cache: dict[str, np.ndarray]) -> None:
        """An answer's live cache, which holds `token_ids` (at least), kept block by block."""
        if not self.capacity_bytes:
            return
        slots = next(iter(cache.values())).shape[2] if cache else 0
        token_ids = token_ids[:slots]
        keys = self.keys(token_ids)
        with self._lock:
            first = next((index for index, key in enumerate(keys) if key not in self._blocks), len(keys))
            self._touch(keys[:first])
        self._store(keys, token_ids, cache, first=first)

    def _store(self, keys: list[bytes], token_ids: list[int], states: dict[str, np.ndarray], *, first: int) -> None:
        size = self.block_tokens
        new = {keys[index]: {name: np.ascontiguousarray(data[:, :, index * size:(index + 1) * size])
                             for name, data in states.items()}
               for index in range(first, len(keys))}
        with self._lock:
            for key, block in new.items():
                if key not in self._blocks:
                    self._blocks[key] = block
                    self.stats.blocks += 1
                    self.stats.bytes += sum(data.nbytes for data in block.values())
            self._touch(keys)
            while self.stats.bytes > self.capacity_bytes and self._blocks:
                _, block = self._blocks.popitem(last=False)
                self.stats.blocks -= 1
                self.stats.evicted_blocks += 1
                self.stats.bytes -= sum(data.nbytes for data in block.values())

    def _touch(self, keys: list[bytes]) -> None:
        """Most recently used, the first blocks last: a prefix outlives the blocks that follow it (eviction takes the
        ends of runs first, never a block whose followers would then be unreachable before them)."""
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)


def kv_bytes_per_token(compiled: ov.CompiledModel) -> int:
    """What one token's keys and values take in the cache of `compiled` (a stateful IR), read off a one-token
    inference."""
    request = compiled.create_infer_request()
    request.infer(step_inputs(np.zeros((1, 1), dtype=np.int64), positions=np.zeros((1, 1), dtype=np.int64),
                              attention_mask=np.ones((1, 1), dtype=np.int64), rows=1))
    return sum(state.state.data.nbytes for state in request.query_state())
