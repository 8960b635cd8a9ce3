"""The router's decisions, as a table: which worker's queue a turn goes to, given what each live worker holds and
how busy it is (real Redis sets, real records)."""

import time

import pytest
from django.conf import settings

from inference import transport
from inference.engines.own.block_pool import block_hashes
from inference.models import Generation, ModelPair
from inference.serving import routing
from inference.serving.routing import Candidate, RoutedBy

BLOCK = 16
PROMPT = list(range(1000, 1000 + 8 * BLOCK + 3))  # 8 full blocks, the last token's block partial
SCOPE = "user:7"


@pytest.mark.parametrize(("table", "chosen", "by"), [
    ({"a": (8, 0), "b": (0, 0)}, "a", RoutedBy.CACHE),  # a hit
    ({"a": (3, 0), "b": (6, 1)}, "b", RoutedBy.CACHE),  # the longer prefix wins, one answer busier or not
    ({"a": (8, 1 + 2), "b": (0, 1)}, "a", RoutedBy.CACHE),  # busier by the margin: still worth its cache
    ({"a": (8, 1 + 3), "b": (0, 1)}, "b", RoutedBy.LOAD),  # busier by more: the least busy takes it
    ({"a": (8, 5), "b": (2, 0), "c": (0, 0)}, "b", RoutedBy.LOAD),  # the least busy that holds some
    ({"a": (0, 1), "b": (0, 0)}, "b", RoutedBy.LOAD),  # nobody holds any of it
])
def test_the_rule(table, chosen, by):
    candidates = [Candidate(worker=name, held_blocks=held, in_flight=busy) for name, (held, busy) in table.items()]
    choice, how = routing.choose(candidates, margin=2)
    assert (choice.worker, how) == (chosen, by)


def test_with_no_worker_the_turn_goes_to_the_shared_queue():
    assert routing.choose([], margin=2) == (None, RoutedBy.SHARED)


def test_ties_spread():
    picked = {routing.choose([Candidate("a", 0, 0), Candidate("b", 0, 0)], margin=2)[0].worker for _ in range(64)}
    assert picked == {"a", "b"}


def beat(name: str, *slugs: str, state: str = "available", stopping: bool = False) -> dict:
    return {"name": name, "queues": [f"pair.{slug}" for slug in slugs], "stopping": stopping,
            "pairs": {slug: {"state": state} for slug in slugs}, "kv_block_tokens": dict.fromkeys(slugs, BLOCK)}


@pytest.fixture
def pairs(db, redis_client):
    for key in redis_client.scan_iter(f"{transport.PREFIX}held:*"):
        redis_client.delete(key)
    return (ModelPair.objects.create(name="One", slug="one", main_dir="m"),
            ModelPair.objects.create(name="Two", slug="two", main_dir="m"))


def hold(client, worker: str, slug: str, tokens: list[int], scope: str = SCOPE) -> None:
    routing.publish_held(client, worker=worker, slug=slug, ttl_s=30,
                         hashes=block_hashes(tokens, block_tokens=BLOCK, scope=scope))


def routed(client, pair, workers, scope=SCOPE):
    return routing.route(client, pair=pair, workers=workers, prompt_ids=PROMPT, scope=scope)


def test_routes_by_what_each_worker_published(redis_client, pairs):
    one, two = pairs
    workers = [beat("w1", "one", "two"), beat("w2", "one", "two")]
    hold(redis_client, "w1", "one", PROMPT[:3 * BLOCK])  # a partial hit
    hold(redis_client, "w2", "one", PROMPT)  # the whole prompt but the block of its last token
    turn = routed(redis_client, one, workers)
    assert (turn.worker, turn.by, turn.cached_tokens) == ("w2", RoutedBy.CACHE, 8 * BLOCK)
    assert turn.queue == "pair.one.w2"

    # Two pairs: what w2 holds of pair one says nothing of pair two.
    hold(redis_client, "w1", "two", PROMPT[:2 * BLOCK])
    assert (routed(redis_client, two, workers).worker, routed(redis_client, two, workers).cached_tokens) == (
        "w1", 2 * BLOCK)

    # Another user's identical prompt finds none of it.
    assert routed(redis_client, one, workers, scope="user:8").by == RoutedBy.LOAD

    # An overloaded holder: its turns in flight, recorded as routed to it.
    for _ in range(settings.ROUTE_LOAD_MARGIN + 1):
        Generation.objects.create(pair=one, prompt="x", routed_to="w2")
    assert (routed(redis_client, one, workers).worker, routed(redis_client, one, workers).by) == ("w1", RoutedBy.LOAD)
    Generation.objects.filter(routed_to="w2").update(status=Generation.Status.FINISHED)
    assert routed(redis_client, one, workers).worker == "w2"


def test_a_dead_stopping_or_failed_holder_is_passed_over(redis_client, pairs):
    one, _ = pairs
    hold(redis_client, "w2", "one", PROMPT)
    # Its heartbeat expired (not among the live workers), it is late (killed: it beats no more, its heartbeat not
    # expired yet), it is stopping, or the pair failed to load there.
    late = {**beat("w2", "one"), "beat_at": time.time() - settings.ROUTE_BEAT_LATE_S - 1}
    for workers in ([beat("w1", "one")], [beat("w1", "one"), late],
                    [beat("w1", "one"), beat("w2", "one", stopping=True)],
                    [beat("w1", "one"), beat("w2", "one", state="failed")]):
        turn = routed(redis_client, one, workers)
        assert (turn.worker, turn.by, turn.cached_tokens) == ("w1", RoutedBy.LOAD, 0)
    assert routed(redis_client, one, []).queue == "pair.one"  # nobody at all: the shared queue, judged later
    on_time = {**late, "beat_at": time.time() - settings.ROUTE_BEAT_LATE_S + 1}
    assert routed(redis_client, one, [beat("w1", "one"), on_time]).worker == "w2"
