"""The chat over its websocket, end to end on real parts: Redis streams, a Celery worker running
openvino-genai on the shipped demo pair, and the database."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from chatsite.chat import services
from chatsite.chat.models import Conversation, Message
from inference.models import Generation, ModelPair
from inference.serving import readers
from tests.conftest import chat_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]
PROMPT = "def quicksort(numbers):"


async def connect(user) -> WebsocketCommunicator:
    """A websocket logged in as `user` through the real session middleware."""
    communicator = await chat_socket(user)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def receive(communicator, timeout=60, *, titles: bool = False) -> dict:
    """The socket's next frame; a title the pair wrote after a first answer is passed over unless asked for."""
    while (frame := await communicator.receive_json_from(timeout=timeout))["type"] == "title" and not titles:
        pass
    return frame


async def send_message(communicator, *, text=PROMPT, pair="demo-code", conversation=None, **settings) -> dict:
    await communicator.send_json_to({"action": "send", "pair": pair, "text": text, "conversation": conversation,
                                     "settings": settings})
    return await receive(communicator)


async def events_until_end(communicator, generation: str, *, on_delta=None) -> list[dict]:
    """Every event of `generation` up to its terminal one ({id, event} dicts)."""
    seen = []
    while True:
        message = await receive(communicator)
        if message["type"] != "event" or message["generation"] != generation:
            continue
        seen.append(message)
        if message["event"]["type"] == "delta" and on_delta:
            await on_delta(len(seen))
        if message["event"]["type"] in ("done", "error"):
            return seen


def streamed_text(events) -> str:
    return "".join(d + m for e in events if e["event"]["type"] == "delta" for d, m in e["event"]["steps"])


async def test_answer_streams_the_main_models_greedy_output(demo_pair, user, main_alone_greedy):
    communicator = await connect(user)
    started = await send_message(communicator, max_tokens=64)
    assert started["type"] == "started", started
    events = await events_until_end(communicator, started["generation"])
    done = events[-1]["event"]
    assert done["type"] == "done"
    deltas = [e for e in events if e["event"]["type"] == "delta"]
    assert len(deltas) >= 2, "tokens should arrive in several batches, not all at the end"
    start = next(e["event"] for e in events if e["event"]["type"] == "start")
    assert "worker" not in start and start["prompt_tokens"] > 0  # not the worker's host and pid
    assert start["speculative_mode"] == "draft" and start["speculative_k"] == done["speculative_k"]
    assert streamed_text(events) == done["text"]
    prompt = await sync_to_async(lambda: Generation.objects.get(id=started["generation"]).prompt)()
    assert done["text"] == main_alone_greedy(prompt, 64, add_special_tokens=False)
    # Speculation really happened: fewer main steps than tokens, and the figures agree.
    assert done["completion_tokens"] == 64 and done["finish_reason"] == "length"
    assert done["main_steps"] < done["completion_tokens"]
    assert 0 < done["acceptance_rate"] <= 1 and done["mean_accepted_length"] > 1
    assert done["accepted_tokens"] == sum(done["accepted_by_position"][:1]) + sum(done["accepted_by_position"][1:])
    generation = await Generation.objects.aget(id=started["generation"])
    assert generation.status == "finished" and generation.text == done["text"] and generation.worker
    assert generation.ttft_ms > 0 and generation.tokens_per_s > 0 and generation.prompt_tokens > 0
    assert "".join(d + m for d, m in generation.steps) == generation.text
    message = await Message.objects.select_related("conversation").aget(generation=generation)
    assert message.conversation.title == PROMPT and message.role == "assistant"
    await communicator.disconnect()


