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
