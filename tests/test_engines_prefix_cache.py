"""The own engine's prefix cache (engines/own/block_pool.py: the blocks of each model's pool, found by the hash of
their tokens) as a conversation meets it, on the demo pair: what a prompt finds kept (a hit, a partial hit, a miss,
after an eviction, never a block a running answer holds), the turns of a chat (a follow-up, Regenerate, Edit,
Continue), two users sharing a system prompt (or not: a cache scope each), the main alone on a kept prefix; and the
answers with the cache warm are the main alone's, greedy, at every K."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest

from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.interface import Finished, JoinedBatch, PromptRead, StepTokens
from inference.engines.own.block_pool import PoolFull
from inference.engines.own.engine import DRAFT_CATCH_UP_TOKENS, OwnEngine
from inference.engines.own.kv_cache import PagedModel
from inference.engines.own.model_runner import ModelRunner
from inference.limits import Drafter
from tests.test_engines_exact import PROMPTS, SPEC

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


BLOCK_TOKENS = 32  # the CPU plugin's PagedAttention block (engines/own/paged_model.py, cache_layout)


@pytest.fixture(scope="module")
def engine():
    engine = OwnEngine(SPEC)
    assert engine.main.pool.block_tokens == engine.draft.pool.block_tokens == BLOCK_TOKENS
    return engine


def ids_of(engine: OwnEngine, text: str) -> list[int]:
    return engine.tokenizer.encode(text).input_ids.data[0].tolist()


def run(engine: OwnEngine, prompt_ids: list[int], k: int, tokens: int = 40, scope: str = ""):
    """The answer's tokens, its request (cached_tokens), and its events; `scope`: the user's cache scope."""
    request = engine.submit(prompt_ids=prompt_ids, params=DecodingParams(
        max_new_tokens=tokens, ignore_eos=True, speculation=Speculation(k=k) if k else None, cache_scope=scope))
    events = []
    while not isinstance(event := request.events.get(timeout=120), Finished):
        events.append(event)
    assert event.finish_reason == "length", event
    return [t for e in events if isinstance(e, StepTokens) for t in e.token_ids], request, events


def whole_blocks(n: int) -> int:
    """What a prompt of n tokens can find kept: its whole blocks before its last token."""
    return (n - 1) // BLOCK_TOKENS * BLOCK_TOKENS


def full_blocks(n: int) -> int:
    """What a sequence of n tokens leaves cached as it ends: its full blocks."""
    return n // BLOCK_TOKENS * BLOCK_TOKENS


def settled(engine: OwnEngine) -> None:
    """The engine's answers all over, and the draft done reading a conversation it was left out of."""
    deadline = time.monotonic() + 30
    while engine.active_count and time.monotonic() < deadline:
        time.sleep(0.02)
    engine.draft_caught_up()


def test_a_follow_up_reads_only_its_new_tokens_and_answers_as_the_main_alone(engine):
    """Turn one: a pasted file (a miss). Turn two sends the whole history: the prompt and the answer come from the
    cache (the answer's tokens but the last, never fed: its full blocks, and its last, partly filled one taken over
    whole), the follow-up's own tokens alone are read; and it answers the same at K=3, K=5 and on the main alone
    (K=0), which read the partly filled blocks again."""
    first = ids_of(engine, SYSTEM + FILE + "\nWhat does save() guard against?\n")
    answer, request, _ = run(engine, first, 3)
    assert request.cached_tokens == 0
    settled(engine)
    follow_up = first + answer + ids_of(engine, "\nAnd what if two processes call put() at once?\n")
    answers = {}
    for k in (3, 5, 0):  # the first reads the turn before from the cache, the others its own prompt too
        answers[k], request, _ = run(engine, follow_up, k)
        assert request.cached_tokens == (len(first) + len(answer) - 1 if k == 3 else whole_blocks(len(follow_up))), k
        settled(engine)
    assert answers[3] == answers[0] and answers[5] == answers[0]


