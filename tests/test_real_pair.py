"""The real pair, Qwen2.5-Coder-1.5B-Instruct with its 0.5B draft (`make real-pair`), through every part a
user touches: GGUF import, sampled answers' distribution through the API, greedy identity with and without the draft
through the live API, the chat in a browser, the official client with a system prompt, several turns and
non-ASCII text, and what a worker holds in memory. Run by `make test-real` (`pytest -m real`).

The prompts are chat requests written for these tests, not ones anything was tuned on."""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import replace
from pathlib import Path

import openai
import openvino as ov
import pytest
from django.conf import settings
from django.core.management import call_command

from inference.calibration.measure import CALIBRATION_PROMPTS
from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.interface import Finished
from inference.engines.own.engine import OwnEngine
from inference.engines.spec import HEAD_IDS_FILE, PairSpec
from inference.limits import Route
from inference.models import Generation, HostCalibration, JobStatus, ModelPair
from inference.pairs import catalog, importer
from inference.serving.precision import CONFIGS, EXACT_ON_OWN_ENGINE
from inference.serving.reasons import Reason
from inference.serving.records import pair_spec
from tests import test_engines_own_rows as rows
from tests.conftest import Worker, in_thread, log_in
from tests.distribution import compare, differs, samples
from tests.test_chat_ui import SHOTS

pytestmark = pytest.mark.real

SLUG = catalog.QWEN_CODER.slug
FOLDER = Path(settings.MODELS_ROOT) / SLUG
REQUESTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "In one paragraph, what is the difference between a process and a thread?",
    "Write a SQL query that lists the five customers with the highest total order amount from orders(customer, amount).",
    "Fix this code: `for i in range(10) print(i)`",
]


def client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, timeout=600)


@pytest.fixture(scope="module")
def real_folder():
    if not (FOLDER / "main" / "openvino_model.xml").is_file():
        pytest.fail(f"The real pair is not installed in {FOLDER}: run `make real-pair` first (make test-real does).")
    return FOLDER


@pytest.fixture
def real_pair(transactional_db, real_folder):
    """The real pair registered as `make real-pair` registers it (its IR is already there: seconds)."""
    call_command("install_pair", SLUG, stdout=io.StringIO())
    pair = ModelPair.objects.get(slug=SLUG)
    yield pair
    in_flight = Generation.objects.filter(status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING])
    deadline = time.monotonic() + 60
    while in_flight.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.fixture(scope="module")
def real_worker(stack_env, redis_client, real_folder, tmp_path_factory):
    worker = Worker(stack_env, f"pair.{SLUG}", tmp_path_factory.mktemp("real-worker") / "worker.log")
    worker.name = worker.wait_ready(redis_client)
    yield worker
    worker.stop()


@pytest.fixture
def key(api_key):
    api_key.max_concurrent = 8
    api_key.save()
    return api_key.secret


# ------------------------------------------------------------------ import
def test_qwens_gguf_files_became_ir_in_the_catalogues_weight_formats_and_nothing_else(real_folder):
    """`make real-pair` fetched Qwen's GGUF files (refused unless their sha256 is Qwen's) and converted them with
    `import_pair`, as a user's own GGUF is imported: the main in int8, the draft in int4 and in int8 (the calibration
    keeps the faster), each with its tokenizer, and no float32 export left behind. Every other test here generates
    with that IR."""
    folders = ("main", "draft", importer.ALTERNATIVE_DRAFT)
    assert sorted(p.name for p in real_folder.iterdir() if p.is_dir()) == sorted(folders)
    formats = {folder: set(re.findall(r'element_type="(u8|u4)"', (real_folder / folder / "openvino_model.xml")
                                      .read_text())) for folder in folders}
    # int4 keeps the embeddings and the head in int8, as NNCF's int4 compression does
    assert formats == {"main": {"u8"}, "draft": {"u4", "u8"}, importer.ALTERNATIVE_DRAFT: {"u8"}}, formats
    assert all((real_folder / folder / "openvino_tokenizer.xml").is_file() for folder in folders)


