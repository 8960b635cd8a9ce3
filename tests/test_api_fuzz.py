"""Schemathesis (from PyPI) fuzzes the live API from its own OpenAPI document: valid requests and
invalid ones, every operation; no answer may be a 5xx. Then the same requests carry hostile values
(huge numbers, deep nesting, long strings) at any place in their bodies and in Last-Event-ID. Bounded: a few
dozen examples per operation, and the pair's cap keeps each generation short."""

from datetime import timedelta

import pytest
import schemathesis
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from inference.models import Generation
from tests.api_client import PROMPT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]
EXAMPLES = 25
HOSTILE_EXAMPLES = 150  # most are refused at once: each value meets each field


def fuzzing_settings(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


@pytest.fixture
def api_operations(live_server_url, demo_pair, api_key):
    """The document's operations, with a short cap on the pair and room for many requests on the key."""
    demo_pair.max_new_tokens_cap = 8
    demo_pair.save()
    api_key.max_concurrent = 50
    api_key.save()
    schema = schemathesis.openapi.from_url(f"{live_server_url}/v1/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {"POST /v1/completions", "POST /v1/chat/completions"} <= {op.label for op in operations}
    return operations


def test_fuzzing_the_openapi_document_finds_no_server_error(live_server_url, api_key, api_operations):
    headers = {"Authorization": f"Bearer {api_key.secret}"}
    for operation in api_operations:
        takes_input = {"parameters", "requestBody"} & set(operation.definition.raw)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if takes_input else (GenerationMode.POSITIVE,):

            @fuzzing_settings(EXAMPLES)
            @given(case=operation.as_strategy(generation_mode=mode))
            def no_server_error(case):
                response = case.call(base_url=live_server_url, headers=headers, timeout=120)
                case.validate_response(response, checks=[not_a_server_error])

            no_server_error()


def nested(depth: int, *, keyed: bool) -> dict | list:
    value: dict | list = []
    for _ in range(depth):
        value = {"a": value} if keyed else [value]
    return value


# What careless or hostile clients send: numbers no float or int64 holds, nesting deeper than any field
# needs (and, as text, deeper than Python's parser goes), long strings, NUL, ill-shaped schemas and choices.
# (A lone surrogate too, but schemathesis cannot check a case holding one: test_api_input sends it raw.)
HOSTILE = [10**400, -(10**400), 2**64, -(2**63) - 1, 1e308, -1e308, 5e-324, "9" * 5000, "x" * 200_000,
           "\x00", "", nested(200, keyed=False), nested(200, keyed=True), nested(40, keyed=True),
           '{"a": ' * 5000 + "1" + "}" * 5000, {"type": 12}, {"type": "function", "function": "f"},
           {"properties": {"a": 1}}, [], {}, True]


def places(value, path: tuple = ()):
    """The path to every value inside `value` (itself included)."""
    yield path
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from places(child, (*path, key))


def replaced(value, path: tuple, new):
    """`value` with `new` at `path` (whose last key may be a member `value` does not have yet)."""
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = replaced(copy[head], tuple(rest), new) if rest else new
    return copy


def test_hostile_values_anywhere_in_a_request_find_no_server_error(live_server_url, demo_pair, api_key,
                                                                     api_operations):
    """Valid requests from the document, each with one hostile value put at a place it has (or a top-level
    field it may add); on the resume routes, an owned answer resumed after a hostile Last-Event-ID."""
    answers = {chat: Generation.objects.create(pair=demo_pair, api_key=api_key, source=Generation.Source.API,
                                               prompt=PROMPT, status=Generation.Status.FINISHED,
                                               finished_at=timezone.now() - timedelta(hours=1))
               for chat in (False, True)}
    for operation in api_operations:
        if operation.label.endswith("/events"):
            owned = {"generation_id": str(answers["/chat/" in operation.label].id)}
            hostile_requests(operation, base_url=live_server_url, key=api_key.secret, answer=owned)
        elif list(operation.body):
            hostile_requests(operation, base_url=live_server_url, key=api_key.secret)


def hostile_requests(operation, *, base_url: str, key: str, answer: dict | None = None) -> None:
    """`operation`'s valid requests with one hostile value each: in the body, or (`answer`: the path to an
    answer the key owns) in Last-Event-ID. No answer may be a 5xx."""
    fields = sorted(field for body in operation.body for field in body.definition["schema"].get("properties", {}))

    @fuzzing_settings(HOSTILE_EXAMPLES)
    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE), data=st.data(),
           value=st.sampled_from(HOSTILE))
    def no_server_error(case, data, value):
        if answer is not None:
            case.path_parameters = answer
            case.headers = {**(case.headers or {}), "Last-Event-ID": str(value)[:8000]}
        else:
            added = [(name,) for name in fields if name not in case.body]
            path = data.draw(st.sampled_from([*places(case.body)][1:] + added), label="place")
            case.body = replaced(case.body, path, value)
        response = case.call(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        case.validate_response(response, checks=[not_a_server_error])

    no_server_error()
