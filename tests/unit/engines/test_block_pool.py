"""The own engine's block pool (engines/own/block_pool.py) as a table: what a prompt finds cached (a hit, a partial hit,
a miss, another user's blocks), which cached block goes first when a slot is needed (the least recently freed, a
conversation's end before its start, never-cached blocks before cached ones), that a block a sequence holds is never
taken, the bound, the counters, and the hashes themselves.

Each case is a short script of what sequences do, run as kv_cache.PagedSequence drives the pool (look the prompt's
full blocks up and hold them, allocate the rest, cache the full blocks, release), with no model: block contents do
not matter here, only which blocks a prompt would find."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from inference.engines.own.block_pool import BlockPool, PoolFull, block_hashes

BLOCK = 4  # tokens a block
BLOCKS = 4  # blocks in the pool
# Conversations: token ids no two share (so a hash found is a conversation's own)
CONVERSATIONS = {name: list(range(base, base + 40)) for name, base in (("A", 1000), ("B", 2000), ("C", 3000))}


def tokens_of(spec: str) -> list[int]:
    """"A:8" is conversation A's first 8 tokens; "A:4+B:4" A's first 4 then B's tokens 4 to 8 (a prompt that starts
    as A did and goes on otherwise)."""
    ids: list[int] = []
    for part in spec.split("+"):
        name, n = part.split(":")
        ids += CONVERSATIONS[name][len(ids):int(n)] if ids else CONVERSATIONS[name][:int(n)]
    return ids


class Driver:
    """Sequences on one pool, each as PagedSequence drives it; a sequence is named by the script."""

    def __init__(self, *, blocks: int = BLOCKS, scope: str = ""):
        self.pool = BlockPool(blocks=blocks, block_tokens=BLOCK)
        self.scope = scope
        self.held: dict[str, list[int]] = {}
        self.ids: dict[str, list[int]] = {}
        self.found: dict[str, int] = {}  # the blocks each sequence's prompt found cached

    def hashes(self, ids: list[int], scope: str | None = None) -> list[bytes]:
        return block_hashes(ids, block_tokens=BLOCK, scope=self.scope if scope is None else scope)

    def start(self, name: str, spec: str, scope: str | None = None) -> None:
        """A prompt read: its full blocks before its last token looked up and held, the rest allocated."""
        ids = tokens_of(spec)
        hashes = self.hashes(ids, scope)
        found = self.pool.cached_prefix(hashes[: (len(ids) - 1) // BLOCK], hold=True)
        self.pool.count_lookup(queried=len(ids), hit=len(found) * BLOCK)
        self.held[name] = found + self.pool.allocate(-(-len(ids) // BLOCK) - len(found))
        self.ids[name], self.found[name] = ids, len(found)

    def cache(self, name: str, scope: str | None = None) -> None:
        self.pool.cache(self.held[name], self.hashes(self.ids[name], scope))

    def open(self, name: str, spec: str, scope: str | None = None) -> None:
        self.start(name, spec, scope)
        self.cache(name, scope)

    def close(self, name: str) -> None:
        self.pool.release(self.held.pop(name))

    def turn(self, name: str, spec: str, scope: str | None = None) -> None:
        """A whole answer: read, cached, given back."""
        self.open(name, spec, scope)
        self.close(name)

    def take(self, name: str, n: int) -> None:
        """A sequence writing n blocks of its own (a long answer)."""
        self.held[name] = self.pool.allocate(n)

    def finds(self, spec: str, scope: str | None = None) -> int:
        """The blocks a prompt of `spec` (and a token more) would find cached now, without holding them."""
        return len(self.pool.cached_prefix(self.hashes(tokens_of(spec), scope), hold=False))

    def run(self, script: str) -> None:
        """One step a line: `turn a A:8`, `open a A:8`, `start a A:8`, `cache a`, `close a`, `take x 2`; a scope
        after `@` (`turn a A:8 @user:1`)."""
        for line in filter(None, (line.strip() for line in script.splitlines())):
            words, _, scope = line.partition("@")
            verb, name, *rest = words.split()
            args = [int(arg) if arg.isdigit() else arg for arg in rest]
            getattr(self, verb)(name, *args, **({"scope": scope.strip()} if scope else {}))


# ------------------------------------------------------------------------------------------ what a prompt finds
@dataclass(frozen=True)
class Lookup:
    name: str
    before: str  # the script run first
    prompt: str  # what a new prompt holds
    found: int  # its blocks found cached
    scope: str = ""  # the new prompt's


LOOKUPS = [
    Lookup("nothing cached yet: a miss", "", "A:12", 0),
    Lookup("the same prompt again: a hit on every full block before its last token", "turn a A:12", "A:13", 3),
    Lookup("a follow-up: the turn before's full blocks", "turn a A:10", "A:20", 2),
    Lookup("a prompt diverging in its second block: a partial hit", "turn a A:12", "A:5+B:12", 1),
    Lookup("a prompt diverging at a block's first token: the blocks before it", "turn a A:12", "A:8+B:12", 2),
    Lookup("a prompt diverging in its first block: a miss", "turn a A:12", "A:3+B:12", 0),
    Lookup("the same blocks after another first block are not found: the chain", "turn a A:12", "B:4+A:12", 0),
    Lookup("a partly filled last block is not cached", "turn a A:7", "A:12", 1),
    Lookup("a prompt shorter than a block finds nothing", "turn a A:12", "A:3", 0),
    Lookup("another user's blocks are not found", "turn a A:12 @user:1", "A:13", 0, scope="user:2"),
    Lookup("the server's shared blocks are not found by a user", "turn a A:12", "A:13", 0, scope="user:1"),
    Lookup("the same user's blocks are found", "turn a A:12 @user:1", "A:13", 3, scope="user:1"),
    Lookup("two conversations cached: each finds its own", "turn a A:12\nturn b B:12", "B:13", 3),
    Lookup("a prompt still being answered shares its full blocks", "open a A:10", "A:13", 2),
]


@pytest.mark.parametrize("case", LOOKUPS, ids=[case.name for case in LOOKUPS])
def test_what_a_prompt_finds_cached(case: Lookup):
    driver = Driver(blocks=8)
    driver.run(case.before)
    assert driver.finds(case.prompt, scope=case.scope) == case.found
    driver.run(f"start new {case.prompt} @{case.scope}" if case.scope else f"start new {case.prompt}")
    assert driver.found["new"] == min(case.found, (len(tokens_of(case.prompt)) - 1) // BLOCK)
    if case.found:  # the hit is shared, not copied: the new sequence's table starts with the cached blocks
        assert driver.held["new"][: driver.found["new"]] == driver.pool.cached_prefix(
            driver.hashes(tokens_of(case.prompt), case.scope), hold=False)[: driver.found["new"]]


# --------------------------------------------------------------------------------------------------- eviction
@dataclass(frozen=True)
class Eviction:
    name: str
    script: str
    finds: dict[str, int]  # what each conversation's prompt finds after the script
    evicted: int  # blocks the pool evicted (stats)
    free: int  # blocks no sequence holds
    blocks: int = BLOCKS


EVICTIONS = [
    Eviction("never-used blocks are taken before cached ones", "turn a A:8\ntake x 2", {"A": 2}, 0, 2),
    Eviction("the least recently freed conversation goes first, its end before its start",
             "turn a A:8\nturn b B:8\ntake x 1", {"A": 1, "B": 2}, 1, 3),
    Eviction("... then its start", "turn a A:8\nturn b B:8\ntake x 2", {"A": 0, "B": 2}, 2, 2),
    Eviction("... then the next conversation's end", "turn a A:8\nturn b B:8\ntake x 3", {"A": 0, "B": 1}, 3, 1),
    Eviction("a conversation read again is freed again: the other goes first",
             "turn a A:8\nturn b B:8\nturn a2 A:9\ntake x 2", {"A": 2, "B": 0}, 2, 2),
    Eviction("a partly filled block, never cached, is taken before any cached one",
             "turn b B:8\nturn a A:6\ntake x 1", {"A": 1, "B": 2}, 0, 3),
    Eviction("a block a running sequence holds is never evicted",
             "open a A:8\nturn b B:8\ntake x 2", {"A": 2, "B": 0}, 2, 0),
    Eviction("nor one a sequence holds through a hit on it, though freed before the others",
             "turn a A:8\nturn c C:8\nopen b A:9\ntake x 1", {"A": 2, "C": 0}, 2, 0),
    Eviction("two sequences holding one block: it stays held until both give it back",
             "turn a A:8\nopen b A:9\nopen c A:10\nclose b\ntake x 1", {"A": 2}, 0, 0),
    Eviction("the same prompt written twice at once: one copy cached, the other taken first",
             "start a A:8\nstart b A:8\ncache a\ncache b\nclose a\nclose b\ntake x 2", {"A": 2}, 0, 4, blocks=6),
]


@pytest.mark.parametrize("case", EVICTIONS, ids=[case.name for case in EVICTIONS])
def test_which_cached_block_goes_first(case: Eviction):
    driver = Driver(blocks=case.blocks)
    driver.run(case.script)
    assert {name: driver.finds(f"{name}:40") for name in case.finds} == case.finds
    assert driver.pool.stats.evicted_blocks == case.evicted
    assert driver.pool.free_count == case.free
    # every cached block is one a prompt can still find: no conversation kept its end without its start
    assert driver.pool.cached_blocks == sum(driver.finds(f"{name}:40") for name in CONVERSATIONS)


# --------------------------------------------------------------------------------------------------- the bound
@pytest.mark.parametrize(("script", "asked", "free"), [
    ("take x 4", 1, 0),
    ("open a A:16", 1, 0),  # a prompt's own blocks
    ("open a A:8\nopen b A:16", 1, 0),  # two sequences sharing A's first blocks hold the whole pool
    ("take x 2", 3, 2),  # more than the free blocks: none taken
], ids=["every block written", "every block a prompt's", "every block shared", "more than are free"])
def test_a_full_pool_refuses_clearly_and_takes_nothing(script: str, asked: int, free: int):
    driver = Driver()
    driver.run(script)
    cached = driver.pool.cached_blocks
    with pytest.raises(PoolFull, match=rf"the KV cache has {free} free blocks of {BLOCKS}, {asked} asked"):
        driver.pool.allocate(asked)
    assert driver.pool.free_count == free and driver.pool.cached_blocks == cached  # nothing evicted in failing
    assert driver.pool.stats.evicted_blocks == 0


def test_a_sequence_holding_a_cached_block_keeps_it_through_a_full_pool():
    """A long answer fills the pool while a follow-up holds the turn before's blocks: the answer fails, the
    follow-up's blocks are still cached when it gives them back."""
    driver = Driver()
    driver.run("turn a A:8\nopen b A:9\ntake x 1")
    with pytest.raises(PoolFull):
        driver.pool.allocate(1)
    driver.run("close b\nclose x")
    assert driver.finds("A:40") == 2 and driver.pool.free_count == BLOCKS