async def test_an_answer_repeating_itself_is_stopped_and_says_so_and_the_api_runs_on(demo_pair, user, api_key,
                                                                                    main_alone_greedy):
    """The demo main, greedy, writes `'call', ` over and over after "class Stack:": the chat stops it once a span has
    come back three times over 128 tokens or more, its text the main alone's up to there, and it can be continued. The
    API's answer to the same prompt runs to the max tokens asked (a script asks for what it wants)."""
    communicator = await connect(user)
    started = await send_message(communicator, text="class Stack:", max_tokens=400)
    assert started["type"] == "started", started
    done = (await events_until_end(communicator, started["generation"]))[-1]["event"]
    assert done["type"] == "done" and done["finish_reason"] == "repeating", done
    assert 128 <= done["completion_tokens"] < 300, done
    generation = await Generation.objects.aget(id=started["generation"])
    assert generation.status == Generation.Status.STOPPED and generation.finish_reason == "repeating"
    reference = main_alone_greedy(generation.prompt, 400, add_special_tokens=False)
    assert reference.startswith(done["text"]) and len(reference) > len(done["text"])  # the same answer, cut
    await communicator.send_json_to({"action": "continue", "message": started["message"], "settings": {}})
    assert (await receive(communicator))["type"] == "started"  # Continue is offered for it, as for a stopped answer
    await communicator.disconnect()

    api = await sync_to_async(Client)()
    response = await sync_to_async(api.post)(
        "/v1/completions", {"model": "demo-code", "prompt": "class Stack:", "max_tokens": 300, "temperature": 0},
        content_type="application/json", headers={"authorization": f"Bearer {api_key.secret}"})
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["finish_reason"] == "length"


async def test_two_answers_on_one_worker_are_batched(demo_pair, user, other_user, main_alone_greedy):
    alice, bob = await connect(user), await connect(other_user)
    first = await send_message(alice, max_tokens=160)
    second: dict = {}

    async def ask_while_the_first_streams(_count):
        if not second:
            second.update(await send_message(bob, text="class Stack:\n    def __init__(self):", max_tokens=96))

    first_events = await events_until_end(alice, first["generation"], on_delta=ask_while_the_first_streams)
    second_events = await events_until_end(bob, second["generation"])
    for started, events, max_tokens in ((first, first_events, 160), (second, second_events, 96)):
        assert events[-1]["event"]["type"] == "done"
        generation = await Generation.objects.aget(id=started["generation"])
        assert generation.text == main_alone_greedy(generation.prompt, max_tokens, add_special_tokens=False)
    a, b = await Generation.objects.aget(id=first["generation"]), await Generation.objects.aget(id=second["generation"])
    # Batched, not serialised: the second, asked while the first streamed, started before the first finished.
    assert a.worker == b.worker
    assert b.started_at < a.finished_at, f"second started {b.started_at}, first ran {a.started_at} to {a.finished_at}"
    await alice.disconnect()
    await bob.disconnect()


async def test_stop_keeps_what_was_produced(demo_pair, user):
    communicator = await connect(user)
    started = await send_message(communicator, max_tokens=500)

    async def stop_on_first_delta(count):
        if count == 2:
            await communicator.send_json_to({"action": "stop", "generation": started["generation"]})

    events = await events_until_end(communicator, started["generation"], on_delta=stop_on_first_delta)
    done = events[-1]["event"]
    assert done["type"] == "done" and done["finish_reason"] == "stopped"
    assert 0 < done["completion_tokens"] < 500
    generation = await Generation.objects.aget(id=started["generation"])
    assert generation.status == "stopped" and generation.text == streamed_text(events) == done["text"]
    await communicator.disconnect()


async def test_reconnect_resumes_without_loss_or_doubling(demo_pair, user):
    first = await connect(user)
    started = await send_message(first, max_tokens=200)
    generation = started["generation"]
    before = []
    while len(before) < 3:
        message = await receive(first)
        if message["type"] == "event" and message["event"]["type"] == "delta":
            before.append(message)
    await first.disconnect()  # the browser drops mid-answer

    second = await connect(user)
    await second.send_json_to({"action": "follow", "generation": generation, "after": before[-1]["id"]})
    after = await events_until_end(second, generation)
    ids = [e["id"] for e in before + after]
    assert len(ids) == len(set(ids)) and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert streamed_text(before + after) == after[-1]["event"]["text"]
    await second.disconnect()


async def test_following_past_the_end_of_an_answer_gets_an_error_not_silence(demo_pair, user):
    communicator = await connect(user)
    started = await send_message(communicator, max_tokens=8)
    events = await events_until_end(communicator, started["generation"])
    for after in (events[-1]["id"], "99999999999999-0"):  # the end itself, and an id past it
        await communicator.send_json_to({"action": "follow", "generation": started["generation"], "after": after})
        ended = await events_until_end(communicator, started["generation"])
        assert [e["event"]["type"] for e in ended] == ["error"] and "ended" in ended[0]["event"]["message"]
    await communicator.disconnect()


