"""Which of a prompt's tokens are answers' (read as one-token sequences) and which its text (read as queries): a
function of the tokens alone, so a conversation read cold computes what its cached blocks hold."""

from pathlib import Path

import pytest
from django.conf import settings

from inference.engines.own.answer_layout import answer_opener, one_token_layout
from inference.engines.tokenizer import load_tokenizer

OPENER, END = (7, 8, 9), 2  # as Qwen's `<|im_start|>assistant\n` and `<|im_end|>`


@pytest.mark.parametrize(("tokens", "answers"), [
    ([1, 3, 4, 5], "...."),  # a prompt with no answer in it: all text
    ([1, 7, 8, 9], "...."),  # opened for the answer to come: the opener is text
    ([1, 7, 8, 9, 4, 5, 2, 1], "....aaa."),  # an earlier answer, up to and including its end token
    ([7, 8, 9, 4, 2, 3, 7, 8, 9, 5, 6], "...aa....aa"),  # two answers, the last one unfinished (a handed-over answer)
    ([7, 8, 4, 5, 2], "....."),  # half an opener opens nothing
    ([8, 9, 4], "..."),  # nor its end alone
    ([7, 8, 9, 7, 8, 9, 4, 2, 5], "...aaaaa."),  # an opener inside an answer is the answer's
])
def test_answers_run_from_after_an_opener_to_their_end_token(tokens, answers):
    assert "".join("a" if one else "." for one in one_token_layout(tokens, opener=OPENER, ends={END})) == answers


def test_no_opener_marks_no_answer():
    assert one_token_layout([7, 8, 9, 4], opener=(), ends={END}) == [False] * 4


@pytest.fixture
def tokenizer():
    return load_tokenizer(Path(settings.MODELS_ROOT) / settings.DEMO_PAIR_DIR / "main")


def test_the_opener_is_what_the_templates_generation_prompt_adds(tokenizer):
    assert answer_opener(tokenizer) == ()  # the demo's template adds nothing: its prompts hold no answer it can tell
    tokenizer.set_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                                "{% if add_generation_prompt %}<bot>{% endif %}")
    assert answer_opener(tokenizer) == tuple(tokenizer.encode("<bot>", add_special_tokens=False).input_ids.data[0])
    tokenizer.set_chat_template("")
    assert answer_opener(tokenizer) == ()  # no template at all
