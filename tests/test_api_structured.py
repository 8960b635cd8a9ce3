"""Answers held to a format (response_format, `regex`, `grammar`) through the official client on the demo
pair: the format holds, the draft changes no greedy token, a grammar the library or the own engine cannot
compile is refused with nothing recorded (it would fail every request in its batch), and a sampled answer
under a grammar never reaches an inexact path."""

import re

import openai
import pytest

from inference.models import Generation
from tests.test_api import PROMPT, client, post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]  # generation, not its record

CODE = r"[a-z]{2,10}-[0-9]{1,3}"
PROMPTS = [PROMPT, "class Stack:", "import os\n", "# read a file\n"]
SCHEMA = {"type": "object", "properties": {"lang": {"enum": ["python", "rust", "go"]},
                                           "lines": {"type": "integer", "minimum": 1, "maximum": 99}},
          "required": ["lang", "lines"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "snippet", "schema": SCHEMA, "strict": True}}


def complete(api: openai.OpenAI, prompt: str, **body):
    speculative = body.pop("speculative", True)
    return api.completions.create(model="demo-code", prompt=prompt, max_tokens=24,
                                  extra_body={"speculative": speculative, **body.pop("extra_body", {})}, **body)


@pytest.mark.usefixtures("celery_worker")
def test_a_regex_holds_every_answer_and_the_draft_changes_no_token(live_server_url, demo_pair, api_key):
    """Under a grammar a request speculates only when it names its K (measured slower otherwise)."""
    api = client(live_server_url, api_key.secret)
    for prompt in PROMPTS:
        drafted, alone = (complete(api, prompt, extra_body={"regex": CODE, **k}, speculative=bool(k))
                          for k in ({"num_assistant_tokens": 3}, {}))
        text = drafted.choices[0].text
        assert re.fullmatch(CODE, text), text
        assert text == alone.choices[0].text
        assert drafted.choices[0].finish_reason == "stop"  # the grammar allowed nothing more
        assert drafted.usage.model_dump()["speculative_mode"] == "draft"
    left_to_the_pair = complete(api, PROMPT, extra_body={"regex": CODE}).usage.model_dump()
    assert left_to_the_pair["speculative_mode"] == "off" and "grammar" in left_to_the_pair["speculative_reason"]


@pytest.mark.usefixtures("celery_worker")
def test_a_json_schema_streams_the_same_answer_as_without_the_draft(live_server_url, demo_pair, api_key):
    """The demo pair's answers are nonsense, so they may run out of tokens inside the object; the schema holds
    what was written (its opening and its keys' order), and streamed or not, with the draft or without, the
    answer is the same."""
    api = client(live_server_url, api_key.secret)
    messages = [{"role": "user", "content": "Describe a snippet as JSON."}]
    asked = {"model": "demo-code", "messages": messages, "max_tokens": 40, "response_format": JSON_SCHEMA}
    drafted = {**asked, "extra_body": {"num_assistant_tokens": 3}}
    whole = api.chat.completions.create(**drafted)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       api.chat.completions.create(**drafted, stream=True) if chunk.choices)
    alone = api.chat.completions.create(**asked, extra_body={"speculative": False})
    text = whole.choices[0].message.content
    assert text == streamed == alone.choices[0].message.content
    assert re.match(r'\s*\{\s*"lang"\s*:\s*"(python|rust|go)"', text), text
    assert whole.usage.model_dump()["speculative_mode"] == "draft"


@pytest.mark.usefixtures("celery_worker")
def test_a_sampled_answer_under_a_grammar_speculates_on_the_exact_engine(live_server_url, demo_pair, api_key):
    """The library's speculative sampling is not exact: a sampled answer under a grammar runs on the exact
    engine, which holds the draft and the main to it (tests/test_sampling_distribution.py checks the distribution)."""
    api = client(live_server_url, api_key.secret)
    for seed in range(4):
        answer = complete(api, PROMPT, temperature=0.9, seed=seed, extra_body={"regex": CODE})
        assert re.fullmatch(CODE, answer.choices[0].text), answer.choices[0].text
        assert answer.usage.model_dump()["speculative_mode"] == "draft-exact-sampling"


BAD_FORMATS = [
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectt"}}}},
     "response_format.json_schema.schema"),
    ({"regex": "[a-z"}, "regex"),
    ({"regex": "(?=a)b"}, "regex"),  # valid in Python, not in the library's dialect
    ({"regex": 5}, "regex"),
    ({"grammar": 'root ::= item\nitem ::= "a" | missing'}, "grammar"),
    ({"regex": "a+", "response_format": {"type": "json_object"}}, "regex"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_FORMATS)
def test_a_format_the_library_cannot_hold_is_refused_naming_the_field(live_server_url, demo_pair, api_key,
                                                                       fields, param):
    response = post(live_server_url, "/v1/completions", api_key.secret,
                    {"model": "demo-code", "prompt": PROMPT, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]
    assert Generation.objects.count() == 0