def test_an_answer_that_ended_inside_a_verify_leaves_the_conversation_cached_up_to_its_end(engine):
    """An answer ends inside a verify's accepted run where an end of answer was among the proposals: the main has fed
    tokens past the answer's end. Everything up to that end is still kept, so the next turn reads only its own
    tokens (before, nothing the answer wrote was kept, and a speculating chat's follow-up read the answer again)."""
    prompt = ids_of(engine, SYSTEM + FILE + "\nWhat does save() guard against?\n")
    answer = ids_of(engine, "A crash in the middle of a write: the old file stays whole.")
    sequence = engine.main.sequence(scope="user:ended", exact=True)
    sequence.prefill(prompt)
    sequence.feed([*answer, *ids_of(engine, " Also")])  # the answer's last token its end, then what came after it
    sequence.close(keep_ids=prompt + answer)
    follow_up = prompt + answer + ids_of(engine, "\nAnd what does put() save?\n")
    again = engine.main.sequence(scope="user:ended", exact=True)
    again.prefill(follow_up)
    assert again.cached == len(prompt) + len(answer) > whole_blocks(len(prompt))
    again.close()


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
    _, request, _ = run(engine, prompt + first, 3)  # Continue: the answer so far is the prompt now, read but its last
    assert request.cached_tokens == len(prompt) + len(first) - 1  # token (never fed), its last block the tail


def test_two_users_sharing_a_system_prompt_share_its_blocks_unless_each_has_a_scope(engine):
    """A server that shares its cache (the empty scope) gives the second user the first one's blocks of the system
    prompt; a user with a scope of their own finds none of them, nor learns they are there (cached_tokens)."""
    alice = ids_of(engine, SYSTEM * 3 + "Alice: is json.load safe on untrusted input?\n")
    bob = ids_of(engine, SYSTEM * 3 + "Bob: how do I read a YAML file?\n")
    shared = next(i for i, (a, b) in enumerate(zip(alice, bob, strict=False)) if a != b)
    assert shared > BLOCK_TOKENS
    run(engine, alice, 3)
    _, request, _ = run(engine, bob, 0)  # the other user's answer on the main alone
    assert request.cached_tokens == shared // BLOCK_TOKENS * BLOCK_TOKENS
    assert engine.main.cached_tokens(bob, "carol") == 0
    _, request, _ = run(engine, bob, 3, tokens=4, scope="carol")
    assert request.cached_tokens == 0
    assert engine.main.cached_tokens(bob, "carol") == whole_blocks(len(bob))  # hers now, under her scope


def test_a_miss_a_partial_hit_and_an_eviction_that_spares_running_answers(engine):
    """A pool of six blocks on the engine's main: a prompt of three blocks and a bit is kept whole (read again, bitwise
    what it computed cold); another starting alike for two blocks finds those two; a third prompt's blocks push the
    least recently freed out, a conversation's end before its start. An answer running holds its blocks: a prompt
    wanting more than the others fails alone, one wanting what is free evicts only those, and the running answer's
    next logits are bitwise those of a sequence that never met a small pool. Every block is back in the pool after."""
    small = PagedModel(ModelRunner(engine.main.runner.compiled, pool_bytes=6 * engine.main.pool.block_bytes,
                                   steady=engine.main.runner.steady))
    pool = small.pool
    assert pool.blocks == 6 and pool.cached_blocks == 0
    rng = np.random.default_rng(5)
    first = rng.integers(10, 4000, 3 * BLOCK_TOKENS + 10).tolist()
    partial = first[: 2 * BLOCK_TOKENS] + rng.integers(10, 4000, BLOCK_TOKENS + 5).tolist()
    other = rng.integers(10, 4000, 2 * BLOCK_TOKENS + 1).tolist()

    def prefill(ids: list[int]) -> tuple[np.ndarray, int]:
        sequence = small.sequence(exact=True)
        logits = sequence.prefill(ids)[-1].copy()
        sequence.close(keep_ids=ids)
        return logits, sequence.cached

    cold, found = prefill(first)
    assert found == 0 and pool.cached_blocks == 3
    warm, found = prefill(first)
    assert found == 3 * BLOCK_TOKENS and np.array_equal(warm, cold)
    _, found = prefill(partial)
    assert found == 2 * BLOCK_TOKENS and pool.cached_blocks == 4 and pool.stats.evicted_blocks == 0
    _, found = prefill(other)  # three blocks, two of them never cached: one cached block goes
    assert found == 0 and pool.cached_blocks == 5 and pool.stats.evicted_blocks == 1
    assert small.cached_tokens(first, "") == 2 * BLOCK_TOKENS  # its third block went first, its first two stay

    running = small.sequence(exact=True)
    running.prefill(first)  # its first two blocks found, two taken: four of six held
    held = list(running.block_table)
    evicted = pool.stats.evicted_blocks
    wanting = small.sequence(exact=True)
    with pytest.raises(PoolFull):
        wanting.prefill(rng.integers(10, 4000, 2 * BLOCK_TOKENS + 1).tolist())  # three blocks
    wanting.close()
    assert pool.stats.evicted_blocks == evicted and pool.free_count == 2
    fitting = small.sequence(exact=True)
    fitting.prefill(rng.integers(10, 4000, BLOCK_TOKENS + 1).tolist())  # two blocks: the free ones, both cached
    assert pool.stats.evicted_blocks == evicted + 2 and pool.free_count == 0 and not set(held) & set(fitting.block_table)
    assert running.block_table == held and small.cached_tokens(first, "") == 3 * BLOCK_TOKENS
    token = int(rng.integers(10, 4000))
    afresh = engine.main.sequence(exact=True)
    assert np.array_equal(running.feed([token])[-1], afresh.prefill([*first, token])[-1])
    for sequence in (running, fitting, afresh):
        sequence.close()
    assert pool.free_count == pool.blocks
    assert pool.stats.queries == 3 * len(first) + len(partial) + len(other) + 2 * BLOCK_TOKENS + 1 + BLOCK_TOKENS + 1
    assert pool.stats.hits == 7 * BLOCK_TOKENS