def test_a_folder_from_other_files_is_installed_again_and_its_calibrations_dropped(real_pair):
    """A pair folder converted from other files or formats (an older catalogue's int8 draft, say) is replaced by
    the kept IR of the catalogue's, and what hosts measured on the old files no longer steers the pair."""
    HostCalibration.objects.create(pair=real_pair, host="a" * 64, status=JobStatus.FINISHED,
                                   results={"fastest": "f32-dynamic", "best_k": {"1": 4}})
    (FOLDER / catalog.INSTALLED_FROM).write_text("qwen2.5-coder-1.5b-an-older-conversion")
    out = io.StringIO()
    call_command("install_pair", SLUG, stdout=out)
    assert "installing it again" in out.getvalue()
    assert catalog.installed_from(FOLDER) == catalog.converted_ir(catalog.QWEN_CODER).name
    assert (FOLDER / "main" / "openvino_model.xml").is_file() and (FOLDER / "draft" / HEAD_IDS_FILE).is_file()
    assert (FOLDER / CALIBRATION_PROMPTS).read_text() == (settings.BASE_DIR / catalog.QWEN_CODER.calibration_prompts
                                                          ).read_text()  # its hosts calibrate on requests like its own
    assert not HostCalibration.objects.filter(pair__slug=SLUG).exists()
    assert ModelPair.objects.get(slug=SLUG).id == real_pair.id  # the pair and its history stay

def test_installing_takes_the_chats_default_from_the_demo(transactional_db, real_folder):
    """After `make real-pair` a new chat opens on the real pair (`make run` registers the demo again, which keeps it
    one click away); an admin's own choice of default stays."""
    call_command("register_demo_pair", "--main", "small", stdout=io.StringIO())
    assert ModelPair.objects.get(slug="demo-code").is_default
    call_command("install_pair", SLUG, stdout=io.StringIO())
    assert list(ModelPair.objects.filter(is_default=True).values_list("slug", flat=True)) == [SLUG]
    call_command("register_demo_pair", "--main", "small", stdout=io.StringIO())  # `make run`
    assert list(ModelPair.objects.filter(is_default=True).values_list("slug", flat=True)) == [SLUG]
    chosen = ModelPair.objects.create(name="Chosen", slug="chosen", main_dir=f"{SLUG}/main", is_default=True)
    call_command("install_pair", SLUG, stdout=io.StringIO())
    assert list(ModelPair.objects.filter(is_default=True).values_list("slug", flat=True)) == [chosen.slug]


# ------------------------------------------------------------------ sampled answers: the own engine's distribution
@pytest.mark.timeout(1800)  # 600 answers one at a time: about five minutes on a 2-vCPU host
@pytest.mark.usefixtures("real_worker")
def test_sampled_answers_through_the_api_follow_the_main_alones_distribution(live_server_url, real_pair, key):
    """At the chat's defaults (Qwen's for the pair: T 0.7, top-p 0.8, top-k 20, repetition penalty 1.05) through the
    API, one request at a time with the draft (the pair's own engine): the first three tokens (K=3, the exact rule)
    against `speculative: false` (drawn from the main's distribution directly), 300 a side, by the permutation test
    of tests/test_sampling_distribution.py, on the 151,936-token vocabulary. The question asks for random words: at
    these settings most questions have one or two likely openings, which would prove little."""
    api = client(live_server_url, key)
    messages = [{"role": "user", "content": "Reply with three random English nouns, separated by commas."}]
    sampling = dict(real_pair.chat_sampling)
    assert sampling == catalog.QWEN_CODER.pair_settings["chat_sampling"] and sampling["repetition_penalty"] > 1

    def sampler(**extra):
        def sample(seed: int) -> tuple[str, ...]:
            done = api.chat.completions.create(
                model=SLUG, messages=messages, max_tokens=3, temperature=sampling["temperature"],
                top_p=sampling["top_p"], seed=seed, logprobs=True,
                extra_body={"top_k": sampling["top_k"], "repetition_penalty": sampling["repetition_penalty"], **extra})
            usage = done.usage.model_dump()
            assert usage["speculative_mode"] == ("off" if extra else "draft-exact-sampling"), usage
            # the own engine: alone with the draft; `speculative: false` four at once, alone or in its batch
            served = {Reason.OWN_ENGINE, Reason.OWN_BATCH} if extra else {Reason.OWN_ENGINE}
            assert served & set(usage["speculative_reason_codes"]), usage
            return tuple(entry.token for entry in done.choices[0].logprobs.content)
        return sample

    # Both paths draw the first token from the same seeded stream, so a seed block whose first uniforms are
    # off shows as a difference: 45.7% of each block's first uniforms fall below 0.45 (45% expected).
    # `speculative: false` four at once: in the batch its rows are the ones it computes alone (docs/exactness.md)
    reference = samples(sampler(speculative=False), range(20_000, 20_300), threads=4)
    tested = samples(sampler(), range(30_000, 30_300), threads=1)
    report = compare(tested, reference)
    print(f"{len(set(tested))} distinct answers with the draft, {len(set(reference))} without; {report}")
    assert not differs(report), report
    assert len(set(tested)) > 10, "a spread-out distribution, or the test would prove little"


