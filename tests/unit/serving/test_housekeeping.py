"""Which queued turns the live workers take back from the worker they were routed to (the rule, on real Redis and
the database; tests/test_serving_routing.py runs it with real workers, one of them hung)."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from inference.models import Generation, ModelPair
from inference.serving.housekeeping import reroute_from_gone_workers
from inference.serving.lifecycle import announce_worker

pytestmark = pytest.mark.django_db

HOLDER = "vm:4242"


@pytest.mark.parametrize(("heartbeat", "waited_s", "taken_back"), [
    ({"active": 0}, settings.ROUTE_UNCLAIMED_S + 1, True),  # a free slot, unclaimed: hung, or killed out of sight
    ({"active": 0}, 0, False),  # just routed: a live worker claims it within milliseconds
    ({"active": settings.WORKER_SLOTS}, settings.ROUTE_UNCLAIMED_S + 1, False),  # every slot taken: it waits there
    ({"active": 0, "stopping": True}, 0, True),  # stopping: it takes nothing new
    (None, 0, True),  # no heartbeat: gone
])
def test_a_routed_turn_is_taken_back_where_its_worker_is_gone_or_leaves_it_unclaimed_with_a_slot_free(
        redis_client, heartbeat, waited_s, taken_back):
    pair = ModelPair.objects.create(name="Routed", slug="routed", main_dir="main", draft_dir="draft")
    if heartbeat is not None:
        announce_worker(client=redis_client, name=HOLDER, ttl_s=60,
                        payload={"name": HOLDER, "queues": [pair.queue], "slots": settings.WORKER_SLOTS, **heartbeat})
    turn = Generation.objects.create(pair=pair, prompt="def f():", routed_to=HOLDER)
    Generation.objects.filter(id=turn.id).update(created_at=timezone.now() - timedelta(seconds=waited_s))

    reroute_from_gone_workers(client=redis_client)

    assert Generation.objects.get(id=turn.id).routed_to == ("" if taken_back else HOLDER)
