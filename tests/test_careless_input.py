"""Careless and hostile input (issue 38): huge numbers, long ids, deep nesting, malformed tool choices,
long stop strings, tool schemas the library cannot compile. Sent as a user would (the live API, the chat
socket, the chat's own pages); each gets a 4xx or an error frame naming the field in plain words, never a
500 or `internal_error`, and nothing is recorded."""

import json

import pytest
from django.test import AsyncClient, override_settings

from inference.models import Generation
from tests.api_client import MESSAGES, PROMPT, post
from tests.test_chat_consumers import logged_in_socket

pytestmark = pytest.mark.django_db(transaction=True)
HUGE = 10**400  # an integer no float holds
DEEP = 5000  # deeper than Python's parser goes


def nested_object(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def completion(**fields) -> dict:
    return {"model": "demo-code", "prompt": PROMPT, **fields}


def chat(**fields) -> dict:
    return {"model": "demo-code", "messages": MESSAGES, **fields}


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALLED = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": nested_object(DEEP)}}]}]
LIBRARY_WORDS = ("Check failed", "picojson", "::", ".cc:", "is false")

BAD_BODIES = [
    # row 1: numbers too big for a float, and the other numeric fields at the same size
    ("/v1/completions", completion(temperature=HUGE), "temperature"),
    ("/v1/completions", completion(top_p=HUGE), "top_p"),
    ("/v1/completions", completion(assistant_confidence_threshold=HUGE), "assistant_confidence_threshold"),
    ("/v1/completions", completion(top_k=HUGE), "top_k"),
    ("/v1/completions", completion(seed=HUGE), "seed"),
    ("/v1/completions", completion(max_tokens=HUGE), "max_tokens"),
    ("/v1/completions", completion(num_assistant_tokens=HUGE), "num_assistant_tokens"),
    ("/v1/completions", completion(logprobs=HUGE), "logprobs"),
    ("/v1/chat/completions", chat(logprobs=True, top_logprobs=HUGE), "top_logprobs"),
    ("/v1/completions", json.dumps(completion())[:-1] + ', "temperature": 1e400}', "temperature"),  # a float: inf
    # a role that is an object (found by the fuzzer: it was looked up in a dict, 500)
    ("/v1/chat/completions", chat(messages=[{"role": {}, "content": "hi"}]), "messages[0].role"),
    ("/v1/chat/completions", chat(messages=[{"role": ["user"], "content": "hi"}]), "messages[0].role"),
    # row 3: a tool call's arguments nested 5,000 deep
    ("/v1/chat/completions", chat(messages=CALLED, tools=[WEATHER]), "messages[2].tool_calls[0].function.arguments"),
    # row 4: tool_choice's function given as a string
    ("/v1/chat/completions", chat(tools=[WEATHER], tool_choice={"type": "function", "function": "weather"}),
     "tool_choice"),
    # row 7: a 200,000-character stop string; a tool schema the library cannot compile, with no call forced
    ("/v1/completions", completion(stop="x" * 200_000), "stop"),
    ("/v1/completions", completion(stop=["\n", "y" * 257]), "stop"),
    ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}],
                                  tool_choice="auto"), "tools[0].function.parameters"),
    ("/v1/chat/completions", chat(tools=[WEATHER, {"type": "function", "function": {
        "name": "g", "parameters": {"properties": {"a": 1}}}}]), "tools[1].function.parameters"),
    # issue 56, row 8: a tool's answer with no call before it
    ("/v1/chat/completions", chat(messages=[*MESSAGES, {"role": "tool", "tool_call_id": "call_1", "content": "18"}]),
     "messages[2].role"),
    # row 8: a grammar the library cannot compile is refused in its own words, without its C++ internals
    ("/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": 1}}}}), "response_format.json_schema.schema"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD_BODIES)
def test_careless_fields_answer_400_naming_the_field(live_server_url, demo_pair, api_key, path, body, param):
    response = post(live_server_url, path, api_key.secret, body)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["message"] and not any(words in error["message"] for words in LIBRARY_WORDS), error
    assert len(error["message"]) < 400, error  # what was sent is not echoed whole
    assert Generation.objects.count() == 0


MALFORMED = [
    ("[" * DEEP + "]" * DEEP, "nests deeper"),  # deeper than Python's parser goes
    (json.dumps(completion())[:-1] + ', "x": ' + "[" * 100 + "]" * 100 + "}", "nests deeper"),  # parsed, too deep
    (json.dumps(chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": json.loads(
        nested_object(200))}})), "nests deeper"),
    (json.dumps(completion())[:-1] + ', "seed": ' + "9" * 5000 + "}", "5000 digits"),  # over Python's int() limit
]


@pytest.mark.parametrize(("raw", "words"), MALFORMED)
def test_deep_or_huge_json_answers_400_in_plain_words(live_server_url, demo_pair, api_key, raw, words):
    response = post(live_server_url, "/v1/chat/completions", api_key.secret, raw)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and words in error["message"], error
    assert "sys." not in error["message"] and "Recursion" not in error["message"], error
    assert Generation.objects.count() == 0


