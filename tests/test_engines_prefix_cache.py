"""The own engine's prefix cache (engines/own/prefix_cache.py) as a conversation meets it, on the demo pair: what a prompt
finds kept (a hit, a partial hit, a miss, after an eviction), the turns of a chat (a follow-up, Regenerate, Edit,
Continue), two users sharing a system prompt, a batch row on a kept prefix; and the answers with the cache warm are
the main alone's, greedy, at every K."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from inference.engines.decoding import DecodingParams
from inference.engines.interface import Finished, PromptRead, StepTokens
from inference.engines.own.engine import DRAFT_CATCH_UP_TOKENS, OwnEngine
from inference.engines.own.kv_cache import KvSequence
from inference.engines.own.prefix_cache import BLOCK_TOKENS, PrefixCache
from inference.limits import Drafter
from tests.test_engines_exact import SPEC

pytestmark = pytest.mark.no_database

SYSTEM = '''You review Python code. Answer briefly, quote the lines you mean, and never invent an API.
The project keeps its settings in one module, reads them from the environment, and logs with the standard library.
'''
FILE = '''import os
import json


def load(path):
    with open(path) as handle:
        return json.load(handle)


def save(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)


class Store:
    def __init__(self, root):
        self.root = root
        self.items = {}

    def get(self, key, default=None):
        return self.items.get(key, default)

    def put(self, key, value):
        self.items[key] = value
        save(os.path.join(self.root, "store.json"), self.items)
'''


@pytest.fixture(scope="module")
def engine():
    return OwnEngine(SPEC)


def ids_of(engine: OwnEngine, text: str) -> list[int]:
    return engine.tokenizer.encode(text).input_ids.data[0].tolist()


def run(engine: OwnEngine, prompt_ids: list[int], k: int, tokens: int = 40):
    """The answer's tokens, its request (cached_tokens), and its events."""
    request = engine.submit(prompt_ids=prompt_ids, params=DecodingParams(max_new_tokens=tokens, ignore_eos=True,
                                                                         num_assistant_tokens=k))
    events = []
    while not isinstance(event := request.events.get(timeout=120), Finished):
        events.append(event)
    assert event.finish_reason == "length", event
    return [t for e in events if isinstance(e, StepTokens) for t in e.token_ids], request, events


def whole_blocks(n: int) -> int:
    """What a prompt of n tokens can find kept: its whole blocks before its last token."""
    return (n - 1) // BLOCK_TOKENS * BLOCK_TOKENS


def settled(engine: OwnEngine) -> None:
    """The engine's answers all over (a batch row's slots reach the cache as it leaves)."""
    deadline = time.monotonic() + 30
    while engine.active_count and time.monotonic() < deadline:
        time.sleep(0.02)
    engine.draft_caught_up()


def test_a_follow_up_reads_only_its_new_tokens_and_answers_as_the_main_alone(engine):
    """Turn one: a pasted file (a miss). Turn two sends the whole history: the prompt and the answer come from the
    cache (the answer's slots were kept as it ended), the follow-up's own tokens alone are read; and it answers the
    same at K=3, K=5 and on the main alone (K=0, a batch row), all reading the same kept blocks."""
    first = ids_of(engine, SYSTEM + FILE + "\nWhat does save() guard against?\n")
    answer, request, _ = run(engine, first, 3)
    assert request.cached_tokens == 0
    settled(engine)
    follow_up = first + answer + ids_of(engine, "\nAnd what if two processes call put() at once?\n")
    answers = {}
    for k in (3, 5, 0):  # the first reads the turn before from the cache, the others its own prompt too
        answers[k], request, _ = run(engine, follow_up, k)
        assert request.cached_tokens == whole_blocks(len(first) + len(answer) - 1 if k == 3 else len(follow_up)), k
        settled(engine)
    assert answers[3] == answers[0] and answers[5] == answers[0]


def test_regenerate_edit_and_continue_reuse_the_prefix_up_to_what_changed(engine):
    prompt = ids_of(engine, SYSTEM + FILE + "\nRename Store to JsonStore.\n")
    first, _, _ = run(engine, prompt, 3)
    settled(engine)
    regenerated, request, _ = run(engine, prompt, 3)  # Regenerate: the same prompt, its last token read again
    assert request.cached_tokens == whole_blocks(len(prompt)) and regenerated == first
    edited = ids_of(engine, SYSTEM + FILE.replace("indent=2", "indent=4") + "\nRename Store to JsonStore.\n")
    changed_at = next(i for i, (a, b) in enumerate(zip(prompt, edited, strict=False)) if a != b)
    _, request, _ = run(engine, edited, 3)  # Edit: a branch from the first token that differs
    assert request.cached_tokens == changed_at // BLOCK_TOKENS * BLOCK_TOKENS > 0
    settled(engine)
    _, request, _ = run(engine, prompt + first, 3)  # Continue: the answer so far is the prompt now
    assert request.cached_tokens == whole_blocks(len(prompt) + len(first))


