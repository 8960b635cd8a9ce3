"""The demo main `make run` serves: built from the committed main, deterministic, verified by its
checksum, the same function as the committed main, and a pair whose greedy answers through the
product are the main alone's."""

import json

import pytest
import requests

from inference.demo import main_model
from inference.engines.decoding import DecodingParams
from inference.engines.interface import Finished
from inference.engines.library.pipeline import LibraryEngine
from inference.engines.spec import PairSpec
from inference.limits import Route

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]  # generation, not its record

PROMPTS = ("def quicksort(numbers):", "class Stack:\n    def __init__(self):", "def parse_args(argv):")


def greedy(engine: LibraryEngine, prompt: str, n: int = 32) -> list[int]:
    request = engine.submit(prompt=prompt, params=DecodingParams(max_new_tokens=n, ignore_eos=True))
    tokens: list[int] = []
    while not isinstance(event := request.events.get(timeout=120), Finished):
        tokens += event.token_ids
    return tokens


@pytest.mark.no_database
def test_the_build_is_deterministic_and_checked_by_pair_json():
    manifest = main_model.build()
    assert manifest["sha256"] == main_model.expected_sha256() == main_model.sha256(main_model.TARGET / "openvino_model.bin")
    assert 200e6 < manifest["params"] < 400e6 and main_model.is_built()
    (main_model.TARGET / "openvino_model.bin").write_bytes(b"corrupted")  # a damaged copy is rebuilt
    assert not main_model.is_built()
    assert main_model.build()["sha256"] == manifest["sha256"] and main_model.is_built()
    config = json.loads((main_model.TARGET / "config.json").read_text())
    assert config["intermediate_size"] == 4 * json.loads((main_model.SOURCE / "config.json").read_text())[
        "intermediate_size"]


@pytest.mark.no_database
def test_the_grown_main_computes_what_the_committed_main_computes():
    main_model.build()
    small = LibraryEngine(PairSpec(slug="small", main_dir=str(main_model.SOURCE), route=Route.LIBRARY_MAIN_ALONE))
    large = LibraryEngine(PairSpec(slug="large", main_dir=str(main_model.TARGET), route=Route.LIBRARY_MAIN_ALONE))
    for prompt in PROMPTS:
        assert greedy(large, prompt) == greedy(small, prompt)


@pytest.mark.usefixtures("celery_worker")
def test_the_served_demo_pair_answers_the_main_alones_greedy_output(live_server_url, large_demo_pair, api_key):
    large = LibraryEngine(PairSpec(slug="large", main_dir=str(main_model.TARGET), route=Route.LIBRARY_MAIN_ALONE))
    expected = large.tokenizer.decode(greedy(large, PROMPTS[0], 24))
    answer = requests.post(f"{live_server_url}/v1/completions", timeout=300, headers={
        "Authorization": f"Bearer {api_key.secret}"}, json={
        "model": "demo-code", "prompt": PROMPTS[0], "max_tokens": 24, "ignore_eos": True}).json()
    assert answer["choices"][0]["text"] == expected
    assert answer["usage"]["speculative_mode"] == "draft" and answer["usage"]["accepted_tokens"] > 0
