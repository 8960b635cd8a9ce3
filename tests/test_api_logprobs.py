"""Log probabilities of the answer's tokens through the official client on the demo pair: the main model's
own, whichever path served the answer (the library's speculative pipeline, its main alone, the exact
engine), streamed or not; and each position's most likely alternatives (top_logprobs), which the exact
engine computes and then serves the request."""

import pytest

from inference.models import Generation
from inference.serving.reasons import ALTERNATIVES
from tests.api_client import MESSAGES, PROMPT, client, post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]  # generation, not its record


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
    own engine draws the greedy tokens, and their logprobs are the main alone's greedy ones."""
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


@pytest.mark.usefixtures("celery_worker")
def test_alternatives_are_the_main_models_own_with_or_without_the_draft(live_server_url, demo_pair, api_key):
    """top_logprobs: the most likely tokens at each position, most likely first, under the main's raw
    distribution; a greedy answer's token is the first of them; the draft changes none of them; streamed
    the same."""
    api = client(live_server_url, api_key.secret)
    asked = {"model": "demo-code", "messages": MESSAGES, "max_tokens": 12, "logprobs": True, "top_logprobs": 4}
    drafted = api.chat.completions.create(**asked)
    alone = api.chat.completions.create(**asked, extra_body={"speculative": False})
    usage = drafted.usage.model_dump()
    assert usage["speculative_mode"] == "draft" and ALTERNATIVES in usage["speculative_reason"], usage
    content, reference = drafted.choices[0].logprobs.content, alone.choices[0].logprobs.content
    assert [e.token for e in content] == [e.token for e in reference]
    for entry, same in zip(content, reference, strict=True):
        top = [(alt.token, alt.logprob) for alt in entry.top_logprobs]
        assert len(top) == 4 and [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert top[0] == (entry.token, entry.logprob)
        assert [lp for _, lp in top] == pytest.approx([alt.logprob for alt in same.top_logprobs], abs=1e-4)
    streamed = [entry for chunk in api.chat.completions.create(**asked, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    assert [[a.token for a in e.top_logprobs] for e in streamed] == [[a.token for a in e.top_logprobs]
                                                                     for e in content]


@pytest.mark.usefixtures("celery_worker")
def test_completions_take_their_alternatives_as_a_number(live_server_url, demo_pair, api_key):
    api = client(live_server_url, api_key.secret)
    answer = api.completions.create(model="demo-code", prompt=PROMPT, max_tokens=8, logprobs=3, temperature=0.7, seed=2)
    logprobs = answer.choices[0].logprobs
    assert answer.usage.model_dump()["speculative_mode"] == "draft-exact-sampling"
    assert len(logprobs.top_logprobs) == len(logprobs.tokens) == answer.usage.completion_tokens
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert 1 <= len(top) <= 3 and all(value <= 0 for value in top.values())
        assert token not in top or top[token] == pytest.approx(logprob)  # a sampled token need not be among them


@pytest.mark.parametrize(("path", "fields", "param"), [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": "2"}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2, "assistant_confidence_threshold": 0.5},
     "top_logprobs"),
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
])
def test_bad_log_probability_fields_are_refused_naming_the_field(live_server_url, demo_pair, api_key, path, fields,
                                                                 param):
    body = {"model": "demo-code", **({"messages": MESSAGES} if "chat" in path else {"prompt": PROMPT}), **fields}
    response = post(live_server_url, path, api_key.secret, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert Generation.objects.count() == 0