def test_two_users_sharing_a_system_prompt_share_its_blocks(engine):
    alice = ids_of(engine, SYSTEM * 3 + "Alice: is json.load safe on untrusted input?\n")
    bob = ids_of(engine, SYSTEM * 3 + "Bob: how do I read a YAML file?\n")
    shared = next(i for i, (a, b) in enumerate(zip(alice, bob, strict=False)) if a != b)
    assert shared > BLOCK_TOKENS
    run(engine, alice, 3)
    _, request, _ = run(engine, bob, 0)  # the other user's answer on the main alone, a batch row
    assert request.cached_tokens == shared // BLOCK_TOKENS * BLOCK_TOKENS


def test_a_miss_a_partial_hit_and_an_eviction(engine):
    """A cache bounded to four blocks: a prompt of three blocks and a bit is kept whole (read again, bitwise what it
    computed cold: the prefill's chunks are cut on one grid); another starting alike for two blocks finds those two;
    a third prompt's blocks push the least recently used out, the first blocks of a run last, and the cache never
    holds more than its bound."""
    block_bytes = BLOCK_TOKENS * (engine.main_prompts.stats.bytes // max(engine.main_prompts.stats.blocks, 1))
    cache = PrefixCache(capacity_bytes=4 * block_bytes // BLOCK_TOKENS)
    rng = np.random.default_rng(5)
    first = rng.integers(10, 4000, 3 * BLOCK_TOKENS + 10).tolist()
    partial = first[: 2 * BLOCK_TOKENS] + rng.integers(10, 4000, BLOCK_TOKENS + 5).tolist()
    other = rng.integers(10, 4000, 2 * BLOCK_TOKENS + 1).tolist()

    def prefill(ids: list[int]) -> tuple[np.ndarray, int]:
        sequence = KvSequence(engine.main, prompts=cache)
        logits = sequence.prefill(ids)[-1].copy()
        return logits, sequence.cached

    cold, found = prefill(first)
    assert found == 0 and cache.stats.blocks == 3
    warm, found = prefill(first)
    assert found == 3 * BLOCK_TOKENS and np.array_equal(warm, cold)
    _, found = prefill(partial)
    assert found == 2 * BLOCK_TOKENS and cache.stats.blocks == 4
    _, found = prefill(other)
    assert found == 0 and cache.stats.blocks == 4 and cache.stats.evicted_blocks == 2
    assert cache.stats.bytes <= cache.capacity_bytes
    assert cache.cached_tokens(first) == 2 * BLOCK_TOKENS  # its third block went first, its first two stay
    assert cache.stats.queries == len(first) * 2 + len(partial) + len(other)
    assert cache.stats.hits == 5 * BLOCK_TOKENS


def test_a_long_prompt_says_how_far_it_got_and_the_draft_reads_it_after_the_answer(engine):
    """A prompt the draft lacks more than DRAFT_CATCH_UP_TOKENS of: the main reads it chunk by chunk, saying how far
    it got, the answer runs on the main alone (no draft's prefill in the stream), and once it is out the draft reads
    the conversation, so the next turn speculates from the start."""
    long_file = SYSTEM + FILE * 4 + "\nWhich functions write to disk?\n"
    first = ids_of(engine, long_file)
    assert len(first) - engine.draft_prompts.cached_tokens(first) > DRAFT_CATCH_UP_TOKENS
    answer, _, events = run(engine, first, 3)
    progress = [event for event in events if isinstance(event, PromptRead)]
    assert [event.read for event in progress] == sorted(event.read for event in progress)
    assert progress[-1] == PromptRead(len(first), len(first))
    assert len(progress) >= (len(first) - progress[0].read) // BLOCK_TOKENS
    assert not [e for e in events if isinstance(e, StepTokens) and e.drafter == Drafter.DRAFT and e.proposed]
    settled(engine)
    follow_up = first + answer + ids_of(engine, "\nAnd which read from it?\n")
    assert engine.draft_prompts.cached_tokens(follow_up) >= whole_blocks(len(first) + len(answer) - 1)
    speculated, _, events = run(engine, follow_up, 3)
    assert [e for e in events if isinstance(e, StepTokens) and e.drafter == Drafter.DRAFT and e.proposed]
    assert speculated == run(engine, follow_up, 0)[0]


def test_no_prefix_cache_reads_every_prompt_whole():
    engine = OwnEngine(replace(SPEC, slug="uncached", prefix_caching=False))
    prompt = ids_of(engine, SYSTEM + FILE)
    for _ in range(2):
        _, request, _ = run(engine, prompt, 3, tokens=4)
        assert request.cached_tokens == 0
    assert engine.main_prompts.stats.blocks == 0 and engine.main_prompts.stats.hits == 0
