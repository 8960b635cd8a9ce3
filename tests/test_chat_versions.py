"""Versions of a conversation, over the websocket and the chat's JSON endpoints on the real stack: a regenerated
answer and an edited message keep the old version reachable, the next prompt reads only the version shown
(the one picked last, kept on the server), exports follow it, and Continue extends an answer cut at its max
tokens."""

import json
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from chatsite.chat import selectors
from chatsite.chat.models import Conversation, Message
from inference.models import Generation
from tests.conftest import in_thread, log_in
from tests.test_chat import PROMPT, connect, events_until_end, receive, send_message
from tests.test_site_security import finished_generation, running_generation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def post(client: Client, url: str, body: dict) -> dict:
    return client.post(url, json.dumps(body), content_type="application/json").json()


def shown(messages: list[dict]) -> list[str]:
    return [m["text"] for m in messages]


async def answered(communicator, **send) -> dict:
    """A message sent and its answer ended: the `started` reply."""
    started = await send_message(communicator, **send)
    assert started["type"] == "started", started
    await events_until_end(communicator, started["generation"])
    return started


async def test_regenerate_keeps_the_old_answer_and_the_next_prompt_reads_the_shown_one(demo_pair, user):
    communicator = await connect(user)
    first = await answered(communicator, max_tokens=16)
    await communicator.send_json_to({"action": "regenerate", "message": first["message"],
                                     "settings": {"max_tokens": 6, "speculative": False}})
    again = await receive(communicator)
    assert again["type"] == "started" and again["message"] != first["message"]
    await events_until_end(communicator, again["generation"])
    long_text = (await Generation.objects.aget(id=first["generation"])).text
    short_text = (await Generation.objects.aget(id=again["generation"])).text
    assert long_text != short_text and long_text.startswith(short_text)  # greedy: the shorter is a prefix
    assert again["messages"][-1]["versions"] == [first["message"], again["message"]]  # shown as 2/2
    assert again["messages"][-1]["id"] == again["message"]

    alice = await sync_to_async(logged_in)(user)
    back = await sync_to_async(post)(alice, f"/m/{first['message']}/show/", {})
    assert shown(back["messages"]) == [PROMPT, long_text]  # the first version, kept whole
    page = await sync_to_async(alice.get)(f"/c/{first['conversation']}/")
    assert json.dumps(long_text)[1:-1] in page.content.decode()  # a reload shows the version picked

    await sync_to_async(post)(alice, f"/m/{again['message']}/show/", {})
    third = await answered(communicator, conversation=first["conversation"], text="x = 1", max_tokens=4)
    prompt = (await Generation.objects.aget(id=third["generation"])).prompt
    assert short_text in prompt and long_text not in prompt  # the version shown, and only it
    assert shown(third["messages"]) == [PROMPT, short_text, "x = 1", third["messages"][-1]["text"]]
    await communicator.disconnect()


async def test_editing_an_earlier_message_branches_and_the_old_branch_stays(demo_pair, user):
    communicator = await connect(user)
    first = await answered(communicator, max_tokens=6)
    conversation = first["conversation"]
    second = await answered(communicator, conversation=conversation, text="class Stack:", max_tokens=6)
    before = [*shown(second["messages"])[:-1], (await Generation.objects.aget(id=second["generation"])).text]

    alice = await sync_to_async(logged_in)(user)
    edited = await sync_to_async(post)(alice, f"/m/{first['messages'][0]['id']}/edit/",
                                       {"text": "def merge(a, b):", "settings": {"max_tokens": 6}})
    await communicator.send_json_to({"action": "follow", "generation": edited["generation"]})
    branch_answer = (await events_until_end(communicator, edited["generation"]))[-1]["event"]["text"]
    assert shown(edited["messages"]) == ["def merge(a, b):", ""]  # its answer just begun; what followed is not shown
    assert branch_answer
    question = edited["messages"][0]
    assert question["versions"] == [first["messages"][0]["id"], question["id"]]  # 2/2 on the message
    prompt = (await Generation.objects.aget(id=edited["generation"])).prompt
    assert "def merge(a, b):" in prompt and PROMPT not in prompt and "class Stack:" not in prompt

    markdown = (await sync_to_async(alice.get)(f"/c/{conversation}/export.md")).content.decode()
    assert "def merge(a, b):" in markdown and "class Stack:" not in markdown  # exports follow the shown path
    search = await sync_to_async(alice.get)("/c/search/", {"q": "Stack"})
    assert search.json()["conversations"] == []  # and so does the search

    back = await sync_to_async(post)(alice, f"/m/{first['messages'][0]['id']}/show/", {})
    assert shown(back["messages"]) == before  # the old branch, whole, as it was left
    exported = json.loads((await sync_to_async(alice.get)(f"/c/{conversation}/export.json")).content)
    assert [m["content"] for m in exported["messages"]] == before
    assert await Message.objects.filter(conversation_id=conversation).acount() == 6  # nothing was deleted
    await communicator.disconnect()


