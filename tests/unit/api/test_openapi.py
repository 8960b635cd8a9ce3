"""The OpenAPI document the API publishes."""

from inference import limits
from inference.api import openapi


def test_the_openapi_document_takes_its_limits_from_one_place():
    text = str(openapi.document(models=["p"], max_tokens=512))
    assert f"'maximum': {limits.K_MAX}" in text and f"'maximum': {limits.MAX_SEED}" in text
