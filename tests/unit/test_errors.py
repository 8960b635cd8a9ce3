"""Each error carries its HTTP status and code into the API's error body."""

import pytest

from inference import errors
from inference.api.shapes import error_body


@pytest.mark.parametrize(("error", "status", "code"), [
    (errors.InvalidValue, 400, "invalid_value"), (errors.InvalidKey, 401, "invalid_api_key"),
    (errors.ModelNotFound, 404, "model_not_found"), (errors.ConcurrencyLimit, 429, "concurrency_limit_exceeded"),
    (errors.ModelUnavailable, 503, "model_unavailable"), (errors.InternalError, 500, "internal_error"),
])
def test_errors_carry_their_status_and_code(error, status, code):
    body = error_body(error("what went wrong", param="field"))["error"]
    assert (error.status, body["code"], body["param"], body["message"]) == (status, code, "field", "what went wrong")
    assert body["type"] == ("server_error" if status >= 500 else "rate_limit_error" if status == 429 else
                            "authentication_error" if status == 401 else "invalid_request_error")
