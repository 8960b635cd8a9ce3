"""Hypothesis fuzzes the chat socket's protocol (chatsite/chat/consumers.py): frames of every action with
fields of any JSON type, hostile values (huge numbers, deep nesting, long strings, NaN) and text that is not
JSON at all. Whatever a frame holds, the socket answers in words (never `internal_error`) and stays open.
Bounded: a few dozen examples, each a few frames on a socket of its own; no worker, so a valid send is
refused once validated ("nobody serves"), and nothing is generated."""

import asyncio
import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatsite.chat.consumers import ACTIONS, MAX_FRAME_CHARS, REF_MAX_CHARS
from inference.models import Generation
from tests.api_client import PROMPT
from tests.test_api_fuzz import HOSTILE, nested
from tests.test_chat_consumers import logged_in_socket

pytestmark = pytest.mark.django_db(transaction=True)
EXAMPLES = 150
OPTIONS = ("max_tokens", "num_assistant_tokens", "assistant_confidence_threshold", "speculative", "temperature",
           "top_p", "top_k", "seed", "stop", "ignore_eos")
FIELDS = {"send": ("pair", "text", "conversation", "settings"), "regenerate": ("message", "settings"),
          "continue": ("message", "settings"), "follow": ("generation", "after", "steps"), "stop": ("generation",)}
assert set(FIELDS) == set(ACTIONS)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)
NOT_JSON = ["[" * 5000 + "]" * 5000, json.dumps(nested(100, keyed=True)), '{"action": "send", "settings": NaN}',
            '{"action": "follow", "steps": ' + "9" * 5000 + "}", '{"action": "send", "settings": {"top_p": 1e400}}',
            json.dumps({"action": "send", "text": "x" * MAX_FRAME_CHARS})]  # longer than a chat sends


@st.composite
def frames(draw, *, generation_ids: list[str]) -> str:
    """A frame as a client might send it: one action with plausible fields, one place of it (a field, an
    option in its settings, its action or ref) holding a hostile or arbitrary value; or text that is not a
    frame at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(NOT_JSON) | st.text(min_size=1, max_size=40))
    plausible = {"pair": st.just("demo-code"), "text": st.just(PROMPT), "conversation": st.none() | st.integers(1, 9),
                 "message": st.integers(1, 9), "generation": st.sampled_from(generation_ids),
                 "after": st.sampled_from(["0-0", "1-0"]), "steps": st.integers(0, 3),
                 "settings": st.fixed_dictionaries({}, optional={"max_tokens": st.integers(1, 8)})}
    action = draw(st.sampled_from(ACTIONS))
    content = {"action": action, **{name: draw(plausible[name]) for name in FIELDS[action]}}
    options = [f"settings.{name}" for name in OPTIONS] if "settings" in content else []
    place = draw(st.sampled_from(["action", "ref", *FIELDS[action], *options]))
    value = draw(st.sampled_from([*HOSTILE, "\ud800", "r" * (REF_MAX_CHARS + 1)]) | json_values)
    if place.startswith("settings."):
        content["settings"] = {**content["settings"], place.removeprefix("settings."): value}
    else:
        content[place] = value
    return json.dumps(content)


async def exchange(user, texts: list[str]) -> list[dict]:
    """Every frame the socket answers `texts` with, up to its answer to a last, known-bad frame."""
    communicator, _ = await logged_in_socket(user)
    sentinel = uuid.uuid4().hex
    try:
        for text in texts:
            await communicator.send_to(text_data=text)
        await communicator.send_json_to({"action": "dance", "ref": sentinel})
        replies = []
        while not replies or replies[-1].get("ref") != sentinel:
            replies.append(await communicator.receive_json_from(timeout=60))  # fails if the socket closed
        return replies
    finally:
        await communicator.disconnect()


def test_no_frame_gets_an_internal_error_or_drops_the_socket(demo_pair, user):
    demo_pair.max_new_tokens_cap = 8
    demo_pair.save()
    owned = Generation.objects.create(pair=demo_pair, user=user, prompt=PROMPT, status=Generation.Status.FINISHED,
                                      finished_at=timezone.now() - timedelta(hours=1))
    generation_ids = [str(owned.id), str(uuid.uuid4())]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(texts=st.lists(frames(generation_ids=generation_ids), min_size=1, max_size=5))
    def socket_answers_in_words(texts):
        replies = asyncio.run(exchange(user, texts))
        failures = [reply for reply in replies if reply.get("code") == "internal_error"]
        assert not failures, (texts, failures)

    socket_answers_in_words()
