"""One user's cached blocks tell another nothing (engines/own/block_pool.py, serving/web.py cache_scope), through the
API on real parts (daphne, a Celery worker, the own engine on the demo pair): Bob sends a prompt of several blocks;
Alice, with a key of her own, sends one that starts alike and finds none of his blocks (her usage's cached_tokens is
0, as on a server that never saw Bob's); Bob's blocks are there all the while: his prompt again, or Alice's prompt
from another of his keys, finds them."""

import uuid
from dataclasses import replace

import openvino as ov
import pytest
from django.conf import settings

from inference.engines.own.paged_model import cache_layout, read_paged
from inference.limits import Route
from inference.serving.records import pair_spec
from tests.api_client import client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]

SHARED = "\n".join(f"def step_{n}(state, value):\n    state[{n}] = value * {n} + len(state)\n    return state"
                   for n in range(8))


def block_tokens(pair) -> int:
    """The tokens of a block of the pair's own engine's cache, its main compiled as the engine compiles it (the
    PagedAttention op's blocks depend on the precisions: the CPU's default u8 cache has others)."""
    spec = replace(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE), dynamic_quantization=True)
    core = ov.Core()
    compiled = core.compile_model(read_paged(core, spec.main_dir), spec.device,
                                  spec.device_properties(device=spec.device))
    return cache_layout(compiled).block_tokens


def new_key(user, name: str) -> str:
    """A key of `user`'s, made as the admin makes them: its secret."""
    from inference.api.auth import set_new_key
    from inference.models import ApiKey

    key = ApiKey(name=name, user=user, max_concurrent=2)
    secret = set_new_key(key)
    key.save()
    return secret


@pytest.mark.usefixtures("celery_worker")
def test_another_users_prompt_finds_none_of_a_users_cached_blocks(live_server_url, demo_pair, user, other_user):
    assert settings.PREFIX_CACHE_SCOPE == "user"  # the default: blocks are a user's
    demo_pair.own_engine_streams = 1  # lone answers on the own engine, whose blocks the pool keeps
    demo_pair.save()
    alice, bob = user, other_user
    block = block_tokens(demo_pair)
    start = f"# session {uuid.uuid4().hex}\n{SHARED}\n"  # no earlier test's blocks
    bobs_prompt, alices_prompt = start + "# What does step_3 return?\n", start + "# Why is step_5 slow?\n"

    def send(secret: str, prompt: str):
        answer = client(live_server_url, secret).completions.create(model="demo-code", prompt=prompt, max_tokens=8,
                                                                    temperature=0)
        usage = answer.usage.model_dump()
        assert Route(usage["speculative_route"]).is_own_engine(), usage  # the engine that keeps blocks
        return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]

    bobs, alices, bobs_other = new_key(bob, "bob"), new_key(alice, "alice"), new_key(bob, "bob's script")
    prompt_tokens, cached = send(bobs, bobs_prompt)
    assert prompt_tokens > 4 * block and cached == 0  # several blocks, read cold

    prompt_tokens, cached = send(alices, alices_prompt)
    assert cached == 0, f"Alice's prompt found {cached} tokens of Bob's"

    prompt_tokens, cached = send(bobs, bobs_prompt)  # Bob's blocks were kept all along
    assert cached == (prompt_tokens - 1) // block * block > 3 * block

    prompt_tokens, cached = send(bobs_other, alices_prompt)  # a user's blocks are his, whichever key he sends with
    assert 3 * block <= cached < prompt_tokens and cached % block == 0, cached

    prompt_tokens, cached = send(alices, alices_prompt)  # Alice's own blocks are hers
    assert cached == (prompt_tokens - 1) // block * block