async def test_another_users_answer_is_refused(demo_pair, user, other_user):
    alice = await connect(user)
    started = await send_message(alice, max_tokens=8)
    await events_until_end(alice, started["generation"])
    bob = await connect(other_user)
    for action in ("follow", "stop"):
        await bob.send_json_to({"action": action, "generation": started["generation"]})
        reply = await receive(bob)
        assert reply["type"] == "error" and reply["code"] == "not_found"
    await bob.send_json_to({"action": "send", "pair": "demo-code", "text": "hi", "conversation": started["conversation"],
                            "settings": {}})
    assert (await receive(bob))["code"] == "not_found"
    bob_client = Client()
    await sync_to_async(bob_client.force_login)(other_user)
    response = await sync_to_async(bob_client.get)(f"/c/{started['conversation']}/")
    assert response.status_code == 302 and response["Location"] == "/?gone"  # as a deleted one: a new chat
    assert await Message.objects.filter(conversation_id=started["conversation"]).acount() == 2
    await alice.disconnect()
    await bob.disconnect()


async def test_anonymous_websocket_is_closed():
    communicator = await chat_socket(None)
    connected, code = await communicator.connect()
    assert not connected and code == 4401


BAD_INPUTS = [
    ({"text": ""}, "prompt", "empty"),
    ({"text": "   \n"}, "prompt", "empty"),
    ({"text": "def f():\x00"}, "prompt", "NUL"),
    ({"text": "x = 1\n" * 2000}, "prompt", "context"),
    ({"pair": "no-such-pair"}, "model", "does not exist"),
    ({"pair": "disabled-pair"}, "model", "does not exist"),
    ({"num_assistant_tokens": 4, "assistant_confidence_threshold": 0.5}, "assistant_confidence_threshold", "exclusive"),
    ({"num_assistant_tokens": 0}, "num_assistant_tokens", "[1, 32]"),
    ({"num_assistant_tokens": 33}, "num_assistant_tokens", "[1, 32]"),
    ({"assistant_confidence_threshold": 0}, "assistant_confidence_threshold", "(0, 1)"),
    ({"assistant_confidence_threshold": 1}, "assistant_confidence_threshold", "(0, 1)"),
    ({"max_tokens": 513}, "max_tokens", "cap of 512"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"max_tokens": "many"}, "max_tokens", "must be int"),
    ({"temperature": 3.0}, "temperature", "[0, 2]"),
]


@pytest.mark.parametrize("change, param, words", BAD_INPUTS)
async def test_bad_input_gets_a_clear_error_and_changes_nothing(demo_pair, user, change, param, words):
    await sync_to_async(ModelPair.objects.create)(
        name="Disabled", slug="disabled-pair", main_dir=demo_pair.main_dir, draft_dir=demo_pair.draft_dir,
        num_assistant_tokens=3, enabled=False)
    communicator = await connect(user)
    text = change.pop("text", PROMPT)
    pair = change.pop("pair", "demo-code")
    reply = await send_message(communicator, text=text, pair=pair, **change)
    assert reply["type"] == "error" and reply["param"] == param and words in reply["message"], reply
    assert await Conversation.objects.acount() == 0
    assert await Message.objects.acount() == 0
    assert await Generation.objects.acount() == 0
    await communicator.disconnect()


async def test_malformed_messages_get_errors(user):
    communicator = await connect(user)
    for payload in ({"action": "dance"}, {"action": "follow", "generation": "not-a-uuid"},
                    {"action": "send", "pair": "demo-code", "text": 5, "settings": {}}):
        await communicator.send_json_to(payload)
        assert (await receive(communicator))["type"] == "error"
    await communicator.send_to(text_data="not json")
    assert (await receive(communicator))["code"] == "invalid_json"
    await communicator.disconnect()


async def test_a_pair_loading_says_so_and_one_that_fails_to_load_shows_an_error(demo_pair, user):
    # Saved around validation, as if its files broke after registration: the draft folder has no model.
    await sync_to_async(ModelPair.objects.create)(
        name="Broken", slug="broken", main_dir=demo_pair.main_dir, draft_dir="demo-code",
        num_assistant_tokens=3)
    communicator = await connect(user)
    started = await send_message(communicator, pair="broken", max_tokens=8)
    events = await events_until_end(communicator, started["generation"])
    assert [e["event"]["type"] for e in events] == ["loading", "error"]  # the wait said what it was
    assert "failed to load" in events[-1]["event"]["message"]
    generation = await Generation.objects.aget(id=started["generation"])
    assert generation.status == "failed"
    await communicator.disconnect()


