"""Per-step provenance, opt-in (`speculation_steps`), through the official client on the demo pair: which
text the draft proposed and the main accepted, and which the main wrote itself, streamed or not."""

import pytest

from tests.test_api import MESSAGES, PROMPT, client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]  # generation, not its record


@pytest.mark.usefixtures("celery_worker")
def test_each_choice_says_which_text_the_draft_proposed_and_which_the_main_wrote(live_server_url, demo_pair,
                                                                               api_key):
    api = client(live_server_url, api_key.secret)
    asked = {"model": "demo-code", "prompt": PROMPT, "max_tokens": 32,
             "extra_body": {"speculation_steps": True, "num_assistant_tokens": 3}}
    answer = api.completions.create(**asked)
    steps = answer.choices[0].model_dump()["speculation_steps"]
    assert "".join(step["draft"] + step["main"] for step in steps) == answer.choices[0].text
    assert any(step["draft"] for step in steps), "the draft's accepted text is never shown"
    assert all(step["main"] for step in steps[:-1]), "every step but a cut last one ends on the main's token"

    streamed = [step for chunk in api.completions.create(**asked, stream=True)
                for step in chunk.choices[0].model_dump().get("speculation_steps") or []]
    assert streamed == steps  # greedy: the same answer, the same steps

    alone = api.completions.create(**{**asked, "extra_body": {"speculation_steps": True, "speculative": False}})
    assert all(not step["draft"] for step in alone.choices[0].model_dump()["speculation_steps"])
    plain = api.chat.completions.create(model="demo-code", messages=MESSAGES, max_tokens=8)
    assert "speculation_steps" not in plain.choices[0].model_dump()
