"""The API's response shapes, from a generation's events, with no service running."""

from inference.api.shapes import Shape, usage


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