async def test_regenerate_writes_a_new_version_of_the_last_answer(demo_pair, user):
    communicator = await connect(user)
    started = await send_message(communicator, max_tokens=16)
    first = await events_until_end(communicator, started["generation"])
    await communicator.send_json_to({"action": "regenerate", "message": started["message"],
                                     "settings": {"max_tokens": 16, "speculative": False}})
    again = await receive(communicator)
    assert again["type"] == "started" and again["message"] != started["message"]
    second = await events_until_end(communicator, again["generation"])
    assert second[-1]["event"]["text"] == first[-1]["event"]["text"]  # greedy: same answer without the draft
    assert second[-1]["event"]["acceptance_rate"] is None  # and no speculation was used
    message = await Message.objects.select_related("generation").aget(id=again["message"])
    assert str(message.generation_id) == again["generation"] and message.shown
    assert not (await Message.objects.aget(id=started["message"])).shown  # kept, another version
    await communicator.disconnect()


async def test_after_its_first_answer_the_pair_writes_the_chats_title_once_and_leaves_it_in_its_place(demo_pair, user):
    """As Open WebUI does: greedy, a few tokens, asked after the conversation (whose blocks the worker still holds),
    never before the answer's end, on the engine that wrote the answer; the chat keeps its place in the list, and later answers
    ask for no other title."""
    communicator = await connect(user)
    started = await send_message(communicator, max_tokens=16)
    await events_until_end(communicator, started["generation"])
    before = await Conversation.objects.aget(id=started["conversation"])
    assert before.title == PROMPT  # the first message's line, until the pair has written one
    titled = await receive(communicator, titles=True)
    assert titled["type"] == "title" and titled["conversation"] == started["conversation"], titled
    after = await Conversation.objects.aget(id=started["conversation"])
    assert (after.title, after.title_source) == (titled["title"], "model") and after.title not in ("", PROMPT)
    assert after.updated_at == before.updated_at  # not moved to the top: nothing was said in it
    title = await Generation.objects.aget(source="title")
    answer = await Generation.objects.aget(id=started["generation"])
    assert title.prompt.startswith(answer.prompt) and services.TITLE_REQUEST in title.prompt  # asked as a follow-up
    assert title.completion_tokens <= services.TITLE_MAX_TOKENS and title.speculative_route == answer.speculative_route
    assert title.user_id == user.id  # in the user's cache scope: the conversation's blocks are theirs
    follow_up = await send_message(communicator, conversation=started["conversation"], max_tokens=8)
    await events_until_end(communicator, follow_up["generation"])
    await asyncio.sleep(1)
    assert await Generation.objects.filter(source="title").acount() == 1
    await communicator.disconnect()


def test_a_title_the_user_gave_is_never_written_over(demo_pair, user):
    """Renamed while the pair writes its title: the user's stays."""
    answer = Message.objects.create(conversation=Conversation.objects.create(user=user, pair=demo_pair, title="q"),
                                    role="assistant", generation=Generation.objects.create(
                                        pair=demo_pair, user=user, prompt="q", status="finished", text="a"))
    Message.objects.create(conversation=answer.conversation, role="user", content="q")
    conversation_id, title = services.start_written_title(user=user, generation_id=answer.generation_id)
    services.rename_conversation(user=user, conversation_id=conversation_id, title="Mine")
    assert async_to_sync(readers.wait_for)(generation_id=title.id).status == "finished"
    assert services.keep_written_title(user=user, conversation_id=conversation_id, generation_id=title.id) is None
    assert Conversation.objects.get(id=conversation_id).title == "Mine"
    assert services.start_written_title(user=user, generation_id=answer.generation_id) is None  # asked once


def test_kept_conversation_page_lists_the_answer(client, demo_pair, user):
    conversation = Conversation.objects.create(user=user, title="Sorting", pair=demo_pair)
    Message.objects.create(conversation=conversation, role="user", content="def quicksort(numbers):")
    client.force_login(user)
    page = client.get(f"/c/{conversation.id}/").content.decode()
    assert "Sorting" in page and json.dumps("def quicksort(numbers):")[1:-1] in page


async def test_pair_nobody_serves_fails_fast(demo_pair, user):
    await sync_to_async(ModelPair.objects.create)(
        name="Unserved", slug="unserved", main_dir=demo_pair.main_dir, draft_dir=demo_pair.draft_dir,
        num_assistant_tokens=3)
    communicator = await connect(user)
    reply = await send_message(communicator, pair="unserved")
    assert reply["type"] == "error" and reply["code"] == "model_unavailable" and "pair.unserved" in reply["message"]
    assert await Generation.objects.acount() == 0 and await Message.objects.acount() == 0
    await communicator.disconnect()