async def test_continue_extends_an_answer_cut_at_its_max_tokens(demo_pair, user):
    communicator = await connect(user)
    first = await answered(communicator, max_tokens=8)
    cut = await Generation.objects.aget(id=first["generation"])
    assert cut.finish_reason == "length"

    await communicator.send_json_to({"action": "continue", "message": first["message"], "settings": {"max_tokens": 8}})
    more = await receive(communicator)
    assert more["type"] == "started" and more["message"] == first["message"]  # the same answer, written further
    events = await events_until_end(communicator, more["generation"])
    added = events[-1]["event"]["text"]
    assert added
    continuation = await Generation.objects.aget(id=more["generation"])
    assert continuation.prompt.endswith(cut.text)  # the cut answer as the assistant's unfinished turn
    assert "<|endoftext|>" not in continuation.prompt  # (the demo template's end of an answer's turn)
    message = await Message.objects.select_related("generation").aget(id=first["message"])
    assert message.text == cut.text + added
    assert await Message.objects.acount() == 2
    await communicator.disconnect()


async def test_only_a_cut_answer_can_be_continued(demo_pair, user):
    generation = await sync_to_async(finished_generation)(pair=demo_pair, user=user)  # ended by itself
    message = await Message.objects.aget(generation=generation)
    communicator = await connect(user)
    await communicator.send_json_to({"action": "continue", "message": message.id, "settings": {}})
    reply = await receive(communicator)
    assert reply["type"] == "error" and "reached the max tokens" in reply["message"], reply
    assert await Generation.objects.acount() == 1 and (await Message.objects.aget(id=message.id)).earlier_text == ""
    await communicator.disconnect()


