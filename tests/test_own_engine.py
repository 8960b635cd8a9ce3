"""A pair's own engine (ModelPair.own_engine_streams): with the CPU's dynamic quantization (int8
activations, the fastest way to run an int8 main alone), its greedy answers with the draft are the main
alone's token for token, because rejected tokens are cut from the main's cache; and a worker serving
such a pair answers one stream on it alone: one copy of the weights, no step process."""

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from django.conf import settings

from inference.benchmark.memory import process_tree
from inference.engines.base import DecodingParams, Finished, PairSpec
from inference.engines.exact import ExactEngine, KvSequence
from inference.selectors import live_workers
from inference.serving.speculation import OWN_ENGINE
from tests.test_api import client
from tests.test_robustness_watchdog import pair_on_a_worker_of_its_own

PAIR = Path(settings.MODELS_ROOT) / settings.DEMO_PAIR_DIR
SPEC = PairSpec(slug="own", main_dir=str(PAIR / "main"), draft_dir=str(PAIR / "draft"), exact_sampling=True,
                own_engine=True, dynamic_quantization=True)
PROMPTS = ("def quicksort(numbers):", "class Stack:\n    def push(self, item):", "import os\n\ndef walk(root):")


@pytest.fixture(scope="module")
def engine():
    assert SPEC.device_properties().get("DYNAMIC_QUANTIZATION_GROUP_SIZE") is None  # the CPU's default: on
    return ExactEngine(SPEC)


def answer(engine, prompt: str, k: int, **held) -> list[int]:
    request = engine.submit(prompt=prompt, params=DecodingParams(max_new_tokens=40, ignore_eos=not held,
                                                                 num_assistant_tokens=k, **held))
    tokens: list[int] = []
    while not isinstance(event := request.events.get(timeout=120), Finished):
        tokens += event.token_ids
    assert event.finish_reason == ("stop" if held.get("grammar_kind") == "regex" else "length"), event
    return tokens


def test_rejected_tokens_cut_from_the_cache_leave_the_next_logits_bitwise_unchanged(engine):
    ids = engine.tokenizer.encode(PROMPTS[0]).input_ids.data[0].tolist()
    rng = np.random.default_rng(0)
    clean, cut = KvSequence(engine.main), KvSequence(engine.main, cut_rejected=True)
    clean.feed(ids)
    cut.feed(ids)
    for token in rng.integers(100, 1000, 6).tolist():
        expected = clean.feed([token])[-1].copy()
        got = cut.feed([token, *rng.integers(100, 1000, 3).tolist()])[0].copy()  # with 3 proposals, rejected
        cut.drop_last(3)
        assert np.array_equal(got, expected)


def test_greedy_answers_with_the_draft_are_the_main_alones_token_for_token(engine):
    for prompt in PROMPTS:
        alone = answer(engine, prompt, 0)
        assert answer(engine, prompt, 3) == alone and answer(engine, prompt, 5) == alone, prompt


SNIPPET = {"type": "object", "properties": {"lang": {"enum": ["python", "rust", "go"]},
                                            "lines": {"type": "integer", "minimum": 1, "maximum": 99}},
           "required": ["lang", "lines"], "additionalProperties": False}
CODE = r"[a-z]{2,10}-[0-9]{1,3}"


def test_under_a_grammar_the_draft_changes_no_token_and_the_answer_holds_to_it(engine):
    """The draft proposes under the grammar too (engines/constraint.py): the answer is the main alone's under
    it, token for token. The demo main writes JSON's optional whitespace until its tokens run out; a regex
    answer ends where the grammar allows nothing more."""
    for prompt in PROMPTS:
        for held, holds in (({"grammar_kind": "json_schema", "grammar_text": json.dumps(SNIPPET)},
                             r'\s*\{\s*"lang"\s*:\s*"(python|rust|go)"[\s\S]*'),
                            ({"grammar_kind": "regex", "grammar_text": CODE}, CODE)):
            alone = answer(engine, prompt, 0, **held)
            assert answer(engine, prompt, 3, **held) == alone, (prompt, held)
            text = engine.tokenizer.decode(alone, skip_special_tokens=True)
            assert re.fullmatch(holds, text), text


@pytest.fixture
def own_engine_pair(demo_pair, stack_env, redis_client, tmp_path):
    yield from pair_on_a_worker_of_its_own(demo_pair, stack_env, redis_client, tmp_path, slug="own-engine",
                                           env={}, own_engine_streams=1)


@pytest.mark.django_db(transaction=True)
def test_one_stream_is_served_on_the_own_engine_alone(own_engine_pair, live_server_url, api_key, redis_client):
    pair, worker = own_engine_pair
    api = client(live_server_url, api_key.secret)

    def ask(**extra) -> tuple[str, dict]:
        done = api.completions.create(model=pair.slug, prompt=PROMPTS[1], max_tokens=32, extra_body=extra)
        return done.choices[0].text, done.usage.model_dump()

    drafted, with_draft = ask()
    alone, without = ask(speculative=False)
    assert drafted == alone
    assert (with_draft["speculative_mode"], without["speculative_mode"]) == ("draft", "off")
    assert OWN_ENGINE in with_draft["speculative_reason"] and OWN_ENGINE in without["speculative_reason"]
    assert with_draft["accepted_tokens"] and without["draft_tokens"] is None
    sampled = api.completions.create(model=pair.slug, prompt=PROMPTS[1], max_tokens=8, temperature=0.8, seed=3)
    assert sampled.usage.model_dump()["speculative_mode"] == "draft-exact-sampling"
    deadline = time.monotonic() + 10
    while not (engines := next(b["engines"] for b in live_workers(client=redis_client)
                               if b["name"].endswith(f":{worker.proc.pid}"))) and time.monotonic() < deadline:
        time.sleep(0.5)  # the heartbeat after these answers
    assert engines == [{"slug": pair.slug, "speculative": True, "exact_sampling": True}]
    assert process_tree(worker.proc.pid) == [worker.proc.pid], "a step process holds another copy of the main"
