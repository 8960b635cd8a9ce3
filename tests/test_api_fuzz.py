"""Schemathesis (from PyPI) fuzzes the live API from its own OpenAPI document: valid requests and
invalid ones, every operation; no answer may be a 5xx. Bounded: a few dozen examples per operation,
and the pair's cap keeps each generation short."""

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]
EXAMPLES = 25


def test_fuzzing_the_openapi_document_finds_no_server_error(live_server_url, demo_pair, api_key):
    demo_pair.max_new_tokens_cap = 8
    demo_pair.save()
    api_key.max_concurrent = 50
    api_key.save()
    schema = schemathesis.openapi.from_url(f"{live_server_url}/v1/openapi.json")
    headers = {"Authorization": f"Bearer {api_key.secret}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {"POST /v1/completions", "POST /v1/chat/completions"} <= {op.label for op in operations}

    for operation in operations:
        takes_input = {"parameters", "requestBody"} & set(operation.definition.raw)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if takes_input else (GenerationMode.POSITIVE,):

            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def no_server_error(case):
                response = case.call(base_url=live_server_url, headers=headers, timeout=120)
                case.validate_response(response, checks=[not_a_server_error])

            no_server_error()
