"""A tool-reading answer streamed as it is written (api/tools.py CallStream): the content before its calls
comes as it comes, whatever the cut of the steps; what is sent is always a prefix of the whole answer's
content, and nothing of a call leaks into it."""

import pytest

from inference.api.tools import CallStream, split_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWERS = [
    "Let me look that up.\n" + CALL,
    CALL,
    "\n" + CALL + "\n" + CALL.replace("Paris", "Lyon"),
    "No call here, just < and <tool and a plain answer.",
    "Before.\n<tool_call>\nnot json\n</tool_call>\nAfter.",  # not a call: it stays in the content
]


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("cut", [1, 2, 3, 7])
def test_streamed_content_is_the_whole_answers_and_no_call_leaks(answer, cut):
    stream = CallStream()
    sent = [stream.content(answer[start:start + cut]) for start in range(0, len(answer), cut)]
    content, calls = split_calls(answer, ids="x")
    streamed = "".join(sent)
    assert (content or "").startswith(streamed)
    assert streamed + stream.rest(content) == (content or "")
    assert "<tool_call>" not in streamed and not streamed.endswith("<")
    if answer.startswith("Let me"):
        assert streamed == "Let me look that up." and len([piece for piece in sent if piece]) > 1
    assert len(calls) == answer.count('"name"')


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_streamed_tool_reading_answer_carries_every_steps_logprobs_and_provenance_once(answer):
    """Each step's tokens' logprobs and its provenance go out with the content they let out, the rest with the
    answer's end: the stream's add up to the whole answer's, in order."""
    from inference.api.shapes import Shape

    shape = Shape(chat=True, model="p", generation_id="g", created=1, logprobs=True, tool_calls=True,
                  speculation_steps=True)
    pieces = [answer[start:start + 4] for start in range(0, len(answer), 4)]
    steps = [[piece[:2], piece[2:], [[piece, -0.5 * index]]] for index, piece in enumerate(pieces)]
    stream = CallStream()
    chunks = [payload for step in steps
              for payload in shape.payloads({"type": "delta", "steps": [step]}, include_usage=False, calls=stream)]
    done = {"type": "done", "text": answer, "finish_reason": "stop", "prompt_tokens": 1,
            "completion_tokens": len(steps)}
    chunks += [payload for payload in shape.payloads(done, include_usage=False, calls=stream) if payload != "[DONE]"]
    whole = shape.response(text=answer, finish_reason="stop", usage={}, steps=steps)["choices"][0]
    choices = [chunk["choices"][0] for chunk in chunks]
    assert [entry for choice in choices if choice["logprobs"] for entry in choice["logprobs"]["content"]] == \
        whole["logprobs"]["content"]
    assert [step for choice in choices for step in choice.get("speculation_steps", [])] == whole["speculation_steps"]