# ------------------------------------------------------------------ greedy identity with the draft's head cut
def test_the_own_engines_draft_with_its_head_cut_speculates_and_changes_no_greedy_token(real_pair):
    """`make real-pair` writes the ids the draft's head keeps beside its IR (pairs/head_vocabulary.py), and the
    pair's own engine loads the draft with its head cut to them (engines/own/draft_head.py): its greedy answers at K=3
    are the main alone's, token for token, and the draft still speculates (most of its proposals accepted)."""
    spec = pair_spec(pair=real_pair, route=Route.OWN_SPECULATIVE)
    assert spec.draft_head_ids == str(FOLDER / "draft" / HEAD_IDS_FILE), spec
    engine = OwnEngine(replace(spec, drafters_judged=False))  # what the draft proposes, however busy the host
    head = engine.draft.head
    assert head is not None and len(head.ids) < head.width / 2
    tokens = steps = 0
    for request in REQUESTS:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": request}], add_generation_prompt=True)
        answers = {}
        for k in (0, 3):
            submitted = engine.submit(prompt=prompt, add_special_tokens=False,
                                      params=DecodingParams(max_new_tokens=48, speculation=Speculation(k=k) if k else None))
            answers[k] = []
            while not isinstance(event := submitted.next_step(timeout=300), Finished):
                answers[k].append(event.token_ids)
            assert event.finish_reason in {"length", "stop"}, event
        drafted = [token for step in answers[3] for token in step]
        assert drafted == [token for step in answers[0] for token in step], request
        tokens, steps = tokens + len(drafted), steps + len(answers[3])
    assert tokens / steps > 2.5, f"{tokens} tokens in {steps} steps of K=3"


# ------------------------------------------------------------------ greedy identity and the API, through the live stack
@pytest.mark.usefixtures("real_worker")
def test_greedy_answers_are_the_main_alones_with_and_without_the_draft(live_server_url, real_pair, key):
    """Their text and their tokens' log probabilities (to 1e-4), at several K."""
    api = client(live_server_url, key)
    for request in REQUESTS:
        messages = [{"role": "user", "content": request}]
        plain = api.chat.completions.create(model=SLUG, messages=messages, max_tokens=96, temperature=0,
                                            logprobs=True, extra_body={"speculative": False})
        for extra in ({}, {"num_assistant_tokens": 2}, {"num_assistant_tokens": 5}):
            drafted = api.chat.completions.create(model=SLUG, messages=messages, max_tokens=96, temperature=0,
                                                  logprobs=True, extra_body=extra)
            usage = drafted.usage.model_dump()
            assert usage["speculative_mode"] == "draft", usage
            assert drafted.choices[0].message.content == plain.choices[0].message.content, (request, extra)
            with_draft, without = drafted.choices[0].logprobs.content, plain.choices[0].logprobs.content
            assert [e.token for e in with_draft] == [e.token for e in without]
            assert [e.logprob for e in with_draft] == pytest.approx([e.logprob for e in without], abs=1e-4)
    assert usage["accepted_tokens"] > 0


CHUNKS = """def chunks(items, size):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch"""
VOWELS = """def count_vowels(word):
    count = 0
    for letter in word:
        if letter in 'aeiou':
            count =+ 1
    return count"""
SHIPPING = """function shippingCost(order) {
  let cost = 0;
  if (order.items.length > 0) {
    if (order.total < 50) {
      cost = 5;
    } else {
      cost = 0;
    }
  }
  return cost;
}"""
EDITS = [f"Add a docstring and type hints to this function; keep its code as it is.\n\n```python\n{CHUNKS}\n```",
         f"Fix the bug: the function should count the vowels in a word.\n\n```python\n{VOWELS}\n```",
         f"Rewrite this function with early returns instead of nested ifs.\n\n```javascript\n{SHIPPING}\n```"]