def test_a_long_prompt_says_how_far_it_got_and_the_draft_reads_it_after_the_answer(engine):
    """A prompt the draft lacks more than DRAFT_CATCH_UP_TOKENS of: the main reads it chunk by chunk, saying how far
    it got, the answer speculates from the conversation alone (no draft's prefill in the stream, no draft token), and
    once it is out the draft reads the conversation, so the next turn speculates with it from the start."""
    long_file = SYSTEM + FILE * 4 + "\nWhich functions write to disk?\n"
    first = ids_of(engine, long_file)
    assert len(first) - engine.draft.cached_tokens(first, "") > DRAFT_CATCH_UP_TOKENS
    answer, request, events = run(engine, first, 3)
    progress = [event for event in events if isinstance(event, PromptRead)]
    chunk = engine.main.scheduler.chunk_tokens  # a prompt is read in chunks of this many
    assert len(progress) > 1 and progress[-1] == PromptRead(len(first), len(first))
    assert [event.read for event in progress] == [min(request.cached_tokens + chunk * n, len(first))
                                                  for n in range(1, len(progress) + 1)]
    assert not [e for e in events if isinstance(e, StepTokens) and e.drafter == Drafter.DRAFT]
    assert answer == run(engine, first, 0)[0]
    settled(engine)
    follow_up = first + answer + ids_of(engine, "\nAnd which read from it?\n")
    assert engine.draft.cached_tokens(follow_up, "") == full_blocks(len(first) + len(answer) - 1)
    speculated, _, events = run(engine, follow_up, 3)
    assert [e for e in events if isinstance(e, StepTokens) and e.drafter == Drafter.DRAFT and e.proposed]
    assert speculated == run(engine, follow_up, 0)[0]


@contextmanager
def another_prompt_held(engine: OwnEngine):
    """Another user's prompt being read by the main, held after its first chunk for as long as the block runs."""
    held, go = threading.Event(), threading.Event()
    reader = engine.main.sequence(scope="another user", exact=True)
    reading = threading.Thread(target=reader.prefill, args=(ids_of(engine, FILE * 3),),
                               kwargs={"on_chunk": lambda read, total: (held.set(), go.wait(60))})
    reading.start()
    try:
        assert held.wait(60)
        yield
    finally:
        go.set()
        reading.join(60)
        reader.close()


def test_the_draft_reads_a_conversation_after_its_answer_only_while_the_main_reads_no_prompt(engine):
    """The draft left out of an answer reads its conversation once the answer is out; on a host's few cores it would
    share them with the next user waiting for a first token. Its chunks wait while the main reads a prompt (here one
    held after its first chunk), and go on once it is read where no other conversation's answer follows (below), so
    the next turn still speculates with the draft (a chunk under way as a prompt starts is cancelled and read again:
    tests/test_engines_paged_model.py)."""
    settled(engine)
    scope = "catching-up"
    first = ids_of(engine, SYSTEM + FILE * 4 + "\nWhich functions read from disk?\n")
    with another_prompt_held(engine):
        answer, _, _ = run(engine, first, 3, scope=scope)  # its draft left behind: it lacks the whole prompt
        steps = engine.draft.scheduler.steps
        time.sleep(1.0)
        assert engine.draft.scheduler.steps == steps  # the conversation not read while the main reads a prompt
        inferences: list[int] = []  # the tokens of each of the draft's inferences from here
        running = engine.draft.runner.run

        def counted(works, **kwargs):
            inferences.append(sum(len(work.tokens) for work in works))
            return running(works, **kwargs)
        engine.draft.runner.run = counted
    try:
        engine.draft_caught_up()
    finally:
        del engine.draft.runner.run  # the class's again
    read, chunk = len(first) + len(answer) - 1, engine.draft.scheduler.chunk_tokens
    assert inferences == [min(chunk, read - done) for done in range(0, read, chunk)]
    follow_up = first + answer + ids_of(engine, "\nAnd which write to it?\n")
    assert engine.draft.cached_tokens(follow_up, scope) == full_blocks(len(first) + len(answer) - 1)