# ------------------------------------------------------------------------------------------------ release
@pytest.mark.parametrize("script", [
    "open a A:8",
    "open a A:10",
    "open a A:8\nopen b A:12\nopen c A:9",
    "turn a A:8\nopen b A:16\nopen c B:7",
    "start a A:8\nstart b A:8\ncache a\ncache b",
    "open a A:8\ntake x 2",
], ids=["one prompt", "a partly filled block", "three sharing blocks", "a hit and a miss", "written twice",
        "with a long answer"])
def test_giving_every_block_back_frees_the_whole_pool(script: str):
    driver = Driver(blocks=6)
    driver.run(script)
    assert driver.pool.free_count < 6
    for name in list(driver.held):
        driver.close(name)
    assert driver.pool.free_count == 6
    driver.take("all", 6)  # every block can be written again (the cached ones evicted)
    assert driver.pool.free_count == 0 and driver.pool.cached_blocks == 0


# ------------------------------------------------------------------------------------------------- hashes
@pytest.mark.parametrize(("n", "full"), [(0, 0), (1, 0), (3, 0), (4, 1), (7, 1), (8, 2), (9, 2), (40, 10)])
def test_hashes_cover_full_blocks_only(n: int, full: int):
    ids = CONVERSATIONS["A"][:n]
    assert len(block_hashes(ids, block_tokens=BLOCK)) == full
    assert block_hashes(ids, block_tokens=BLOCK) == block_hashes(CONVERSATIONS["A"], block_tokens=BLOCK)[:full]


