"""What an engine offers its callers (the worker, the registry, the benchmark): `submit(prompt=...,
params=...)` returns an ActiveRequest whose `events` queue the caller drains, one StepTokens per
speculative step, then Finished. Two engines implement it: the library's pipeline in a step process of
its own (engines/library/pipeline.py) and the own engine (engines/own/engine.py). Nothing here knows Django, Redis or
Celery.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from inference.engines.decoding import DecodingParams
from inference.engines.spec import PairSpec
from inference.limits import Drafter, FinishReason

if TYPE_CHECKING:
    import openvino_genai as og


class StepTokens(NamedTuple):
    """The tokens one main step delivered to a request, and when (perf_counter seconds)."""

    token_ids: list[int]
    at: float
    logprobs: list[float] | None = None  # when the request asked: log p_main(token) before temperature
    alternatives: list[list[tuple[int, float]]] | None = None  # per token, the top_logprobs most likely (id, logprob)
    drafter: Drafter | None = None  # what proposed this step's tokens (None: the engine does not say)
    proposed: int | None = None  # how many it proposed (the accepted ones are all the tokens but the last)


class PromptRead(NamedTuple):
    """How far the prefill of a long prompt got: `read` of its `total` tokens are in the cache."""

    read: int
    total: int


class JoinedBatch(NamedTuple):
    """The answer moved into the own engine's batch after `token` tokens, as more answers came than the pair
    speculates for: it speculates on there at `k` (0: without the draft), where it ran at `k_before`; `lookup`: the
    conversation's lookup proposes there alone."""

    token: int
    k: int
    k_before: int
    lookup: bool = False


class LeftBatch(NamedTuple):
    """The answer that had moved into the batch speculates again at `k` after `token` tokens: the engine's other
    answers ended, within the pair's speculating streams again."""

    token: int
    k: int


class Finished(NamedTuple):
    finish_reason: FinishReason
    error: str = ""


class ActiveRequest:
    """A request inside the batch. Its engine feeds `events`; its owner reads them."""

    def __init__(self, request_id: int, prompt_ids: list[int], added_at: float,
                 on_stop: Callable[[], object] | None = None):
        self.request_id = request_id
        self.on_stop = on_stop
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.added_at = added_at
        self.events: queue.Queue[StepTokens | PromptRead | JoinedBatch | LeftBatch | Finished] = queue.Queue()
        self.cached_tokens = 0  # prompt tokens the engine found in its prefix cache (set before the first token)
        self.stop_requested = False

    def next_step(self, *, timeout: float) -> StepTokens | Finished:
        """The next step or the end, past the events that say how the answer goes (what a caller that only counts
        tokens reads)."""
        while isinstance(event := self.events.get(timeout=timeout), PromptRead | JoinedBatch | LeftBatch):
            pass
        return event

    def stop(self) -> None:
        """Ask the engine to stop this request before its next step (keeps what was produced)."""
        if self.stop_requested:
            return
        self.stop_requested = True
        if self.on_stop:
            with contextlib.suppress(OSError, EOFError):  # the engine is gone: its reader ends the request
                self.on_stop()


class Engine(Protocol):
    """What the worker, the registry and the benchmark use of an engine."""

    spec: PairSpec
    tokenizer: og.Tokenizer
    load_seconds: float
    submitted: int  # requests taken: the registry renews an engine after many

    @property
    def active_count(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    def submit(self, *, prompt: str = "", params: DecodingParams, add_special_tokens: bool = True,
               prompt_ids: list[int] | None = None) -> ActiveRequest: ...

    def close(self) -> None: ...
