"""Who may call the REST API and what they may send: keys, and a 4xx naming the field for bad input,
with nothing queued."""

import hashlib
import re
from datetime import timedelta

import openai
import pytest
import requests
from django.contrib.messages.storage.cookie import CookieStorage
from django.http import HttpRequest
from django.utils import timezone

from inference.api.auth import set_new_key
from inference.models import ApiKey, Generation
from tests.api_client import MESSAGES, PROMPT, client, post

pytestmark = pytest.mark.django_db(transaction=True)


def test_generation_needs_a_valid_key(live_server_url, demo_pair, api_key):
    revoked = ApiKey(name="old", revoked=True)
    revoked_secret = set_new_key(revoked)
    revoked.save()
    for key in ("", "sk-spec-wrong", revoked_secret):
        response = post(live_server_url, "/v1/completions", key or None, {"model": "demo-code", "prompt": PROMPT})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.AuthenticationError):
        client(live_server_url, "sk-spec-wrong").chat.completions.create(model="demo-code", messages=MESSAGES)
    events = requests.get(f"{live_server_url}/v1/completions/00000000-0000-0000-0000-000000000000/events", timeout=30)
    assert events.status_code == 401
    assert Generation.objects.count() == 0


@pytest.mark.usefixtures("celery_worker")
def test_admin_shows_a_new_key_once_uncached_and_in_no_cookie(admin_client, live_server_url, demo_pair):
    """Django's messages cookie is signed, not encrypted: a secret put in a message travels in a Set-Cookie
    and back, where proxies and logs keep it. Every response of the flow is read, its cookies decoded."""
    responses = [admin_client.get("/admin/inference/apikey/add/")]
    responses.append(admin_client.post("/admin/inference/apikey/add/", {"name": "script", "max_concurrent": 3}))
    key = ApiKey.objects.get(name="script")
    assert responses[-1].status_code == 302  # to the key's "created" page: a reload there makes no second key
    responses.append(admin_client.get(responses[-1]["Location"]))
    created = responses[-1]
    secret = re.search(r'id="api-key-secret">([^<]+)<', created.content.decode()).group(1)
    assert key.key_hash == hashlib.sha256(secret.encode()).hexdigest() and secret.startswith(key.prefix)
    assert created.status_code == 200 and "no-store" in created["Cache-Control"]
    responses.append(admin_client.get(responses[-2]["Location"]))  # reloaded: the secret is gone, no key is added
    assert secret not in responses[-1].content.decode() and "was shown once" in responses[-1].content.decode()
    assert ApiKey.objects.count() == 1
    responses += [admin_client.get("/admin/inference/apikey/"), admin_client.get(f"/admin/inference/apikey/{key.id}/change/")]
    assert secret not in responses[-1].content.decode() and key.key_hash not in responses[-1].content.decode()
    for response in responses:
        for cookie in response.cookies.values():
            shown = [str(m) for m in CookieStorage(HttpRequest())._decode(cookie.value) or []]
            assert not any(part in text for part in (secret, key.key_hash) for text in [cookie.value, *shown]), cookie
    answer = post(live_server_url, "/v1/completions", secret, {"model": "demo-code", "prompt": PROMPT, "max_tokens": 4})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0, answer.text


def test_another_keys_answer_is_not_found(live_server_url, demo_pair, api_key):
    """Following or stopping an answer takes the key that started it: any other gets a 404, as for no answer."""
    theirs = ApiKey(name="theirs")
    their_secret = set_new_key(theirs)
    theirs.save()
    answer = Generation.objects.create(pair=demo_pair, api_key=theirs, source=Generation.Source.API, prompt=PROMPT,
                                       status=Generation.Status.FINISHED, text=" return", finish_reason="stop",
                                       finished_at=timezone.now() - timedelta(hours=1))  # its stream long expired
    for path in (f"/v1/completions/cmpl-{answer.id}/events", f"/v1/chat/completions/{answer.id}/events"):
        response = requests.get(f"{live_server_url}{path}", headers={"Authorization": f"Bearer {api_key.secret}"},
                                timeout=30)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found", response.text
        followed = requests.get(f"{live_server_url}{path}", headers={"Authorization": f"Bearer {their_secret}"},
                                timeout=30)
        assert followed.status_code == 200 and followed.text.rstrip().endswith("data: [DONE]"), followed.text
    cancel = post(live_server_url, f"/v1/completions/{answer.id}/cancel", api_key.secret, {})
    assert cancel.status_code == 404 and "theirs" not in cancel.text