def test_a_version_is_not_switched_while_an_answer_is_written(demo_pair, user):
    conversation = Conversation.objects.create(user=user, pair=demo_pair, title="def f():")
    asked = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="def f():")
    old = Message.objects.create(conversation=conversation, parent=asked, role=Message.Role.ASSISTANT, shown=False,
                                 generation=Generation.objects.create(pair=demo_pair, user=user, prompt="def f():",
                                                                      status=Generation.Status.FINISHED, text="pass"))
    Message.objects.create(conversation=conversation, parent=asked, role=Message.Role.ASSISTANT,
                           generation=running_generation(pair=demo_pair, user=user))
    response = logged_in(user).post(f"/m/{old.id}/show/", "{}", content_type="application/json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "answer_in_progress"
    old.refresh_from_db()
    assert not old.shown


SHOTS = Path("/tmp/shots-versions")


def wait_for_answers(page, count: int) -> None:
    page.wait_for_function(f"""() => document.querySelectorAll('article.assistant').length === {count}
        && !document.querySelector('article.assistant.streaming')""")


def versions_of(article) -> str:
    return article.locator(".versions span").inner_text()


def open_chat(page, live_server_url: str, *, max_tokens: int) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    page.fill("#max-tokens", str(max_tokens))


def send(page, text: str, answers: int) -> None:
    page.fill("#prompt", text)
    page.click("#send")
    wait_for_answers(page, answers)


def screenshots(page, name: str) -> None:
    """At 1280 and 390 px, each after a reload (the page as it opens at that width)."""
    for width, height in ((1280, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.reload()
        page.wait_for_selector("body[data-connected='1']")
        page.screenshot(path=str(SHOTS / f"{name}-{width}.png"))
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scroll


def test_continue_and_regenerate_keep_every_version_reachable(demo_pair, user, live_server_url, page):
    open_chat(page, live_server_url, max_tokens=8)
    send(page, PROMPT, 1)
    answer = page.locator("article.assistant")
    meta = answer.locator(".meta").inner_text()  # in plain words, without hovering
    assert "reached the max tokens" in meta and "first token " in meta
    assert "guesses kept" in meta and "fewer main-model steps" not in meta
    answer.locator(".meta summary").click()
    assert "The main model ran" in answer.locator(".meta details").inner_text()
    cut = answer.locator(".body").inner_text()

    answer.locator("button.continue").click()  # written further, as the same answer
    page.wait_for_function("() => document.querySelector('article.assistant .body').innerText.length > "
                           f"{len(cut)} && !document.querySelector('article.assistant.streaming')")
    assert answer.count() == 1 and answer.locator(".body").inner_text().startswith(cut)
    continued = answer.locator(".body").inner_text()
    parts = in_thread(lambda: list(Generation.objects.filter(source="chat").order_by("created_at")))
    assert parts[0].finish_reason == "length" and parts[1].prompt.endswith(parts[0].text)

    page.fill("#max-tokens", "3")
    answer.locator("button.regenerate").click()
    page.wait_for_selector("article.assistant:not(.streaming) .versions")
    assert versions_of(answer) == "2/2" and answer.locator(".body").inner_text() != continued
    screenshots(page, "regenerated")
    answer.get_by_role("button", name="Previous version").click()
    page.wait_for_function("() => document.querySelector('article.assistant .versions span').textContent === '1/2'")
    assert answer.locator(".body").inner_text() == continued  # the old answer, kept whole
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Next version"  # focus kept
    page.reload()  # the version picked is the server's: a reload shows it too
    wait_for_answers(page, 1)
    assert versions_of(answer) == "1/2" and answer.locator(".body").inner_text() == continued

    send(page, "class Stack:", 2)
    prompt = in_thread(lambda: Generation.objects.filter(source="chat").order_by("created_at").last().prompt)
    assert in_thread(lambda: Message.objects.get(generation=parts[1]).text) in prompt  # the version shown


def test_editing_an_earlier_message_branches_through_the_page(demo_pair, user, live_server_url, page):
    open_chat(page, live_server_url, max_tokens=6)
    send(page, PROMPT, 1)
    send(page, "class Stack:", 2)
    page.locator("article.user").first.locator("button.edit").click()  # an earlier message: a branch
    page.fill("#edit-text", "def merge(a, b):")
    page.click("button.save-edit")
    wait_for_answers(page, 1)
    first = page.locator("article.user").first
    assert first.locator(".body").inner_text() == "def merge(a, b):" and versions_of(first) == "2/2"
    assert page.locator("article.user").count() == 1
    markdown = page.request.get(f"{page.url}export.md").text()
    assert "def merge(a, b):" in markdown and "class Stack:" not in markdown
    screenshots(page, "branch")

    first.get_by_role("button", name="Previous version").click()  # the old branch, as it was left
    page.wait_for_function("() => document.querySelectorAll('article.user').length === 2")
    assert page.locator("article.user .body").all_inner_texts() == [PROMPT, "class Stack:"]
    exported = json.loads(page.request.get(f"{page.url}export.json").text())
    assert [m["content"] for m in exported["messages"]][::2] == [PROMPT, "class Stack:"]
    screenshots(page, "old-branch")
    assert page.locator("article.user").count() == 2 and versions_of(page.locator("article.user").first) == "1/2"


def test_conversations_kept_before_versions_become_one_shown_path(demo_pair, user):
    """Migration 0004 on messages as 0003 kept them: each follows the one before it, all shown."""
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("chat")
    executor.migrate([("chat", "0003_message_left_out")])
    try:
        old = executor.loader.project_state([("chat", "0003_message_left_out")]).apps
        conversation = old.get_model("chat", "Conversation").objects.create(user_id=user.id, title="kept")
        kept = [old.get_model("chat", "Message").objects.create(conversation_id=conversation.id, role=role,
                                                                 content=role)
                for role in ("user", "assistant", "user", "assistant")]
    finally:  # the later tests need the schema as it is
        MigrationExecutor(connection).migrate(latest)
    messages = list(Message.objects.filter(conversation_id=conversation.id))
    assert [m.parent_id for m in messages] == [None, *(m.id for m in kept[:-1])]
    assert all(m.shown for m in messages)
    assert [m["versions"] for m in selectors.shown_path_json(conversation=Conversation.objects.get())] == [
        [m.id] for m in kept]
