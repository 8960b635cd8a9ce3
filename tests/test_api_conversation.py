"""A conversation through the API on real parts (daphne, a Celery worker, the own engine on the demo pair): a pasted
file, then a follow-up sent with the whole history. The follow-up's prompt comes mostly from the prefix cache and the
usage says how much (OpenAI's prompt_tokens_details.cached_tokens), /metrics counts the lookups, and the long first
prompt's stream says how far its reading got before the first token."""

import json
import time

import pytest
import requests
from django.conf import settings

from inference import transport
from inference.models import Generation
from tests.api_client import client
from tests.test_engines_prefix_cache import BLOCK_TOKENS  # the own engine's blocks, checked there

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]

PASTED = "\n".join(f"def step_{n}(state, value):\n    state[{n}] = value * {n} + len(state)\n    return state"
                   for n in range(24))


@pytest.mark.usefixtures("celery_worker")
def test_a_follow_up_reads_its_history_from_the_cache_and_says_so(live_server_url, demo_pair, api_key):
    demo_pair.own_engine_streams = 1  # lone answers on the own engine, as the real pair's catalogue sets
    demo_pair.save()
    api = client(live_server_url, api_key.secret)
    messages = [{"role": "system", "content": "You review Python."},
                {"role": "user", "content": f"Here is my file:\n{PASTED}\nWhat does step_3 return?"}]
    first = api.chat.completions.create(model="demo-code", messages=messages, max_tokens=24, temperature=0)
    assert first.usage.prompt_tokens > 4 * BLOCK_TOKENS
    assert first.usage.prompt_tokens_details.cached_tokens == 0

    events = [json.loads(data["data"]) for _, data in transport.sync_client().xrange(
        transport.stream_key(Generation.objects.get(id=first.id.removeprefix("chatcmpl-")).id))]
    kinds = [event["type"] for event in events]
    reading = [event for event in events if event["type"] == "prompt"]
    assert reading and kinds.index("prompt") < kinds.index("delta"), kinds  # said before the first token
    assert reading[-1] == {"type": "prompt", "read": first.usage.prompt_tokens, "total": first.usage.prompt_tokens}

    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And step_4?"}]
    follow_up = api.chat.completions.create(model="demo-code", messages=messages, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    usage = [chunk.usage for chunk in follow_up if chunk.usage][-1]
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached >= (first.usage.prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS, usage
    assert cached < usage.prompt_tokens and cached % BLOCK_TOKENS == 0

    samples = metric_samples(live_server_url)
    pair = '{model_name="demo-code"}'
    assert float(samples[f"vllm:prefix_cache_hits_total{pair}"]) >= cached
    assert float(samples[f"vllm:prefix_cache_queries_total{pair}"]) >= first.usage.prompt_tokens + usage.prompt_tokens
    deadline = time.monotonic() + 3 * settings.WORKER_HEARTBEAT_S
    while not any(float(value) > 0 for key, value in samples.items() if key.startswith("specchat_prefix_cache_bytes{")):
        assert time.monotonic() < deadline, "no heartbeat said what the worker's prefix caches hold"
        time.sleep(0.5)
        samples = metric_samples(live_server_url)


def metric_samples(base_url: str) -> dict[str, str]:
    text = requests.get(f"{base_url}/metrics", timeout=30).text
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
