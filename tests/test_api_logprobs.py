"""Log probabilities of the answer's tokens through the official client on the demo pair: the main model's
own, whichever path served the answer (the library's speculative pipeline, its main alone, the exact
engine), streamed or not; alternatives are refused by name."""

import pytest

from inference.models import Generation
from tests.api_client import MESSAGES, PROMPT, client, post

pytestmark = pytest.mark.django_db(transaction=True)


def completion(api, **body):
    speculative = body.pop("speculative", True)
    answer = api.completions.create(model="demo-code", prompt=PROMPT, max_tokens=12, logprobs=0,
                                    extra_body={"speculative": speculative}, **body)
    return answer, answer.choices[0].logprobs


@pytest.mark.usefixtures("celery_worker")
def test_greedy_logprobs_are_the_main_alones_with_or_without_the_draft(live_server_url, demo_pair, api_key):
    api = client(live_server_url, api_key.secret)
    drafted, with_draft = completion(api)
    alone, without = completion(api, speculative=False)
    assert drafted.usage.model_dump()["speculative_mode"] == "draft"
    assert alone.usage.model_dump()["speculative_mode"] == "off"
    assert with_draft.tokens == without.tokens and "".join(with_draft.tokens) == drafted.choices[0].text
    assert len(with_draft.tokens) == drafted.usage.completion_tokens
    assert with_draft.token_logprobs == pytest.approx(without.token_logprobs, abs=1e-4)
    assert all(logprob <= 0 for logprob in with_draft.token_logprobs)


@pytest.mark.usefixtures("celery_worker")
def test_the_exact_engine_reports_the_main_models_raw_logprobs(live_server_url, demo_pair, api_key):
    """Logprobs are the raw distribution's (before temperature), as the library reports them: at T=0.01 the
    exact engine draws the greedy tokens, and their logprobs are the main alone's greedy ones."""
    api = client(live_server_url, api_key.secret)
    sampled, exact = completion(api, temperature=0.01, seed=5)
    _, greedy = completion(api, speculative=False)
    assert sampled.usage.model_dump()["speculative_mode"] == "draft-exact-sampling"
    assert exact.tokens == greedy.tokens
    assert exact.token_logprobs == pytest.approx(greedy.token_logprobs, abs=1e-3)


@pytest.mark.usefixtures("celery_worker")
def test_a_streamed_chat_carries_the_same_logprobs_as_the_whole_answer(live_server_url, demo_pair, api_key):
    api = client(live_server_url, api_key.secret)
    asked = {"model": "demo-code", "messages": MESSAGES, "max_tokens": 16, "logprobs": True}
    whole = api.chat.completions.create(**asked)
    streamed = [entry for chunk in api.chat.completions.create(**asked, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    content = whole.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert "".join(e.token for e in content) == whole.choices[0].message.content
    assert all(e.top_logprobs == [] and e.bytes == list(e.token.encode()) for e in content)
    plain = api.chat.completions.create(**{**asked, "logprobs": False})
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize(("path", "fields", "param"), [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/completions", {"logprobs": 2}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
])
def test_alternatives_are_refused_naming_the_field(live_server_url, demo_pair, api_key, path, fields, param):
    body = {"model": "demo-code", **({"messages": MESSAGES} if "chat" in path else {"prompt": PROMPT}), **fields}
    response = post(live_server_url, path, api_key.secret, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert Generation.objects.count() == 0
