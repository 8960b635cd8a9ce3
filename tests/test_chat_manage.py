"""Conversation management over its JSON endpoints: only the owner's conversations, clear errors
for bad input, the system prompt in the model's prompt, exports that keep the text verbatim."""

import json
from datetime import timedelta

import pytest
from django.test import Client

from chatsite.chat import selectors, services
from chatsite.chat.models import Conversation, Message
from inference.models import Generation
from tests.conftest import wait_until_done
from tests.test_site_security import finished_generation, running_generation

pytestmark = pytest.mark.django_db(transaction=True)


def post(client: Client, url: str, body: dict):
    return client.post(url, json.dumps(body), content_type="application/json")


@pytest.fixture
def alice(client, user):
    client.force_login(user)
    return client


def test_another_users_conversation_is_not_found(demo_pair, user, other_user):
    conversation = finished_generation(pair=demo_pair, user=user).message.conversation
    bob = Client()
    bob.force_login(other_user)
    question = conversation.messages.first()
    for url, body in ((f"/c/{conversation.id}/rename/", {"title": "mine"}),
                      (f"/c/{conversation.id}/system/", {"system_prompt": "x"}), (f"/c/{conversation.id}/delete/", {}),
                      (f"/m/{question.id}/edit/", {"text": "def g():"}), (f"/m/{question.id}/show/", {})):
        response = post(bob, url, body)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found", url
    for fmt in ("md", "json"):
        assert bob.get(f"/c/{conversation.id}/export.{fmt}").status_code == 404
    conversation.refresh_from_db()
    assert conversation.title == "def f():" and conversation.messages.count() == 2


@pytest.mark.parametrize("body, param, words", [
    ({"title": "   "}, "title", "needs a title"),
    ({"title": "x" * 201}, "title", "at most 200"),
    ({"title": 5}, "title", "must be a string"),
    ({"title": "\u200b"}, "title", "invisible"),  # a zero-width space: a title nobody sees
    ({"title": "\u202egnp.exe"}, "title", "invisible"),  # a right-to-left override: shown as "exe.png"
])
def test_rename_refuses_bad_titles(alice, demo_pair, user, body, param, words):
    conversation = finished_generation(pair=demo_pair, user=user).message.conversation
    response = post(alice, f"/c/{conversation.id}/rename/", body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and words in error["message"], error
    assert Conversation.objects.get().title == "def f():"


def test_renaming_a_conversation_keeps_its_place_in_the_list(alice, demo_pair, user):
    older = finished_generation(pair=demo_pair, user=user).message.conversation
    newer = finished_generation(pair=demo_pair, user=user).message.conversation
    assert [c.id for c in Conversation.objects.filter(user=user)] == [newer.id, older.id]
    assert post(alice, f"/c/{older.id}/rename/", {"title": "Renamed"}).status_code == 200
    assert [(c.id, c.title) for c in Conversation.objects.filter(user=user)] == [
        (newer.id, newer.title), (older.id, "Renamed")]


def test_a_get_or_a_body_that_is_not_json_is_refused(alice, demo_pair, user):
    conversation = finished_generation(pair=demo_pair, user=user).message.conversation
    assert alice.get(f"/c/{conversation.id}/rename/").status_code == 405
    response = alice.post(f"/c/{conversation.id}/rename/", "not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_editing_while_the_answer_is_written_is_refused(alice, demo_pair, user):
    generation = running_generation(pair=demo_pair, user=user)
    conversation = Conversation.objects.create(user=user, pair=demo_pair, title="def f():")
    asked = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="def f():")
    Message.objects.create(conversation=conversation, parent=asked, role=Message.Role.ASSISTANT,
                           generation=generation)
    response = post(alice, f"/m/{asked.id}/edit/", {"text": "def g():"})
    assert response.status_code == 409 and response.json()["error"]["code"] == "answer_in_progress"
    assert "or stop it" in response.json()["error"]["message"]
    assert conversation.messages.first().content == "def f():" and conversation.messages.count() == 2


def test_the_system_prompt_comes_first_in_the_history(alice, demo_pair, user):
    conversation = finished_generation(pair=demo_pair, user=user).message.conversation
    assert post(alice, f"/c/{conversation.id}/system/", {"system_prompt": "  Be brief.  "}).json() == {
        "system_prompt": "Be brief."}
    history = selectors.history(conversation=Conversation.objects.get())
    assert history[0] == {"role": "system", "content": "Be brief."} and history[1]["role"] == "user"


def test_exports_keep_the_text_verbatim(alice, demo_pair, user):
    conversation = finished_generation(pair=demo_pair, user=user, text="    return 1\n```\nnot code").message.conversation
    Message.objects.filter(role="user").update(content="def f():\n```python\nx = 1\n```")
    markdown = alice.get(f"/c/{conversation.id}/export.md").content.decode()
    # The user's own fence inside is longer-fenced, so it cannot close the quote early.
    assert "## You\n\n````\ndef f():\n```python\nx = 1\n```\n````\n" in markdown
    assert "## Answer\n\n    return 1\n```\nnot code\n" in markdown
    exported = json.loads(alice.get(f"/c/{conversation.id}/export.json").content)
    assert exported["messages"][1]["content"] == "    return 1\n```\nnot code"
    assert exported["messages"][1]["answer"]["status"] == "finished"


@pytest.mark.usefixtures("celery_worker")
def test_an_answer_started_over_http_with_no_page_watching_is_stopped_like_an_abandoned_one(alice, demo_pair, user,
                                                                                              settings):
    """An edit sent with no chat page open: nobody follows its answer, which is stopped after the grace period a
    closed page's answers get, not left to run to its cap."""
    demo_pair.max_new_tokens_cap = 4096  # as long as the context allows: well past the grace period here
    demo_pair.save()
    question = finished_generation(pair=demo_pair, user=user).message.conversation.messages.first()
    # Sampled: the demo main's greedy answer would soon repeat itself, and be stopped for that instead.
    started = post(alice, f"/m/{question.id}/edit/", {"text": "def g(x):", "settings": {"ignore_eos": True,
                                                                                        "temperature": 1.0}})
    assert started.status_code == 200, started.content
    generation = wait_until_done(started.json()["generation"], timeout=settings.CHAT_ABANDON_GRACE_S + 60)
    assert generation.status == Generation.Status.STOPPED and generation.finish_reason == "stopped", generation.error
    assert generation.finished_at - generation.started_at < timedelta(seconds=settings.CHAT_ABANDON_GRACE_S + 15)


@pytest.mark.parametrize(("first_message", "title"), [
    ("```python\ndef slow(values):\n    return sorted(values)[0]\n```\nWhy is this slow?", "Why is this slow?"),
    ("```python\ndef slow(values):\n    return sorted(values)[0]\n```\nAdd type hints.", "Add type hints."),
    ("```python\ndef slow(values):\n```", "def slow(values):"),  # code alone: its first line
    ("\u202egnp.exe \u200bplease", "gnp.exe please"),  # what a rename would refuse is dropped
])
@pytest.mark.no_database
def test_a_new_chat_is_titled_by_its_question_not_its_paste(first_message, title):
    """Two chats on one pasted file differ by their questions, not share the paste's first line."""
    assert services.first_message_title(first_message) == title