@pytest.mark.usefixtures("real_worker")
def test_code_edits_copied_by_the_prompt_lookup_are_the_main_alones(live_server_url, real_pair, key):
    """Answers that copy the prompt's function: the own engine's prompt lookup proposes those runs (no draft
    inference there), the draft the rest; the answer is the main alone's, token for token and in its log
    probabilities. Each drafter's share is printed (`-s`)."""
    api = client(live_server_url, key)
    for request in EDITS:
        messages = [{"role": "user", "content": request}]
        plain, chained = (api.chat.completions.create(model=SLUG, messages=messages, max_tokens=160, temperature=0,
                                                      logprobs=True, extra_body=extra)
                          for extra in ({"speculative": False}, {}))
        assert chained.choices[0].message.content == plain.choices[0].message.content, request
        with_lookup, without = chained.choices[0].logprobs.content, plain.choices[0].logprobs.content
        assert [e.logprob for e in with_lookup] == pytest.approx([e.logprob for e in without], abs=1e-4)
        usage = chained.usage.model_dump()
        assert (usage["speculative_mode"], usage["speculative_route"]) == ("draft", "own-speculative"), usage
        assert 0 < usage["ngram_accepted_tokens"] <= usage["ngram_draft_tokens"] < usage["draft_tokens"], usage
        print(f"\nn-gram lookup {usage['ngram_accepted_tokens']} of {usage['ngram_draft_tokens']} kept in "
              f"{usage['ngram_draft_steps']} steps; draft {usage['accepted_tokens'] - usage['ngram_accepted_tokens']} of "
              f"{usage['draft_tokens'] - usage['ngram_draft_tokens']}; {usage['completion_tokens']} tokens in "
              f"{usage['main_steps']} main steps")


SNIPPET = {"type": "object", "additionalProperties": False, "required": ["name", "language", "lines", "tags"],
           "properties": {"name": {"type": "string", "maxLength": 40}, "language": {"type": "string", "maxLength": 20},
                          "lines": {"type": "integer", "minimum": 1},
                          "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 20}}}}
TASKS = ["reverses a string in Python", "counts words in Rust", "finds duplicate emails in SQL",
         "backs up a folder in bash", "debounces a JavaScript callback", "answers an HTTP health check in Go",
         "parses a CSV file in Python", "merges two sorted lists in C", "retries a failed request in TypeScript",
         "computes a SHA-256 digest in Java", "flattens a nested list in Python", "reads environment variables in Go",
         "validates an email address in PHP", "sorts a map by value in Kotlin", "tails a log file in bash",
         "caches a function's results in Python", "walks a directory tree in Rust", "paginates a SQL query",
         "throttles events in JavaScript", "converts Celsius to Fahrenheit in Swift"]


@pytest.mark.usefixtures("real_worker")
def test_answers_held_to_a_json_schema_are_valid_and_the_main_alones(live_server_url, real_pair, key):
    """Speculation stays exact under a grammar: the main's tokens are masked alike with and without the draft.
    Left to the pair, one stream runs on its own engine, which masks the draft too (K=3); sampled answers
    under the schema speculate there as well (the distribution under a grammar: tests/test_sampling_distribution.py)."""
    import json

    import jsonschema_rs

    api = client(live_server_url, key)
    response_format = {"type": "json_schema", "json_schema": {"name": "snippet", "schema": SNIPPET, "strict": True}}
    accepted = drafted_tokens = 0
    for number, task in enumerate(TASKS[:8]):  # eight of them: the tier's time, not the grammar's cases, grew
        messages = [{"role": "user", "content": f"Describe, as JSON, a snippet that {task}."}]
        drafted, alone = (api.chat.completions.create(model=SLUG, messages=messages, max_tokens=160, temperature=0,
                                                      response_format=response_format, extra_body=extra)
                          for extra in ({}, {"speculative": False}))
        text = drafted.choices[0].message.content
        assert jsonschema_rs.is_valid(SNIPPET, json.loads(text)), text
        assert text == alone.choices[0].message.content, task
        usage = drafted.usage.model_dump()
        assert (usage["speculative_mode"], usage["speculative_k"]) == ("draft", 3), usage
        assert Reason.OWN_CONSTRAINED in usage["speculative_reason_codes"], usage
        accepted, drafted_tokens = accepted + usage["accepted_tokens"], drafted_tokens + usage["draft_tokens"]
        if number < 3:
            sampled = api.chat.completions.create(model=SLUG, messages=messages, max_tokens=160, temperature=0.8,
                                                  seed=number, response_format=response_format)
            assert jsonschema_rs.is_valid(SNIPPET, json.loads(sampled.choices[0].message.content)), sampled
            assert sampled.usage.model_dump()["speculative_mode"] == "draft-exact-sampling"
    print(f"\nunder the schema: {accepted} of {drafted_tokens} drafted tokens accepted "
          f"({accepted / drafted_tokens:.0%})")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a time zone.",
    "parameters": {"type": "object", "required": ["zone"], "properties": {"zone": {"type": "string"}}}}}


