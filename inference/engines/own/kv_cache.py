"""The cache seam of the own engine: what exact.Decoding asks of one model's KV cache for one answer, stated
once (KvCache), and the cache of its own each model holds (KvSequence). The main alone's answers hold a row
of a shared batch instead (engines/own/batch.py, BatchRow), behind the same seam.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import openvino as ov

from inference.engines.own.prefix_cache import PrefixCache, ProgressCallback
from inference.engines.own.stepped_model import step_inputs


class KvCache(Protocol):
    """One model's KV cache for one answer, fed a step at a time."""

    position: int  # the next token's position: the live tokens so far
    cached: int  # the prompt's tokens its prefill found in the prefix cache

    @property
    def dead(self) -> int:
        """Slots the cache holds for rejected tokens (masked, not cut): rebuild() drops them."""
        ...

    def prefill(self, prompt_ids: list[int], *, on_chunk: ProgressCallback | None = None) -> np.ndarray:
        """The prompt into a fresh cache, from the model's prefix cache where it holds its start: logits whose last
        row is the prompt's last token's. `cached` then says how many prompt tokens were found there."""
        ...

    def feed(self, token_ids: list[int]) -> np.ndarray:
        """Tokens after the live ones: logits whose last row is the last token's (a KvSequence gives a row
        per fed token, which verifying K proposals needs)."""
        ...

    def drop_last(self, n: int) -> None:
        """The last n fed tokens were rejected."""
        ...

    def rebuild(self, live_ids: list[int]) -> None:
        """A fresh cache holding `live_ids` only."""
        ...

    def close(self, *, keep_ids: list[int] | None = None) -> None:
        """The answer is over: whatever the cache holds elsewhere is given back, its live slots (which hold
        `keep_ids`, or more) kept in the model's prefix cache first."""
        ...


class KvSequence:
    """One model's KV cache for one request: which slots are live, and the next position.

    Rejected tokens leave the cache in one of two ways. Cut (`cut_rejected`, the main's): the next logits
    are bitwise those of a cache that never held them, which greedy identity needs (under dynamic
    quantization masked slots moved the real main's next logits by up to 0.3, docs/exactness.md; a cut copies the
    cache, dear after a long prompt). Masked (the draft's): attention mask 0, positions reused; free, and the draft
    only proposes.

    `compiled` is stepped (engines/own/stepped_model.py). A draft's sequence is `last_row_only`: it proposes from the
    last fed token's logits, so its head runs for that token alone."""

    def __init__(self, compiled: ov.CompiledModel, *, prompts: PrefixCache | None = None, cut_rejected: bool = False,
                 last_row_only: bool = False):
        self.request = compiled.create_infer_request()
        self.prompts = prompts or PrefixCache(capacity_bytes=0)  # the model's prefix cache (none kept: a test's own)
        self.cached = 0
        self.cut_rejected = cut_rejected
        self.last_row_only = last_row_only
        self.mask = np.zeros(0, dtype=np.int64)
        self.position = 0

    def feed(self, token_ids: list[int]) -> np.ndarray:
        """Logits for each fed token (the last one's alone if `last_row_only`), given every live slot before it."""
        n = len(token_ids)
        self.mask = np.concatenate([self.mask, np.ones(n, dtype=np.int64)])
        self.request.infer(step_inputs(np.array([token_ids], dtype=np.int64),
                                       positions=np.arange(self.position, self.position + n, dtype=np.int64)[None, :],
                                       attention_mask=self.mask[None, :], rows=1 if self.last_row_only else n))
        self.position += n
        return self.request.get_output_tensor(0).data[0]

    def prefill(self, prompt_ids: list[int], *, on_chunk: ProgressCallback | None = None) -> np.ndarray:
        """The prompt into a fresh cache (its start from the prefix cache): the last token's logits."""
        logits, self.cached = self.prompts.prefill(self.request, prompt_ids, on_chunk=on_chunk)
        self.mask = np.ones(len(prompt_ids), dtype=np.int64)
        self.position = len(prompt_ids)
        return logits

    def drop_last(self, n: int) -> None:
        """The last n fed tokens were rejected: cut from the cache, or masked from now on."""
        if not n:
            return
        if self.cut_rejected:
            length = len(self.mask)
            for state in self.request.query_state():  # [batch, kv heads, sequence, head size] per layer and K/V
                # A region of the tensor read (a numpy slice would copy it again). The plugin still copies the cache
                # three times: reading it, writing it back, and growing it at the next inference (it keeps no room
                # in a state handed back), so a rollback costs more the longer the context
                # (docs/benchmark.md#a-long-conversation)
                cache = state.state
                end = list(cache.shape)
                end[2] = length - n
                state.state = ov.Tensor(cache, ov.Coordinate([0] * len(end)), ov.Coordinate(end))
            self.mask = self.mask[:-n]
        else:
            self.mask[-n:] = 0
        self.position -= n

    @property
    def dead(self) -> int:
        return len(self.mask) - self.position

    def live_cache(self) -> dict[str, np.ndarray]:
        """A copy of the cache's live slots, each state [1, kv heads, slots, head size] (a slot's keys hold its
        position: the live ones keep theirs, in order)."""
        live = np.flatnonzero(self.mask)
        return {state.name: np.ascontiguousarray(state.state.data[:, :, live]) for state in self.request.query_state()}

    def close(self, *, keep_ids: list[int] | None = None) -> None:
        """The cache given back now, not when the answer's objects go (a batch row leaves its batch)."""
        if keep_ids and self.position:
            self.prompts.keep(keep_ids, self.live_cache())
        self.request.reset_state()

    def rebuild(self, live_ids: list[int]) -> None:
        """Drop the dead slots: a fresh cache holding the live tokens only."""
        self.request.reset_state()
        self.mask = np.zeros(0, dtype=np.int64)
        self.position = 0
        self.feed(live_ids)