def test_a_follow_up_streams_while_the_draft_reads_the_turn_before_and_the_draft_joins_it_then(engine):
    """A follow-up sent while the draft still reads the turn before (held here: another user's prompt is read) goes
    on without the draft instead of waiting for it after its first token (before, it stood still until the catch-up
    ended); once the catch-up is done, the draft joins the answer, which stays the main alone's."""
    settled(engine)
    scope = "joining"
    first = ids_of(engine, SYSTEM + FILE * 4 + "\nWhich functions write to disk?\n")
    with another_prompt_held(engine):
        answer, _, _ = run(engine, first, 3, scope=scope)  # its draft left behind, its catch-up held
        follow_up = first + answer + ids_of(engine, "\nAnd which read from it?\n")
        request = engine.submit(prompt_ids=follow_up, params=DecodingParams(
            max_new_tokens=160, ignore_eos=True, speculation=Speculation(k=3), cache_scope=scope))
        before: list[StepTokens] = []
        while sum(len(step.token_ids) for step in before) < 12:  # the answer streams, the catch-up still held
            event = request.events.get(timeout=30)
            assert not isinstance(event, Finished), event
            if isinstance(event, StepTokens):
                before.append(event)
        assert engine.draft_reading
        assert not [step for step in before if step.drafter == Drafter.DRAFT and step.proposed]
    after = []
    while not isinstance(event := request.events.get(timeout=120), Finished):
        if isinstance(event, StepTokens):
            after.append(event)
    assert event.finish_reason == "length", event
    assert [step for step in after if step.drafter == Drafter.DRAFT and step.proposed]  # the draft joined
    assert [t for step in before + after for t in step.token_ids] == run(engine, follow_up, 0, tokens=160)[0]


def test_an_answer_ends_at_once_while_another_conversations_catch_up_is_under_way(engine):
    """Two chats whose drafts were left out of their answers: the first's catch-up waits while the main reads another
    user's prompt (held here), and the second's answer, out meanwhile, ends then, not once that catch-up is done (its
    end and its stored record once waited for it: seconds on two cores, the page still saying "writing"). Its own
    catch-up follows, and the draft holds both conversations after."""
    settled(engine)
    first = ids_of(engine, SYSTEM + FILE * 4 + "\nWhich functions touch the disk?\n")
    second = ids_of(engine, SYSTEM + FILE * 4 + "\nWhich functions could lose data if the process dies?\n")
    with another_prompt_held(engine):
        answer, _, _ = run(engine, first, 3, scope="first chat")  # its draft left behind, its catch-up held
        assert engine.draft_reading
        started = time.monotonic()
        other, _, _ = run(engine, second, 3, tokens=8, scope="second chat")  # its draft left behind too
        assert time.monotonic() - started < 20, "the answer's end waited for another conversation's catch-up"
        assert engine.draft_reading  # the first catch-up still held: the second's end did not wait for it
    settled(engine)
    deadline = time.monotonic() + 30
    while engine.draft.cached_tokens(second + other, "second chat") < full_blocks(len(second) + len(other) - 1):
        assert time.monotonic() < deadline, "the second conversation's catch-up did not follow"
        time.sleep(0.1)
    assert engine.draft.cached_tokens(first + answer, "first chat") == full_blocks(len(first) + len(answer) - 1)


def test_the_draft_reads_no_conversation_after_its_answer_while_the_batch_runs_without_it():
    """Beyond the pair's speculating streams answers run in the batch, here without the draft (no K for the batch): an
    answer that ends while others run leaves its draft unread, as a next turn starting then would run in the batch
    without it (on two cores the reads slowed the running answers' first follow-ups to 0.63-0.69x `speculative:
    false`: docs/benchmark.md). Once the others are done, the draft reads the conversation after the answer again."""
    busy = OwnEngine(replace(SPEC, slug="busy-catch-up", speculating_streams=1))
    others = [busy.submit(prompt_ids=ids_of(busy, prompt), params=DecodingParams(max_new_tokens=900, ignore_eos=True))
              for prompt in PROMPTS[:2]]
    for other in others:
        while not isinstance(other.events.get(timeout=120), StepTokens):
            pass
    first = ids_of(busy, SYSTEM + FILE * 4 + "\nWhich functions read from disk?\n")
    steps = busy.draft.scheduler.steps
    answer, _, events = run(busy, first, 3)
    busy.draft_caught_up()
    assert [event for event in events if isinstance(event, JoinedBatch)]  # it ran in the batch, without the draft
    assert busy.draft.scheduler.steps == steps and busy.draft.cached_tokens(first + answer, "") == 0
    for other in others:
        other.stop()
        while not isinstance(other.events.get(timeout=120), Finished):
            pass
    again, _, _ = run(busy, first, 3)  # alone: the draft lacks the prompt, and reads the conversation after
    busy.draft_caught_up()
    assert again == answer
    assert busy.draft.cached_tokens(first + again, "") == full_blocks(len(first) + len(again) - 1)


