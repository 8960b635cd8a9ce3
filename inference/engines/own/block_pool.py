"""One model's KV blocks on the own engine, as vLLM v1's BlockPool keeps them: a fixed number of blocks of the model's
cache tensors (engines/own/paged_model.py), handed to sequences by block table, ref-counted, and the pool's prefix
cache at once.

A full block is known by the hash of its tokens chained to every token before it (`block_hashes`), so a prompt that
starts as an earlier one did finds those blocks and shares them by block table: no copy, no prefill. A partly filled
block is never shared (the op zeroes the rest of a multi-token sequence's last block: docs/exactness.md); an
answer's last, partly filled block is kept as its tail instead, found by the hash before it, and taken over whole by
the next prompt that continues its tokens, a chat's follow-up, so that it reads only its own question. A block no
sequence holds stays cached until its slot is needed: the least recently freed goes first, the ends of a
conversation before its start.

The hash chain is keyed by a scope: a user's (the chat's account, the API key's owner), so one user's blocks never
tell another what was sent (neither `cached_tokens` nor the first token's wait), as vLLM's `cache_salt` does; a
server that shares everything (SPECCHAT_PREFIX_CACHE_SCOPE=server) gives every request the empty scope. The function
needs no model: the web side can call it to route a turn to the worker holding its blocks.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


def block_hashes(token_ids: list[int], *, block_tokens: int, scope: str = "") -> list[bytes]:
    """The hashes of the full blocks `token_ids` spans, in order: each of its block's tokens and the hash before it,
    the first keyed by `scope`."""
    hashes = []
    parent = scope_root(scope)
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        parent = hashlib.blake2b(np.asarray(token_ids[start:start + block_tokens], dtype=np.int64).tobytes(),
                                 digest_size=16, key=parent).digest()
        hashes.append(parent)
    return hashes


def scope_root(scope: str) -> bytes:
    """What a scope's first block hash is chained to: the hash before its first block."""
    return hashlib.blake2b(scope.encode(), digest_size=16).digest() if scope else b""


class PoolFull(RuntimeError):
    """Every block is held by a running sequence: the answer asking for one more fails alone."""


@dataclass
class PoolStats:
    """vLLM's counters: prompt tokens looked up and found, and what the cache holds."""

    queries: int = 0
    hits: int = 0
    evicted_blocks: int = 0


class BlockPool:
    """`blocks` blocks of `block_tokens` tokens; thread-safe (each answer's thread takes and gives back its own)."""

    def __init__(self, *, blocks: int, block_tokens: int, block_bytes: int = 0):
        self.blocks, self.block_tokens, self.block_bytes = blocks, block_tokens, block_bytes
        self._refs = [0] * blocks
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._tails: dict[bytes, tuple[int, tuple[int, ...]]] = {}  # the hash before a tail -> its block, its tokens
        self._tail_after: dict[int, bytes] = {}
        # Blocks no sequence holds, the next to be taken first: never-cached ones, then the least recently freed
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(blocks))
        self._lock = threading.Lock()
        self.stats = PoolStats()

    @property
    def free_count(self) -> int:
        """Blocks no sequence holds (cached ones included: they are taken when needed)."""
        with self._lock:
            return len(self._free)

    @property
    def held_count(self) -> int:
        """Blocks running answers hold: none once every answer has ended (a block leaked would stay counted)."""
        with self._lock:
            return self.blocks - len(self._free)

    @property
    def cached_blocks(self) -> int:
        with self._lock:
            return len(self._block_of)

    def cached_hashes(self) -> list[bytes]:
        """The hashes of every block findable now: what a worker publishes for routing (serving/routing.py)."""
        with self._lock:
            return list(self._block_of)

    @property
    def cached_bytes(self) -> int:
        return self.cached_blocks * self.block_bytes

    def allocate(self, n: int) -> list[int]:
        """n blocks for a sequence to write, evicting cached ones no sequence holds, least recently freed first."""
        with self._lock:
            if n > len(self._free):
                raise PoolFull(f"the KV cache has {len(self._free)} free blocks of {self.blocks}, {n} asked: "
                               f"too many long answers at once for SPECCHAT_KV_POOL_MB")
            taken = []
            for _ in range(n):
                block, _ = self._free.popitem(last=False)
                if (old := self._hash_of.pop(block, None)) is not None:
                    del self._block_of[old]
                    self.stats.evicted_blocks += 1
                if (after := self._tail_after.pop(block, None)) is not None:
                    del self._tails[after]
                self._refs[block] = 1
                taken.append(block)
            return taken

    def cached_prefix(self, hashes: list[bytes], *, hold: bool) -> list[int]:
        """The blocks of the longest run of `hashes` the pool holds, from the first; `hold`: taken for a sequence
        (each block's ref count raised), else only looked at."""
        with self._lock:
            found = []
            for key in hashes:
                if (block := self._block_of.get(key)) is None:
                    break
                found.append(block)
            if hold:
                for block in found:
                    if self._refs[block] == 0:
                        del self._free[block]
                    self._refs[block] += 1
            return found

    def count_lookup(self, *, queried: int, hit: int) -> None:
        with self._lock:
            self.stats.queries += queried
            self.stats.hits += hit

    def cache(self, blocks: list[int], hashes: list[bytes]) -> None:
        """Full blocks a sequence holds, now findable by their hashes (a hash cached already keeps its block)."""
        with self._lock:
            for block, key in zip(blocks, hashes, strict=False):
                if key not in self._block_of and block not in self._hash_of:
                    self._block_of[key], self._hash_of[block] = block, key

    def keep_tail(self, block: int, *, after: bytes, tokens: list[int]) -> None:
        """A sequence's last, partly filled block, about to be released: findable by the hash before it (`after`)
        until its slot is taken, the newest tail after a hash replacing an older one."""
        with self._lock:
            if block in self._hash_of or block in self._tail_after or not tokens:
                return
            if (older := self._tails.pop(after, None)) is not None:
                del self._tail_after[older[0]]
            self._tails[after], self._tail_after[block] = (block, tuple(tokens)), after

    def take_tail(self, *, after: bytes, tokens: list[int]) -> tuple[int, int] | None:
        """The tail kept after `after` where `tokens` begin with its tokens: its block, taken over by the caller
        alone (a partly filled block is never shared), and how many of the tokens it holds."""
        with self._lock:
            if (tail := self._tails.get(after)) is None:
                return None
            block, kept = tail
            if self._refs[block] or tuple(tokens[:len(kept)]) != kept:
                return None
            del self._tails[after], self._tail_after[block], self._free[block]
            self._refs[block] = 1
            return block, len(kept)

    def release(self, blocks: list[int]) -> None:
        """A sequence gives its blocks back, its first block last: a conversation's end is evicted before its start."""
        with self._lock:
            for block in reversed(blocks):
                self._refs[block] -= 1
                if self._refs[block] == 0:
                    self._free[block] = None
                    if block not in self._hash_of and block not in self._tail_after:
                        self._free.move_to_end(block, last=False)  # nothing cached in it: taken first