async def test_worker_that_dies_mid_answer_surfaces_as_an_error(demo_pair, user, stack_env, redis_client, tmp_path):
    from tests.conftest import Worker

    await sync_to_async(ModelPair.objects.create)(
        name="Doomed", slug="doomed", main_dir=demo_pair.main_dir, draft_dir=demo_pair.draft_dir,
        num_assistant_tokens=3)
    env = {**stack_env, "SPECCHAT_WORKER_HEARTBEAT_S": "1", "SPECCHAT_WORKER_HEARTBEAT_TTL_S": "3"}
    worker = Worker(env, "pair.doomed", tmp_path / "doomed.log")
    try:
        await sync_to_async(worker.wait_ready)(redis_client)
        communicator = await connect(user)
        started = await send_message(communicator, pair="doomed", max_tokens=500)

        async def kill_worker(_):
            if worker.proc.poll() is None:  # at the first delta (the pair's loading and the start came before)
                worker.proc.kill()

        events = await events_until_end(communicator, started["generation"], on_delta=kill_worker)
        last = events[-1]["event"]
        assert last["type"] == "error" and "stopped before it finished" in last["message"]
        generation = await Generation.objects.aget(id=started["generation"])
        assert generation.status == "failed"
        await communicator.disconnect()
    finally:
        worker.stop()


async def reply_to_request(communicator) -> dict:
    """The answer to the last request (started or error), skipping events of answers being streamed."""
    while (message := await receive(communicator))["type"] == "event":
        pass
    return message


async def wait_until_ended(generation_id, timeout=30) -> Generation:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        generation = await Generation.objects.aget(id=generation_id)
        if generation.is_done:
            return generation
        await asyncio.sleep(0.1)
    raise AssertionError(f"generation {generation_id} did not end")


async def test_one_user_has_a_limited_number_of_answers_in_flight(demo_pair, user, other_user):
    alice = await connect(user)
    long = {"max_tokens": 500, "speculative": False}
    first = await send_message(alice, **long)
    await alice.send_json_to({"action": "send", "pair": "demo-code", "text": "class Stack:", "settings": long})
    second = await reply_to_request(alice)
    assert first["type"] == second["type"] == "started"
    for tab in (alice, await connect(user)):  # another tab of hers counts too
        await tab.send_json_to({"action": "send", "pair": "demo-code", "text": "x = 1", "settings": {"max_tokens": 8}})
        refused = await reply_to_request(tab)
        assert refused["type"] == "error" and refused["code"] == "concurrency_limit_exceeded", refused
        assert "2 answers" in refused["message"]  # SPECCHAT_CHAT_MAX_CONCURRENT's default
    bob = await connect(other_user)  # others are not held back by her
    assert (await send_message(bob, max_tokens=8))["type"] == "started"
    for started in (first, second):
        await alice.send_json_to({"action": "stop", "generation": started["generation"]})
        await wait_until_ended(started["generation"])
    await alice.send_json_to({"action": "send", "pair": "demo-code", "text": "x = 1", "settings": {"max_tokens": 8}})
    assert (await reply_to_request(alice))["type"] == "started"  # a slot is free again
    assert await Generation.objects.filter(user=user, source="chat").acount() == 3  # and each new chat's title
    for communicator in (alice, bob):
        await communicator.disconnect()


async def test_closing_the_chat_stops_its_answers_nobody_else_follows(demo_pair, user, settings):
    settings.CHAT_ABANDON_GRACE_S = 0  # the demo pair writes 500 tokens in about 2 s here
    first_tab = await connect(user)
    long = {"max_tokens": 500, "speculative": False}
    alone = await send_message(first_tab, **long)
    await first_tab.send_json_to({"action": "send", "pair": "demo-code", "text": "class Stack:", "settings": long})
    shared = await reply_to_request(first_tab)
    second_tab = await connect(user)  # follows the second answer too
    await second_tab.send_json_to({"action": "follow", "generation": shared["generation"]})
    assert (await receive(second_tab))["type"] == "event"
    await first_tab.disconnect()

    stopped = await wait_until_ended(alone["generation"])
    assert stopped.status == "stopped" and stopped.completion_tokens < 500
    still = await Generation.objects.aget(id=shared["generation"])
    assert still.status == "running", "an answer another tab follows goes on"
    await second_tab.send_json_to({"action": "stop", "generation": shared["generation"]})
    await wait_until_ended(shared["generation"])
    await second_tab.disconnect()