# ----------------------------------------------------------------- bad input: 4xx naming the field, nothing queued
BAD_COMPLETIONS = [
    ({"model": "demo-code", "prompt": PROMPT, "max_tokens": "10"}, 400, "max_tokens"),
    ({"model": "demo-code", "prompt": PROMPT, "temperature": "hot"}, 400, "temperature"),
    ({"model": "demo-code", "prompt": PROMPT, "stream": "yes"}, 400, "stream"),
    ({"model": 7, "prompt": PROMPT}, 400, "model"),
    ({"prompt": PROMPT}, 400, "model"),
    ({"model": "no-such-pair", "prompt": PROMPT}, 404, "model"),
    ({"model": "demo-code", "prompt": PROMPT, "num_assistant_tokens": 3, "assistant_confidence_threshold": 0.5},
     400, "assistant_confidence_threshold"),
    ({"model": "demo-code", "prompt": PROMPT, "temperature": 2.5}, 400, "temperature"),
    ({"model": "demo-code", "prompt": PROMPT, "temperature": 5e-324}, 400, "temperature"),  # 0 as a float32
    ({"model": "demo-code", "prompt": PROMPT, "assistant_confidence_threshold": 1e-40}, 400,
     "assistant_confidence_threshold"),
    ({"model": "demo-code", "prompt": PROMPT, "top_p": 0}, 400, "top_p"),
    ({"model": "demo-code", "prompt": PROMPT, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({"model": "demo-code", "prompt": PROMPT, "repetition_penalty": 2.5}, 400, "repetition_penalty"),
    ({"model": "demo-code", "prompt": PROMPT, "repetition_penalty": "1.1"}, 400, "repetition_penalty"),
    ({"model": "demo-code", "prompt": PROMPT, "num_assistant_tokens": 0}, 400, "num_assistant_tokens"),
    ({"model": "demo-code", "prompt": PROMPT, "assistant_confidence_threshold": 1.5}, 400,
     "assistant_confidence_threshold"),
    ({"model": "demo-code", "prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "demo-code", "prompt": PROMPT, "max_completion_tokens": 100000}, 400, "max_tokens"),
    ({"model": "demo-code", "prompt": PROMPT, "seed": -1}, 400, "seed"),
    ({"model": "demo-code", "prompt": PROMPT, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": "demo-code", "prompt": "   "}, 400, "prompt"),
    ({"model": "demo-code"}, 400, "prompt"),
    ({"model": "demo-code", "prompt": [PROMPT, PROMPT]}, 400, "prompt"),
    ({"model": "demo-code", "prompt": "word " * 3000}, 400, "prompt"),
    ({"model": "demo-code", "prompt": PROMPT, "n": 2}, 400, "n"),
    ({"model": "demo-code", "prompt": PROMPT, "best_of": 3}, 400, "best_of"),
    ({"model": "demo-code", "prompt": PROMPT, "use_beam_search": True}, 400, "use_beam_search"),
    ({"model": "demo-code", "prompt": PROMPT, "num_beams": 4}, 400, "num_beams"),
    ({"model": "demo-code", "prompt": PROMPT, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"model": "demo-code", "prompt": PROMPT, "speculative": "no"}, 400, "speculative"),
]
BAD_CHATS = [
    ({"model": "demo-code", "messages": []}, 400, "messages"),
    ({"model": "demo-code", "messages": "hello"}, 400, "messages"),
    ({"model": "demo-code", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ({"model": "demo-code", "messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content"),
    ({"model": "demo-code", "messages": [{"role": "user", "content": " "}]}, 400, "messages"),
    ({"model": "demo-code", "messages": [{"role": "user", "content": "word " * 3000}]}, 400, "messages"),
    ({"model": "demo-code", "messages": MESSAGES, "n": 2}, 400, "n"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"),
                         [("/v1/completions", *case) for case in BAD_COMPLETIONS]
                         + [("/v1/chat/completions", *case) for case in BAD_CHATS])
def test_bad_input_answers_4xx_naming_the_field(live_server_url, demo_pair, api_key, path, body, status, param):
    response = post(live_server_url, path, api_key.secret, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] and error["code"]
    assert Generation.objects.count() == 0


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '{"model": "demo-code", "prompt": NaN}',
                                 '{"model": "demo-code", "prompt": "\\ud800"}', b"\xff\xfe"])
def test_malformed_bodies_answer_400(live_server_url, demo_pair, api_key, raw):
    response = post(live_server_url, "/v1/completions", api_key.secret, raw)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"
    assert Generation.objects.count() == 0