def test_a_5000_digit_last_event_id_answers_400(live_server_url, demo_pair, api_key):
    """Row 2: Python refuses int() of over 4,300 digits; the id is refused by its length first."""
    import requests

    generation = Generation.objects.create(pair=demo_pair, api_key=api_key, source=Generation.Source.API,
                                           prompt=PROMPT, status=Generation.Status.FINISHED)
    for last_event_id in ("1" * 5000, "1-" + "2" * 5000, "9" * 21):
        response = requests.get(f"{live_server_url}/v1/completions/{generation.id}/events", timeout=30,
                                headers={"Authorization": f"Bearer {api_key.secret}", "Last-Event-ID": last_event_id})
        assert response.status_code == 400, response.text[:500]
        assert response.json()["error"]["param"] == "Last-Event-ID"


async def test_a_lost_redis_is_told_without_its_address(demo_pair, api_key, caplog):
    """Row 8: a follower whose Redis does not answer is told so; where Redis runs goes to the log only."""
    generation = await Generation.objects.acreate(pair=demo_pair, api_key=api_key, source=Generation.Source.API,
                                                  prompt=PROMPT, status=Generation.Status.RUNNING)
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):  # a port nothing listens on
        response = await AsyncClient().get(f"/v1/completions/{generation.id}/events",
                                           headers={"Authorization": f"Bearer {api_key.secret}"})
        body = b"".join([chunk async for chunk in response.streaming_content]).decode()
    assert "Lost the connection to Redis" in body, body
    assert "127.0.0.1" not in body and "Connection refused" not in body, body
    assert "127.0.0.1:1" in caplog.text  # the operator finds where in the log


# ------------------------------------------------------------------ the chat socket and the chat's pages
SOCKET_INPUTS = [
    ({"action": "send", "pair": "demo-code", "text": PROMPT, "settings": {"temperature": HUGE}}, "temperature"),
    ({"action": "send", "pair": "demo-code", "text": PROMPT, "settings": {"top_p": HUGE}}, "top_p"),
    ({"action": "send", "pair": "demo-code", "text": PROMPT, "settings": {"assistant_confidence_threshold": HUGE}},
     "assistant_confidence_threshold"),
    ({"action": "send", "pair": "demo-code", "text": PROMPT, "settings": {"stop": "x" * 200_000}}, "stop"),
    ({"action": "send", "pair": "demo-code", "text": PROMPT, "conversation": HUGE}, "conversation"),
    ({"action": "regenerate", "message": HUGE}, "message"),
    ({"action": "follow", "generation": "00000000-0000-0000-0000-000000000000", "after": "1" * 5000}, "after"),
    ({"action": "follow", "generation": "00000000-0000-0000-0000-000000000000", "steps": HUGE}, "generation"),
]


@pytest.mark.parametrize(("frame", "param"), SOCKET_INPUTS)
async def test_careless_socket_frames_get_an_error_naming_the_field(demo_pair, user, frame, param):
    communicator, _ = await logged_in_socket(user)
    await communicator.send_to(text_data=json.dumps(frame))
    reply = await communicator.receive_json_from(timeout=30)
    assert reply["type"] == "error" and reply["code"] != "internal_error", reply
    assert reply["param"] == param, reply
    assert await Generation.objects.acount() == 0
    await communicator.disconnect()


@pytest.mark.parametrize(("raw", "param"), [
    ('{"action": "send", "pair": "demo-code", "text": "x", "settings": {"temperature": NaN}}', None),
    ('{"action": "send", "pair": "demo-code", "text": "x", "settings": {"top_p": Infinity}}', None),
    ('{"action": "send", "pair": "demo-code", "text": "x", "settings": {"temperature": 1e400}}', "temperature"),
    ('{"action": "send", "pair": "demo-code", "text": "x", "settings": {"seed": ' + "9" * 5000 + "}}", None),
])
async def test_numbers_json_has_not_get_an_error_frame(demo_pair, user, raw, param):
    communicator, _ = await logged_in_socket(user)
    await communicator.send_to(text_data=raw)
    reply = await communicator.receive_json_from(timeout=30)
    assert reply["type"] == "error" and reply["param"] == param, reply
    assert reply["code"] == ("invalid_json" if param is None else "invalid_value"), reply
    assert await Generation.objects.acount() == 0
    await communicator.disconnect()


def test_the_chat_pages_refuse_deep_json_in_plain_words(client, user):
    client.force_login(user)
    for raw in ("[" * DEEP + "]" * DEEP, '{"system_prompt": ' + nested_object(100) + "}"):
        response = client.post("/c/new/", raw, content_type="application/json")
        assert response.status_code == 400, response.content[:300]
        assert "nests deeper" in response.json()["error"]["message"]