async def test_a_reload_within_the_grace_period_keeps_the_answer(large_demo_pair, user, settings):
    """The memory-bound demo main: the small one wrote its 500 tokens within the grace on an AMD Zen 5 host, and an
    answer over before the grace ends proves nothing about it."""
    settings.CHAT_ABANDON_GRACE_S = 0.5
    first = await connect(user)
    started = await send_message(first, max_tokens=500, speculative=False)
    reloaded = await chat_socket(user)  # the page coming back (its session ready)
    await first.disconnect()
    assert (await reloaded.connect())[0]
    await reloaded.send_json_to({"action": "follow", "generation": started["generation"]})
    events = await events_until_end(reloaded, started["generation"])
    assert events[-1]["event"]["finish_reason"] in ("length", "stop", "repeating")  # its own end, not "stopped"
    assert events[-1]["event"]["duration_ms"] > 1000 * settings.CHAT_ABANDON_GRACE_S  # it outlived the grace
    await reloaded.disconnect()


async def test_one_answer_at_a_time_in_a_conversation(demo_pair, user):
    """Two regenerate actions at once (two tabs, a double click) on one answer: exactly one new answer is
    written and the other is refused in plain words; a message sent meanwhile is refused too."""
    first_tab, second_tab = await connect(user), await connect(user)
    started = await send_message(first_tab, max_tokens=8)
    await events_until_end(first_tab, started["generation"])
    regenerate = {"action": "regenerate", "message": started["message"], "settings": {"max_tokens": 500,
                                                                                      "speculative": False}}
    await asyncio.gather(first_tab.send_json_to(regenerate), second_tab.send_json_to(regenerate))
    replies = await asyncio.gather(reply_to_request(first_tab), reply_to_request(second_tab))
    assert sorted(reply["type"] for reply in replies) == ["error", "started"], replies
    refused = next(reply for reply in replies if reply["type"] == "error")
    assert refused["code"] == "answer_in_progress", refused
    assert refused["message"] == ("An answer is still being written in this chat: wait for it to finish, "
                                  "or stop it.")
    running = next(reply for reply in replies if reply["type"] == "started")
    # No answer runs that no message shows: the original and the one regenerated, nothing else (but its title).
    assert await Generation.objects.exclude(source="title").acount() == 2
    assert await Generation.objects.exclude(source="title").filter(status__in=["queued", "running"]).acount() == 1
    message = await Message.objects.aget(id=running["message"])
    assert str(message.generation_id) == running["generation"]

    await second_tab.send_json_to({"action": "send", "pair": "demo-code", "text": "class Stack:",
                                   "conversation": started["conversation"], "settings": {"max_tokens": 8}})
    assert (await reply_to_request(second_tab))["code"] == "answer_in_progress"
    assert await Message.objects.filter(conversation_id=started["conversation"]).acount() == 3  # two versions

    await first_tab.send_json_to({"action": "stop", "generation": running["generation"]})
    await wait_until_ended(running["generation"])
    await second_tab.send_json_to({"action": "send", "pair": "demo-code", "text": "class Stack:",
                                   "conversation": started["conversation"], "settings": {"max_tokens": 8}})
    assert (await reply_to_request(second_tab))["type"] == "started"  # the conversation takes the next one
    for communicator in (first_tab, second_tab):
        await communicator.disconnect()


async def test_a_message_that_sets_no_sampling_samples_as_the_pairs_publisher_advises(demo_pair, user):
    """As LM Studio and Ollama do: the pair's chat defaults (Qwen's for its coder models here); greedy is one setting
    away, and the API keeps its own defaults (tests/test_api.py)."""
    demo_pair.chat_sampling = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    await demo_pair.asave()
    communicator = await connect(user)
    advised = await send_message(communicator, max_tokens=8)
    await events_until_end(communicator, advised["generation"])
    greedy = await send_message(communicator, max_tokens=8, temperature=0, conversation=advised["conversation"])
    await events_until_end(communicator, greedy["generation"])
    decoding = [(await Generation.objects.aget(id=started["generation"])).params["decoding"]
                for started in (advised, greedy)]
    assert [(d["temperature"], d["top_p"], d["top_k"], d["repetition_penalty"]) for d in decoding] == [
        (0.7, 0.8, 20, 1.05), (0.0, 1.0, 0, 1.0)]
    await communicator.disconnect()
