"""A request's options checked before anything is queued."""

import pytest

from inference import errors
from inference.serving.web import parse_options


@pytest.mark.parametrize(("body", "param"), [
    ({"temperature": "hot"}, "temperature"), ({"max_tokens": 1.5}, "max_tokens"), ({"speculative": 1}, "speculative"),
    ({"stop": [1]}, "stop"), ({"stop": ["a"] * 5}, "stop"), ({"seed": True}, "seed"),
])
def test_request_checks_name_the_field(body, param):
    with pytest.raises(errors.InvalidType) as caught:
        parse_options(body)
    assert caught.value.param == param and caught.value.status == 400 and caught.value.code == "invalid_type"