@pytest.mark.usefixtures("real_worker")
def test_a_tool_call_round_trip_with_the_official_client(live_server_url, real_pair, key):
    """The model chooses to call (tool_choice auto), the call comes back in OpenAI's shape, the tool's
    result goes back and the model answers from it; a forced call is the same with and without the draft,
    streamed or not; a text answer beside tools streams as it is written."""
    import json

    api = client(live_server_url, key)
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    first = api.chat.completions.create(model=SLUG, messages=messages, tools=[WEATHER, CLOCK], max_tokens=128)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and "paris" in json.loads(call.function.arguments)["city"].lower()
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "sunny"}'}]
    # tool_choice none: the answer, from the result (this 1.5B coder model, offered the tools again, calls again)
    second = api.chat.completions.create(model=SLUG, messages=messages, tools=[WEATHER, CLOCK], tool_choice="none",
                                         max_tokens=128)
    assert second.choices[0].finish_reason == "stop" and "18" in second.choices[0].message.content

    forced = {"model": SLUG, "messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
              "tools": [WEATHER, CLOCK], "tool_choice": "required", "max_tokens": 128}
    drafted = api.chat.completions.create(**forced, extra_body={"num_assistant_tokens": 3}).choices[0].message.tool_calls[0]
    alone = api.chat.completions.create(**forced, extra_body={"speculative": False}).choices[0].message.tool_calls[0]
    streamed = [call for chunk in api.chat.completions.create(**forced, stream=True) if chunk.choices
                for call in chunk.choices[0].delta.tool_calls or []]
    assert (drafted.function.name, drafted.function.arguments) == (alone.function.name, alone.function.arguments)
    assert [(c.function.name, c.function.arguments) for c in streamed] == [(drafted.function.name,
                                                                             drafted.function.arguments)]
    assert drafted.function.name == "get_time" and json.loads(drafted.function.arguments)["zone"]

    # Offered tools it has no use for, the model answers in text: streamed as it is written, not whole at the end.
    unrelated = {"model": SLUG, "messages": [{"role": "user", "content": "Write a Python one-liner that reverses "
                                              "a string s."}], "tools": [WEATHER, CLOCK], "max_tokens": 96}
    whole = api.chat.completions.create(**unrelated).choices[0]
    pieces = [chunk.choices[0].delta.content for chunk in api.chat.completions.create(**unrelated, stream=True)
              if chunk.choices and chunk.choices[0].delta.content]
    assert whole.finish_reason != "tool_calls" and whole.message.content == "".join(pieces)
    assert len(pieces) > 5, pieces


@pytest.mark.usefixtures("real_worker")
def test_the_official_client_chats_with_a_system_prompt_over_several_turns(live_server_url, real_pair, key):
    api = client(live_server_url, key)
    question = {"role": "user", "content": "Que fait le mot-clé « yield » en Python ? Réponds en une phrase."}
    system = ("You are a terse assistant for a team of French engineers: always answer in French, whatever the "
              "language of the question, in one or two sentences.")
    messages = [{"role": "system", "content": system}, question]
    chunks = list(api.chat.completions.create(model=SLUG, messages=messages, max_tokens=120, stream=True,
                                              stream_options={"include_usage": True}))
    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"], (finish, answer)  # it ended at <|im_end|>, on its own
    assert "<|im_end|>" not in answer and "\ufffd" not in answer
    assert re.search(r"[éèàçù]", answer), f"not French: {answer}"  # multi-byte characters streamed whole
    without_system = api.chat.completions.create(model=SLUG, messages=[question], max_tokens=1)
    # Sent in place of Qwen's default system prompt ("You are Qwen, created by Alibaba Cloud...", 10 tokens shorter)
    assert chunks[-1].usage.prompt_tokens > without_system.usage.prompt_tokens + 5

    messages += [{"role": "assistant", "content": answer},
                 {"role": "user", "content": "Now give a three-line Python example of it, only the code."}]
    follow_up = api.chat.completions.create(model=SLUG, messages=messages, max_tokens=120, temperature=0)
    assert "yield" in follow_up.choices[0].message.content, follow_up.choices[0].message.content
    assert follow_up.choices[0].finish_reason == "stop"


