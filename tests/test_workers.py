"""Workers announce themselves; the admin loads and unloads a pair on them without a restart."""

import time

import pytest

from inference import selectors, transport
from inference.models import ModelPair

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]


def wait_for_state(pair: ModelPair, wanted: str, timeout: float = 60) -> selectors.PairState:
    deadline = time.time() + timeout
    while True:
        state = selectors.pair_state(pair=pair, workers=selectors.live_workers(client=transport.sync_client()))
        if state.state == wanted or time.time() > deadline:
            return state
        time.sleep(0.5)


def test_heartbeat_shows_the_worker_and_its_queues(celery_worker, redis_client):
    beats = selectors.live_workers(client=redis_client)
    mine = next(b for b in beats if b["name"] == celery_worker.name)
    assert "pair.demo-code" in mine["queues"] and mine["slots"] > 0


def test_admin_loads_and_unloads_a_pair_without_restart(admin_client, demo_pair):
    pair = ModelPair.objects.create(name="Hot", slug="hot", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, num_assistant_tokens=3)
    assert wait_for_state(pair, "UNAVAILABLE", timeout=1).error == "no live worker serves queue pair.hot"
    page = admin_client.post("/admin/inference/modelpair/", {"action": "load_on_worker", "_selected_action": [pair.id]},
                             follow=True).content.decode()
    assert "1 worker(s) answered" in page
    assert wait_for_state(pair, "AVAILABLE").state == "AVAILABLE"
    listing = admin_client.get("/admin/inference/modelpair/").content.decode()
    assert "AVAILABLE on" in listing
    admin_client.post("/admin/inference/modelpair/", {"action": "unload_from_worker", "_selected_action": [pair.id]})
    assert wait_for_state(pair, "UNAVAILABLE").state == "UNAVAILABLE"