@pytest.mark.parametrize(("first", "second", "alike"), [
    (("A:12", ""), ("A:12", ""), True),
    (("A:12", "user:1"), ("A:12", "user:1"), True),
    (("A:12", "user:1"), ("A:12", "user:2"), False),
    (("A:12", "user:1"), ("A:12", ""), False),
    (("A:12", "user:1"), ("A:12", "key:1"), False),
], ids=["no scope twice", "one user twice", "two users", "a user and the server", "a user and a key"])
def test_the_same_tokens_hash_alike_under_one_scope_only(first, second, alike):
    one = block_hashes(tokens_of(first[0]), block_tokens=BLOCK, scope=first[1])
    two = block_hashes(tokens_of(second[0]), block_tokens=BLOCK, scope=second[1])
    assert len(one) == len(two) == 3
    # every block: a scope keys the chain from its first block on
    assert [a == b for a, b in zip(one, two, strict=True)] == [alike] * 3


def test_a_hash_chains_every_token_before_its_block():
    ids = tokens_of("A:12")
    base = block_hashes(ids, block_tokens=BLOCK)
    changed_first = block_hashes([ids[0] + 1, *ids[1:]], block_tokens=BLOCK)
    changed_last = block_hashes([*ids[:-1], ids[-1] + 1], block_tokens=BLOCK)
    assert all(a != b for a, b in zip(base, changed_first, strict=True))
    assert base[:2] == changed_last[:2] and base[2] != changed_last[2]
    assert block_hashes(ids, block_tokens=6) != base[:2]  # a block of other size is another block


