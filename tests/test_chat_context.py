"""A chat conversation against the model's context (issue 38): one that has outgrown it leaves out its
oldest turns, says so on the answer, and goes on; a message, or a system prompt, too long on its own is
refused in plain words with nothing saved. Through the chat socket and the page's JSON views, on the demo
pair (a context of 1,024 tokens), with a real Celery worker where an answer is written."""

import json

import pytest
from asgiref.sync import sync_to_async

from chatsite.chat.models import Conversation, Message
from inference import limits
from inference.models import Generation
from inference.serving import web
from tests.conftest import chat_socket, in_thread, log_in

pytestmark = [pytest.mark.django_db(transaction=True)]
NEWEST = "def newest_question(values):"
SYSTEM_PROMPT = "Python only."


def long_conversation(*, pair, user, turns: int, system_prompt: str = SYSTEM_PROMPT) -> Conversation:
    """`turns` questions of about 150 tokens each, with their answers, as earlier sends left them."""
    conversation = Conversation.objects.create(user=user, pair=pair, title="Long", system_prompt=system_prompt)
    answered = None
    for turn in range(turns):
        question = Message.objects.create(conversation=conversation, role=Message.Role.USER, parent=answered,
                                          content=f"turn_{turn} = 1\n" * 25)
        answer = Generation.objects.create(pair=pair, user=user, prompt="", status=Generation.Status.FINISHED,
                                           text=f"    return {turn}\n", finish_reason="stop")
        answered = Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT, parent=question,
                                          generation=answer)
    return conversation


async def connect(user):
    communicator = await chat_socket(user)
    assert (await communicator.connect())[0]
    return communicator


async def answer_of(communicator, started: dict) -> dict:
    """The terminal event of the answer `started` announced."""
    while True:
        message = await communicator.receive_json_from(timeout=60)
        if message["type"] == "event" and message["generation"] == started["generation"] \
                and message["event"]["type"] in ("done", "error"):
            return message["event"]


@pytest.mark.usefixtures("celery_worker")
async def test_a_conversation_longer_than_the_context_leaves_out_its_oldest_turns(demo_pair, user, client):
    conversation = await sync_to_async(long_conversation)(pair=demo_pair, user=user, turns=10)
    communicator = await connect(user)
    await communicator.send_json_to({"action": "send", "pair": "demo-code", "text": NEWEST,
                                     "conversation": conversation.id, "settings": {"max_tokens": 64}})
    started = await communicator.receive_json_from(timeout=60)
    assert started["type"] == "started", started
    left_out = started["messages_left_out"]
    assert 0 < left_out < 20 and left_out % 2 == 0, left_out  # whole turns: a question and its answer
    assert (await answer_of(communicator, started))["type"] == "done"

    generation = await Generation.objects.aget(id=started["generation"])
    first_kept = left_out // 2
    assert SYSTEM_PROMPT in generation.prompt and generation.prompt.rstrip().endswith(NEWEST)
    assert f"turn_{first_kept} =" in generation.prompt and f"turn_{first_kept - 1} =" not in generation.prompt
    assert generation.prompt_tokens + 64 <= web.main_context(pair=demo_pair)  # room for its max tokens
    answer = await Message.objects.aget(id=started["message"])
    assert answer.messages_left_out == left_out

    await communicator.send_json_to({"action": "regenerate", "message": started["message"],
                                     "settings": {"max_tokens": 64}})
    again = await communicator.receive_json_from(timeout=60)
    assert again["type"] == "started" and again["messages_left_out"] == left_out, again
    assert (await answer_of(communicator, again))["type"] == "done"
    await communicator.disconnect()

    await sync_to_async(client.force_login)(user)
    page = (await sync_to_async(client.get)(f"/c/{conversation.id}/")).content.decode()
    data = json.loads(page.split('id="page-data" type="application/json">')[1].split("</script>")[0])
    assert data["messages"][-1]["messages_left_out"] == left_out  # what the page's note is written from


@pytest.mark.parametrize("system_prompt, text", [
    (SYSTEM_PROMPT, "x = 1\n" * 300),  # 1,200 tokens
    ("Answer in Python. " * 250, NEWEST),  # 4,500 characters, within the cap, over the model's context
])
async def test_a_message_too_long_for_the_context_on_its_own_is_refused_in_plain_words(demo_pair, user,
                                                                                       system_prompt, text):
    conversation = await sync_to_async(long_conversation)(pair=demo_pair, user=user, turns=3,
                                                          system_prompt=system_prompt)
    communicator = await connect(user)
    await communicator.send_json_to({"action": "send", "pair": "demo-code", "text": text,
                                     "conversation": conversation.id})
    reply = await communicator.receive_json_from(timeout=60)
    assert reply["type"] == "error" and reply["code"] == "context_length_exceeded" and reply["param"] == "prompt"
    assert "This message is too long for the model" in reply["message"] and "system prompt" in reply["message"]
    assert await Message.objects.acount() == 6 and await Generation.objects.acount() == 3  # nothing saved
    await communicator.disconnect()


def test_a_system_prompt_is_bounded(client, user):
    client.force_login(user)
    too_long = "x" * (limits.SYSTEM_PROMPT_MAX_CHARS + 1)

    def post(path: str, system_prompt: str):
        return client.post(path, json.dumps({"system_prompt": system_prompt}), content_type="application/json")

    refused = post("/c/new/", too_long)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "system_prompt"
    assert f"at most {limits.SYSTEM_PROMPT_MAX_CHARS:,} characters" in refused.json()["error"]["message"]
    assert not Conversation.objects.exists()
    conversation_id = post("/c/new/", "Be brief.").json()["conversation"]
    assert post(f"/c/{conversation_id}/system/", too_long).status_code == 400
    assert Conversation.objects.get(id=conversation_id).system_prompt == "Be brief."
    at_the_cap = "x" * limits.SYSTEM_PROMPT_MAX_CHARS
    assert post(f"/c/{conversation_id}/system/", at_the_cap).json() == {"system_prompt": at_the_cap}


@pytest.mark.usefixtures("celery_worker")
def test_the_page_says_on_the_answer_that_older_messages_were_left_out(demo_pair, user, live_server_url, page):
    conversation = in_thread(lambda: long_conversation(pair=demo_pair, user=user, turns=10))
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{conversation.id}/")
    page.wait_for_selector("body[data-connected='1']")
    assert page.locator("article .left-out").count() == 0  # the kept answers read everything before them
    page.fill("#max-tokens", "64")
    page.fill("#prompt", NEWEST)
    page.click("#send")
    page.wait_for_function("""() => document.querySelectorAll('article.assistant').length === 11
                                   && document.querySelector('article.assistant:last-child:not(.streaming) .actions')""")
    left_out = in_thread(lambda: Message.objects.filter(role=Message.Role.ASSISTANT).last().messages_left_out)
    note = f"The {left_out} oldest messages were left out: the conversation is longer than the model can read."
    assert left_out > 0 and page.locator("article.assistant:last-child .left-out").inner_text() == note
    page.reload()  # said again on the kept answer, and only there
    page.wait_for_selector("article.assistant:last-child:not(.streaming) .actions")
    assert page.locator("article .left-out").all_inner_texts() == [note]
