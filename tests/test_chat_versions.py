"""Versions of a conversation, over the websocket and the chat's JSON endpoints on the real stack: a regenerated
answer and an edited message keep the old version reachable, the next prompt reads only the version shown
(the one picked last, kept on the server), exports follow it, and Continue extends an answer cut at its max
tokens."""

import json

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from chatsite.chat.models import Conversation, Message
from inference.models import Generation
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