def test_hashes_are_the_same_in_another_process():
    """Not Python's salted hash(): the web side may compute them to route a turn to the worker holding its blocks."""
    ids = tokens_of("A:12")
    code = ("from inference.engines.own.block_pool import block_hashes; "
            f"print([h.hex() for h in block_hashes({ids}, block_tokens={BLOCK}, scope='user:7')])")
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                         env={**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(root)}).stdout
    assert out.strip() == str([h.hex() for h in block_hashes(ids, block_tokens=BLOCK, scope="user:7")])


# ------------------------------------------------------------------------------------------------- stats
@dataclass(frozen=True)
class Counted:
    name: str
    script: str
    queries: int
    hits: int
    evicted: int
    cached: int
    free: int = BLOCKS


COUNTED = [
    Counted("a miss", "turn a A:10", 10, 0, 0, 2),
    Counted("a miss then a hit", "turn a A:10\nturn b A:10", 20, 8, 0, 2),
    Counted("a follow-up", "turn a A:9\nturn b A:14", 23, 8, 0, 3),
    Counted("a hit then an eviction", "turn a A:8\nturn b A:9\ntake x 3", 17, 8, 1, 1, 1),
    Counted("another user's prompt", "turn a A:10 @user:1\nturn b A:10 @user:2", 20, 0, 1, 3),
]


@pytest.mark.parametrize("case", COUNTED, ids=[case.name for case in COUNTED])
def test_the_pool_counts_lookups_hits_and_evictions(case: Counted):
    driver = Driver()
    driver.run(case.script)
    stats = driver.pool.stats
    assert (stats.queries, stats.hits, stats.evicted_blocks) == (case.queries, case.hits, case.evicted)
    assert driver.pool.cached_blocks == case.cached
    assert driver.pool.free_count == case.free
    assert BlockPool(blocks=3, block_tokens=BLOCK, block_bytes=100).cached_bytes == 0


# --------------------------------------------------------------------------------------------------- tails
@dataclass(frozen=True)
class Tail:
    name: str
    then: str  # what happens between the answer's end and the follow-up: "", "take", "fill", "newer", "held"
    after: str  # the hash the follow-up looks after: "same" or "other" (another user's, another conversation's)
    tokens: tuple[int, ...]  # the follow-up's tokens after its full blocks (its last token left out)
    taken: int | None  # tokens the tail gives it (None: not found)


TAILS = [
    Tail("a follow-up continuing the answer's tokens takes the tail", "", "same", (7, 8, 9), 2),
    Tail("a follow-up ending where the tail does takes it", "", "same", (7, 8), 2),
    Tail("an edit of the answer's last tokens does not", "", "same", (7, 5, 9), None),
    Tail("a prompt shorter than the tail does not", "", "same", (7,), None),
    Tail("another scope's or conversation's chain does not", "", "other", (7, 8, 9), None),
    Tail("a tail is taken once: a partly filled block is never shared", "take", "same", (7, 8, 9), None),
    Tail("a slot needed takes the tail's block like a cached one's", "fill", "same", (7, 8, 9), None),
    Tail("a newer tail after the same blocks replaces the older", "newer", "same", (7, 8, 9), None),
    Tail("a tail still held by its sequence is not taken", "held", "same", (7, 8, 9), None),
]


@pytest.mark.parametrize("case", TAILS, ids=[case.name for case in TAILS])
def test_what_a_follow_up_finds_of_the_last_turns_partly_filled_block(case: Tail):
    pool = BlockPool(blocks=BLOCKS, block_tokens=BLOCK)
    before = block_hashes(CONVERSATIONS["A"][:BLOCK], block_tokens=BLOCK)[-1]
    block = pool.allocate(1)[0]
    pool.keep_tail(block, after=before, tokens=[7, 8])
    if case.then != "held":
        pool.release([block])
    if case.then == "take":
        assert pool.take_tail(after=before, tokens=[7, 8, 9]) == (block, 2)
    if case.then == "fill":
        pool.allocate(BLOCKS)
    if case.then == "newer":
        newer = pool.allocate(1)[0]
        pool.keep_tail(newer, after=before, tokens=[7, 3])
        pool.release([newer])
    after = before if case.after == "same" else block_hashes(CONVERSATIONS["B"][:BLOCK], block_tokens=BLOCK)[-1]
    assert pool.take_tail(after=after, tokens=list(case.tokens)) == (None if case.taken is None else (block, 2))


def test_a_tail_outlives_blocks_nothing_was_cached_in():
    """Freed, the tail waits with the cached blocks: a slot is taken from never-cached blocks first."""
    pool = BlockPool(blocks=BLOCKS, block_tokens=BLOCK)
    blocks = pool.allocate(BLOCKS)
    pool.keep_tail(blocks[0], after=b"", tokens=[7])
    pool.release(blocks)
    pool.allocate(BLOCKS - 1)
    assert pool.take_tail(after=b"", tokens=[7, 8]) == (blocks[0], 1) and pool.free_count == 0