def test_a_catch_up_under_way_stops_when_answers_beyond_the_speculating_streams_come():
    """An answer that ends alone leaves its draft reading the conversation; answers that come meanwhile, beyond the
    pair's speculating streams, run in the batch without the draft, so the read stops at its next chunk (on two cores
    it slowed a benchmark's first follow-ups, sent as four chats' answers ended, to 0.71x `speculative: false`). What
    it read by then stays cached."""
    busy = OwnEngine(replace(SPEC, slug="catch-up-stops", speculating_streams=1))
    busy.draft.scheduler.chunk_tokens = 8  # a read of many chunks: the answers below come while it is under way
    first = ids_of(busy, SYSTEM + FILE * 4 + "\nWhich functions read from disk?\n")
    answer, _, _ = run(busy, first, 3, tokens=3)  # alone: the draft lacks the prompt, and reads it after the answer
    others = [busy.submit(prompt_ids=ids_of(busy, prompt), params=DecodingParams(max_new_tokens=900, ignore_eos=True))
              for prompt in PROMPTS[:2]]
    busy.draft_caught_up()
    read = busy.draft.cached_tokens(first + answer, "")
    assert read < full_blocks(len(first) + len(answer) - 1), "the read went on beside the answers in the batch"
    for other in others:
        other.stop()
        while not isinstance(other.events.get(timeout=120), Finished):
            pass
    again, _, _ = run(busy, first, 3, tokens=3)  # alone again: the draft reads on from what it had read
    busy.draft_caught_up()
    assert again == answer
    assert busy.draft.cached_tokens(first + again, "") == full_blocks(len(first) + len(again) - 1)


@pytest.mark.parametrize("other", ["another conversation", "the same words, another user"])
def test_a_catch_up_under_way_stops_when_an_answer_of_another_conversation_runs(other):
    """Within the pair's speculating streams an answer of another conversation (another chat, or another user's) gets
    no help from the read and shares the cores and the draft's inferences with it: on two cores the answers a user
    sent right after pasting a file into another chat ran at 0.34-0.61x `speculative: false` (AMD Zen 5,
    docs/benchmark.md). The read stops at its next chunk; what it read stays cached, and the conversation's next turn
    reads on from there. (A later turn of the same conversation lets it read on: the draft joins it, above.)"""
    busy = OwnEngine(replace(SPEC, slug="catch-up-beside", speculating_streams=1))
    busy.draft.scheduler.chunk_tokens = 8  # a read of many chunks: the other answer comes while it is under way
    first = ids_of(busy, SYSTEM + FILE * 4 + "\nWhich functions read from disk?\n")
    answer, _, _ = run(busy, first, 3, tokens=3)  # alone: the draft lacks the prompt, and reads it after the answer
    if other == "another conversation":
        run(busy, ids_of(busy, PROMPTS[0]), 3, tokens=24)
    else:
        run(busy, first + answer + ids_of(busy, "\nAnd which write to it?\n"), 3, tokens=24, scope="another user")
    busy.draft_caught_up()
    read = busy.draft.cached_tokens(first + answer, "")
    assert read < full_blocks(len(first) + len(answer) - 1), "the read went on beside the other answer"
    again, _, _ = run(busy, first, 3, tokens=3)  # alone again: the draft reads on from what it had read
    busy.draft_caught_up()
    assert again == answer
    assert busy.draft.cached_tokens(first + again, "") == full_blocks(len(first) + len(again) - 1)


def test_no_prefix_cache_reads_every_prompt_whole():
    engine = OwnEngine(replace(SPEC, slug="uncached", prefix_caching=False))
    prompt = ids_of(engine, SYSTEM + FILE)
    for _ in range(2):
        _, request, _ = run(engine, prompt, 3, tokens=4)
        assert request.cached_tokens == 0
    for model in (engine.main, engine.draft):
        assert model.pool.cached_blocks == 0 and model.pool.stats.hits == 0
