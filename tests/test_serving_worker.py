"""A worker's answer loop (inference/serving/worker.py), called in this process as a Celery task calls it."""

from dataclasses import asdict

import pytest

from inference.engines.decoding import DecodingParams
from inference.models import Generation, ModelPair
from inference.serving.worker import STATE, WORKER_NAME, current_load, run_generation

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_second_delivery_of_an_answer_another_thread_serves_leaves_it_to_that_thread(demo_pair):
    """A stopping worker hands its turns back to the shared queue while the web re-routes the same turns: one worker
    can get one generation twice. The second delivery read it queued, just before the first thread's row said
    running; it must neither serve it again nor, ending, drop the claim the first thread still holds (the heartbeat's
    reconcile then failed the answer under way: "could not be saved", issue 66's SIGTERM test on PostgreSQL)."""
    generation = Generation.objects.create(pair=demo_pair, prompt="def f(x):", prompt_tokens=4, params={
        "decoding": asdict(DecodingParams(max_new_tokens=4)), "speculative": True})
    held = str(generation.id)
    STATE.claimed.add(held)  # the first delivery's thread, about to write its row running
    try:
        run_generation(generation_id=held, worker_name="this-worker")
        assert held in STATE.claimed, "the second delivery dropped the first one's claim"
        generation.refresh_from_db()
        assert generation.status == Generation.Status.QUEUED and not generation.worker  # left to the first
        assert not STATE.claim(held)
    finally:
        STATE.claimed.discard(held)
    assert STATE.claim(held)  # once the first is done, a later delivery may take it
    STATE.claimed.discard(held)


def test_a_chats_title_being_written_is_no_load_the_next_turn_plans_for(demo_pair):
    """The pair writes a chat's title after its first answer (12 tokens at most), and the chat's next turn often comes
    meanwhile. Counted as load, that turn started in the own engine's batch, not speculating, and the chat said "the
    main model alone: more of this pair's answers were running here" with no answer running but the title. Another
    user's answer still counts."""
    pair = ModelPair.objects.create(name="Titled", slug="titled", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir)

    def generation(source: str, status: str, worker: str = "") -> Generation:
        return Generation.objects.create(pair=pair, prompt="def f(x):", prompt_tokens=4, source=source, status=status,
                                         worker=worker, params={"decoding": asdict(DecodingParams(max_new_tokens=4))})

    generation(Generation.Source.TITLE, Generation.Status.RUNNING, WORKER_NAME)
    generation(Generation.Source.CHAT, Generation.Status.QUEUED)  # the next turn, planning
    assert current_load(pair=pair) == 1
    generation(Generation.Source.API, Generation.Status.QUEUED)  # another user's
    assert current_load(pair=pair) == 2
