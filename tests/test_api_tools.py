"""Tools through the official client on the demo pair: an answer read for calls streams whole at its end,
and malformed tools are refused by name. Calls themselves, forced and chosen by the model, and their
round trip are tested on the real pair (tests/test_real_pair.py)."""

import pytest

from inference.models import Generation
from tests.api_client import client, post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]  # generation, not its record

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def ask(api, **body):
    return api.chat.completions.create(model="demo-code", messages=ASK, tools=[WEATHER, TIME], **body)


@pytest.mark.usefixtures("celery_worker")
def test_an_answer_read_for_calls_streams_whole_at_its_end(live_server_url, demo_pair, api_key):
    """The demo model never writes a call (its JSON wanders into whitespace: forced calls are tested on the
    real pair); its answer with tools is its plain text, streamed at its end as it is returned whole."""
    api = client(live_server_url, api_key.secret)
    whole = ask(api, max_tokens=24).choices[0]
    chunks = [chunk.choices[0] for chunk in ask(api, max_tokens=24, stream=True) if chunk.choices]
    assert whole.message.tool_calls is None and whole.finish_reason in ("stop", "length")
    assert "".join(chunk.delta.content or "" for chunk in chunks) == whole.message.content
    assert chunks[-1].finish_reason == whole.finish_reason


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{city"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_malformed_tools_are_refused_naming_the_field(live_server_url, demo_pair, api_key, fields, param):
    response = post(live_server_url, "/v1/chat/completions", api_key.secret,
                    {"model": "demo-code", "messages": ASK, **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert Generation.objects.count() == 0