# ------------------------------------------------------------------ the chat in a browser
@pytest.mark.usefixtures("real_worker")
def test_the_chat_streams_a_coherent_answer_in_the_browser(live_server_url, real_pair, user, page):
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    page.select_option("#pair", SLUG)
    page.fill("#prompt", "Write a Python function is_even(n) that returns True for even numbers.")
    page.press("#prompt", "Control+Enter")
    answer = page.locator("article.message.assistant").last
    answer.wait_for()
    page.wait_for_function("() => document.querySelector('article.assistant:not(.streaming)')", timeout=300_000)
    generation = in_thread(Generation.objects.filter(source="chat").get)
    assert generation.status == Generation.Status.FINISHED, generation.error
    assert "def is_even" in generation.text and "%" in generation.text, generation.text
    assert "def is_even" in answer.inner_text()  # rendered, code block and all
    page.screenshot(path=str(SHOTS / "real-pair-1280.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: the answer's code scrolls inside its block
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().right <= 0")  # slid away
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth"), "the page scrolls sideways"
    page.screenshot(path=str(SHOTS / "real-pair-390.png"), full_page=True)


CODING_QUESTIONS = Path(settings.BASE_DIR) / "docs/benchmark/real-pair/coding-questions.json"
ANSWER_BAR_TOKENS = 1500


@pytest.mark.figures
@pytest.mark.timeout(3600)
@pytest.mark.usefixtures("real_worker")
def test_first_coding_questions_on_the_chats_defaults_end_by_themselves(live_server_url, real_pair, user, page):
    """A new user's first coding question, in a new chat on the chat's defaults (the pair's publisher's sampling: Qwen's
    T 0.7, top-p 0.8, top-k 20, repetition penalty 1.05), through the browser: each answer ends by itself (its end of
    answer, or the stop for repetition) before 1,500 tokens. The questions (coding-questions.json: the ISO 8601
    question that looped to the cap when the chat was greedy, and ten written for this test) tuned nothing. Each
    answer's length and end are printed (`-s`)."""
    log_in(page, live_server_url, "alice", "alice-password")
    ends = []
    for question in json.loads(CODING_QUESTIONS.read_text()):
        page.goto(f"{live_server_url}/")
        page.wait_for_selector("body[data-connected='1']")
        assert page.input_value("#pair") == SLUG
        page.fill("#prompt", question)
        page.press("#prompt", "Control+Enter")
        page.wait_for_function("() => document.querySelector('article.assistant:not(.streaming) .actions')",
                               timeout=900_000)
        generation = in_thread(lambda: Generation.objects.filter(source="chat").order_by("-created_at").first())
        decoding = generation.params["decoding"]
        assert (decoding["temperature"], decoding["repetition_penalty"]) == (0.7, 1.05), decoding
        ends.append((generation.completion_tokens, generation.finish_reason))
        print(f"{generation.completion_tokens:5d} tokens, {generation.finish_reason:9s} "
              f"{generation.duration_ms / 1000:6.1f} s  {question[:70]!r}")
    assert all(tokens < ANSWER_BAR_TOKENS and reason in ("stop", "repeating") for tokens, reason in ends), ends


SPEED_PROMPT = "Write a Python function that merges two sorted lists into one sorted list, with a docstring."


@pytest.fixture
def calibrated_here(real_pair, settings):
    """This host's calibration of the real pair, made in this process as `manage.py calibrate` makes it, on the K the
    pair ships with alone (the whole sweep took nine minutes of the tier; its own tests are tests/test_calibration.py)."""
    settings.CALIBRATION_KS, settings.CALIBRATION_STOPPED_KS = (real_pair.num_assistant_tokens,), ()
    call_command("calibrate", SLUG, stdout=io.StringIO(), stderr=io.StringIO())
    return real_pair


@pytest.mark.figures
@pytest.mark.usefixtures("real_worker")
def test_the_chat_states_the_speed_up_an_answer_had(live_server_url, calibrated_here, user, page):
    """The chat's "N times the main alone" line (the answer's tokens/s after its first
    token over the host's calibrated fastest main alone), printed (`-s`) beside what the same request measures with
    speculation off in the chat (issue 57 asks within 15%): a figure to read, not a timed bar, on a shared host."""
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    assert page.input_value("#pair") == SLUG
    rates = []
    for speculative in (True, False):
        page.goto(f"{live_server_url}/")
        page.wait_for_selector("body[data-connected='1']")
        if not speculative:
            page.click("#options-toggle")
            page.uncheck("#speculative")
        page.fill("#prompt", SPEED_PROMPT)
        page.press("#prompt", "Control+Enter")
        page.wait_for_function("() => document.querySelector('article.assistant:not(.streaming) .actions')",
                               timeout=600_000)
        meta = page.locator("article.assistant .meta").inner_text()
        generation = in_thread(lambda: Generation.objects.filter(source="chat").order_by("-created_at").first())
        rates.append((generation.completion_tokens - 1) / ((generation.duration_ms - generation.ttft_ms) / 1000))
        print(f"speculative={speculative}: {generation.completion_tokens} tokens, {rates[-1]:.2f} tok/s after the "
              f"first token, K={generation.speculative_k} ({generation.speculative_route}); {meta!r}")
        if speculative:
            stated = float(re.search(r"([\d.]+)× the main alone", meta)[1])
            page.screenshot(path=str(SHOTS / "real-pair-speed-1280.png"), full_page=True)
    measured = rates[0] / rates[1]
    print(f"stated {stated:.1f}x, measured {measured:.2f}x against the main alone asked the same")
    assert stated > 0


# ------------------------------------------------------------------ memory
def test_a_worker_holds_one_copy_of_the_main_at_every_load(stack_env, redis_client, live_server_url, real_pair, key,
                                                         tmp_path):
    """12 mixed requests (greedy with the draft, speculation off, sampled) two at a time, then 24 six at a time,
    through a worker of its own (beside the module's, which takes its share): one answer at a time speculates on
    the pair's own engine, more run on the main alone there, batched. One engine, one process, one copy of the
    weights throughout. Its PSS after each phase is printed (`-s`)."""
    from concurrent.futures import ThreadPoolExecutor

    from inference.benchmark.memory import ir_bytes, mapped_weight_bytes, tree_pss
    from inference.selectors import live_workers

    worker = Worker(stack_env, f"pair.{SLUG}", tmp_path / "worker.log")
    own = [{"slug": SLUG, "route": Route.OWN_SPECULATIVE}]
    try:
        name = worker.wait_ready(redis_client)
        api = client(live_server_url, key)
        kinds = [{}, {"extra_body": {"speculative": False}}, {"temperature": 0.8, "seed": 1}]

        def ask(index: int) -> tuple[str, str]:
            answer = api.chat.completions.create(model=SLUG, max_tokens=24, messages=[
                {"role": "user", "content": REQUESTS[index % len(REQUESTS)]}], **kinds[index % len(kinds)])
            usage = answer.usage.model_dump()
            return usage["speculative_mode"], usage["speculative_reason_codes"]

        def held() -> list[dict]:
            time.sleep(3)  # a heartbeat after the last answer
            return [{key: engine[key] for key in ("slug", "route")} for engine in next(
                beat["engines"] for beat in live_workers(client=redis_client) if beat["name"] == name)]

        plans = [ask(index) for index in range(3)]  # one of each kind alone: speculating, off, sampled exactly
        with ThreadPoolExecutor(2) as pool:
            plans += list(pool.map(ask, range(12)))
        assert held() == own
        two_at_a_time = tree_pss(worker.proc.pid)
        with ThreadPoolExecutor(6) as pool:
            plans += list(pool.map(ask, range(24)))
        assert {"draft", "off", "draft-exact-sampling"} <= {mode for mode, _ in plans}, plans
        assert any(Reason.OWN_BATCH in codes for _, codes in plans[15:]), plans
        assert held() == own
        six_at_a_time = tree_pss(worker.proc.pid)
        file_pages = mapped_weight_bytes(worker.proc.pid)
    finally:
        worker.stop()
    ir = ir_bytes(FOLDER / "main", FOLDER / "draft")
    two, six = sum(two_at_a_time.values()), sum(six_at_a_time.values())
    print(f"\nIR files {ir / 2**30:.2f} GiB; worker PSS after 12 mixed requests two at a time {two / 2**30:.2f} GiB "
          f"({two / ir:.2f}x); after 24 six at a time {six / 2**30:.2f} GiB ({six / ir:.2f}x)")
    assert len(two_at_a_time) == len(six_at_a_time) == 1, f"a step process holds another copy: {six_at_a_time}"
    # the engine answers from its own repacked weights: the IR file's pages it read are given back (engines/pages.py)
    assert file_pages < 0.02 * ir, f"{file_pages / 2**20:.0f} MiB of the IR weight files still held"
    # The 1.5x bar is a target, printed and reported (docs/benchmark.md), not asserted: targets live in benchmarks.


# ------------------------------------------------------------------ the own engine's rows, bitwise
@pytest.mark.parametrize("token_rows", [False, True], ids=["queries", "one-token sequences"])
@pytest.mark.parametrize("config", EXACT_ON_OWN_ENGINE)
def test_the_real_mains_rows_computed_two_ways_are_bitwise_equal(real_folder, config, token_rows):
    """The table of tests/test_engines_own_rows.py on the real main, in each precision the own engine compiles
    (f32 with dynamic quantization; bf16 with bf16 blocks where the CPU has bf16) and each arrangement of its rows: a
    verify's rows are the main alone's tokens', chunks the whole prompt's, a step shared the step alone's, rejected
    tokens leave no trace, cached blocks and a fork compute the cold prompt (docs/exactness.md#one-kernel-path)."""
    needs = CONFIGS[config].needs
    if needs and needs not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip(f"this CPU has no {needs}")
    engine = OwnEngine(PairSpec(slug=f"rows-{config}", main_dir=str(real_folder / "main"),
                                draft_dir=str(real_folder / "draft"), route=Route.OWN_SPECULATIVE,
                                pair_default=Route.OWN_SPECULATIVE, kv_pool_mb=256, **CONFIGS[config].fields))
    prompt = engine.tokenizer.encode(rows.CODE * 3).input_ids.data[0].tolist()[: 2 * engine.main.pool.block_tokens - 4]
    # its answers are told from its prompts' text by Qwen's opener (engines/own/answer_layout.py)
    assert engine.main.answer_opener == tuple(engine.tokenizer.encode(
        "<|im_start|>assistant\n", add_special_tokens=False).input_ids.data[0])
    rows.arrange(engine, token_rows=token_rows)
    for case, equal in rows.CASES:
        rows.check_rows(engine, *case(engine, prompt), equal=equal)


@pytest.mark.parametrize("config", EXACT_ON_OWN_ENGINE)
def test_held_out_answers_at_every_k_are_the_main_alones_in_each_precision_and_the_arrangement_served(real_folder,
                                                                                                      config):
    """The own engine as it loads in each precision it compiles, its rows in the arrangement its check picks on this
    host (engines/own/model_runner.py, `arranged`): the held-out chat-b requests, greedy, answer alike at K=4 and K=8
    and on the main alone. One-token sequences once parted 5 of these 8 answers (AMD EPYC Zen 4, bf16) while a check
    at one prompt length and one verify size passed them."""
    needs = CONFIGS[config].needs
    if needs and needs not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip(f"this CPU has no {needs}")
    engine = OwnEngine(PairSpec(slug=f"served-{config}", main_dir=str(real_folder / "main"),
                                draft_dir=str(real_folder / "draft"), route=Route.OWN_SPECULATIVE,
                                pair_default=Route.OWN_SPECULATIVE, kv_pool_mb=256, prefix_caching=False,
                                drafters_judged=False, **CONFIGS[config].fields))
    held_out = json.loads((Path(settings.BASE_DIR) / "docs/benchmark/real-pair/chat-b.json").read_text())
    parted = []
    for number, request in enumerate(held_out):
        prompt = engine.tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True)
        answers = {}
        for k in (0, 4, 8):
            submitted = engine.submit(prompt=prompt, add_special_tokens=False, params=DecodingParams(
                max_new_tokens=64, ignore_eos=True, speculation=Speculation(k=k) if k else None))
            answers[k] = []
            while not isinstance(event := submitted.next_step(timeout=300), Finished):
                answers[k] += event.token_ids
            assert event.finish_reason == "length", event
        parted += [f"request {number} at K={k}" for k in (4, 8) if answers[k] != answers[0]]
    assert not parted, f"{parted} ({engine.main.runner.steady})"
