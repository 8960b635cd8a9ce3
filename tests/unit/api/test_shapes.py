"""The pure parts, with no service running: text assembly, speculation counts, request checks, pair
state from heartbeats, response shapes, errors and the metrics text format."""

from pathlib import Path

import openvino_genai as og
import pytest

from inference import errors, limits
from inference.api import openapi
from inference.api.shapes import Shape, error_body, usage
from inference.engines.speculation_stats import SpeculationStats
from inference.engines.text_assembler import TextAssembler
from inference.metrics import _order, _sample
from inference.models import ModelPair
from inference.selectors import pair_state
from inference.serving.web import parse_options

MAIN = Path(__file__).resolve().parents[2] / "inference" / "models" / "demo-code" / "main"


@pytest.fixture(scope="module")
def tokenizer():
    return og.Tokenizer(str(MAIN))


def test_text_assembly_never_cuts_a_multibyte_character(tokenizer):
    text = "naïve café → 日本語 ✓ done"
    ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=False).input_ids.data[0]]
    assert len(ids) > len(text.split())  # byte-level pieces: characters are split across tokens
    for step in (1, 2, 3):
        assembler = TextAssembler(tokenizer)
        pieces = []
        for start in range(0, len(ids), step):
            pieces += list(assembler.add(ids[start:start + step]))
        pieces.append(assembler.finish())
        assert all("\ufffd" not in piece for piece in pieces)
        assert "".join(pieces) == tokenizer.decode(ids) == text


def test_speculation_counts_at_the_token_cap():
    stats = SpeculationStats(num_assistant_tokens=4, speculative=True, max_new_tokens=8)
    for n_tokens, at in ((1, 1.0), (5, 2.0), (2, 3.0)):  # prefill, 4 accepted + 1, then the cap leaves 2
        stats.add_step(n_tokens, at)
    summary = stats.summary(started_at=0.0, ended_at=3.0)
    assert summary.completion_tokens == 8 and summary.main_steps == 3
    assert summary.draft_tokens == 4 + 1  # with 2 tokens left the draft proposes 1: the main adds its own
    assert summary.accepted_tokens == 5 and summary.acceptance_rate == 1.0
    assert summary.accepted_by_position == [2, 1, 1, 1]
    assert summary.draft_steps == 2


def test_drafts_count_only_the_steps_that_verified_one_after_a_handover():
    """The Prometheus count of drafts: an answer the main alone began, then handed to the pair."""
    stats = SpeculationStats(num_assistant_tokens=None, speculative=False, max_new_tokens=64)
    for at in range(1, 6):  # a prefill and four plain steps
        stats.add_step(1, float(at))
    stats.hand_over(num_assistant_tokens=3, speculative=True)
    for n_tokens, at in ((1, 6.0), (4, 7.0), (2, 8.0)):  # a prefill again, then two verifying steps
        stats.add_step(n_tokens, at)
    summary = stats.summary(started_at=0.0, ended_at=8.0)
    assert summary.main_steps == 8 and summary.draft_steps == 2 and summary.accepted_tokens == 4


@pytest.mark.parametrize(("body", "param"), [
    ({"temperature": "hot"}, "temperature"), ({"max_tokens": 1.5}, "max_tokens"), ({"speculative": 1}, "speculative"),
    ({"stop": [1]}, "stop"), ({"stop": ["a"] * 5}, "stop"), ({"seed": True}, "seed"),
])
def test_request_checks_name_the_field(body, param):
    with pytest.raises(errors.InvalidType) as caught:
        parse_options(body)
    assert caught.value.param == param and caught.value.status == 400 and caught.value.code == "invalid_type"


def test_pair_state_from_heartbeats():
    pair = ModelPair(slug="p", main_dir="m", enabled=True)
    beat = {"name": "w1", "queues": ["pair.p"], "pairs": {}}
    assert pair_state(pair=pair, workers=[]).state == limits.ServingState.UNAVAILABLE
    assert pair_state(pair=pair, workers=[beat]).state == limits.ServingState.LOADING
    available = {**beat, "name": "w2", "pairs": {"p": {"state": "available", "error": ""}}}
    assert pair_state(pair=pair, workers=[beat, available]).state == limits.ServingState.AVAILABLE
    failed = {**beat, "pairs": {"p": {"state": "failed", "error": "no file"}}}
    state = pair_state(pair=pair, workers=[failed])
    assert state.state == limits.ServingState.UNAVAILABLE and not state.served
    assert "no file" in state.detail and "no file" not in state.error  # the worker's words are the admin's only
    pair.enabled = False
    assert "disabled" in pair_state(pair=pair, workers=[available]).error


def test_response_shapes_for_chat_and_text():
    done = {"type": "done", "finish_reason": "stopped", "prompt_tokens": 3, "completion_tokens": 4,
            "speculative_mode": "draft", "speculative_k": 3}
    chat = Shape(chat=True, model="p", generation_id="g", created=1)
    start, delta = chat.payloads({"type": "start"}, include_usage=True)[0], chat.payloads(
        {"type": "delta", "steps": [["ab", "c"], ["", "d"]]}, include_usage=False)[0]
    assert start["choices"][0]["delta"]["role"] == "assistant" and start["usage"] is None
    assert delta["choices"][0]["delta"]["content"] == "abcd" and delta["object"] == "chat.completion.chunk"
    final, with_usage, end = chat.payloads(done, include_usage=True)
    assert final["choices"][0]["finish_reason"] == "abort" and end == "[DONE]"
    assert with_usage["usage"]["total_tokens"] == 7 and with_usage["usage"]["speculative_k"] == 3
    text = Shape(chat=False, model="p", generation_id="g", created=1)
    assert text.payloads({"type": "start"}, include_usage=False) == []
    assert text.payloads(done, include_usage=False)[-1] == "[DONE]" and text.id == "cmpl-g"
    error = text.payloads({"type": "error", "message": "boom"}, include_usage=False)[0]
    assert error["error"]["code"] == "generation_failed" and "boom" in error["error"]["message"]
    assert usage({"prompt_tokens": 1, "completion_tokens": 2})["total_tokens"] == 3


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


def test_the_openapi_document_takes_its_limits_from_one_place():
    text = str(openapi.document(models=["p"], max_tokens=512))
    assert f"'maximum': {limits.K_MAX}" in text and f"'maximum': {limits.MAX_SEED}" in text


def test_metrics_text_format_orders_buckets():
    bucket = _sample("vllm:ttft_seconds_bucket", {"model_name": "p", "le": "0.5"})
    assert bucket == 'vllm:ttft_seconds_bucket{model_name="p",le="0.5"}'
    later = _sample("vllm:ttft_seconds_bucket", {"model_name": "p", "le": "2.5"})
    names = ("vllm:ttft_seconds_bucket",)
    assert sorted([later, bucket], key=lambda s: _order(s, names)) == [bucket, later]
