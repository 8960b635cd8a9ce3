"""The chat as people expect it from its peers (issue 57), in Debian's headless Chromium on the real stack (daphne, a
Celery worker running the demo pair) at a laptop's and a phone's width: a new chat opens on the real pair and then on
the pair last used, names fit the picker, an answer runs to its end, Continue follows every cut or stopped answer, the
speed line counts from the first token and compares with the main model alone on this host, tables keep words whole,
Regenerate gives another answer, and the Markdown export stays valid whatever an answer holds.
Screenshots go to /tmp/shots-57."""

import json
import re
import time
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from chatsite.chat.models import Conversation, Message
from chatsite.chat.services import TITLE_CHARS, first_message_title
from inference.models import Generation, HostCalibration, JobStatus, ModelPair
from inference.serving.host import this_host
from inference.transport import live_workers
from tests.conftest import in_thread, log_in
from tests.test_chat import PROMPT, connect, events_until_end, send_message

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker"),
              pytest.mark.database_agnostic]
SHOTS = Path("/tmp/shots-57")
SIZES = [(1280, 800), (390, 844)]


def wait_for_answers(page, count: int) -> None:
    page.wait_for_function(f"""() => document.querySelectorAll('article.assistant').length === {count}
        && !document.querySelector('article.assistant.streaming')""")


def shot(page, name: str) -> None:
    """In the light and the dark scheme."""
    SHOTS.mkdir(exist_ok=True)
    page.wait_for_timeout(300)  # a resized page's sidebar slides away first
    page.screenshot(path=str(SHOTS / f"{name}.png"))
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=str(SHOTS / f"{name}-dark.png"))
    page.emulate_media(color_scheme="light")
    assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]  # no sideways scroll


def sent_frames(page) -> list[dict]:
    frames: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: frames.append(json.loads(payload))))
    return frames


def kept_turns(*, pair, user, turns: list[tuple[str, str, str]], title: str = "Kept") -> Conversation:
    """A conversation as the worker leaves it: (question, answer, finish reason) per turn."""
    conversation = Conversation.objects.create(user=user, pair=pair, title=title)
    parent = None
    for question, text, finish_reason in turns:
        status = Generation.Status.STOPPED if finish_reason == "stopped" else Generation.Status.FINISHED
        generation = Generation.objects.create(
            pair=pair, user=user, prompt=question, status=status, text=text, steps=[["", text]],
            finish_reason=finish_reason, completion_tokens=12, main_steps=12, tokens_per_s=10.0, ttft_ms=50.0,
            duration_ms=1200.0)
        asked = Message.objects.create(conversation=conversation, parent=parent, role=Message.Role.USER,
                                       content=question)
        parent = Message.objects.create(conversation=conversation, parent=asked, role=Message.Role.ASSISTANT,
                                        generation=generation)
    return conversation


# ------------------------------------------------------------------ 1. the pair a chat opens on, its name
FITS = """() => {
    const select = document.getElementById('pair');
    const style = getComputedStyle(select);
    const context = document.createElement('canvas').getContext('2d');
    context.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    const widest = Math.max(...[...select.options].map((o) => context.measureText(o.textContent).width));
    return {widest, width: select.getBoundingClientRect().width, right: select.getBoundingClientRect().right,
            page: document.documentElement.clientWidth};
}"""


@pytest.fixture
def installed_pair(demo_pair) -> ModelPair:
    """A real pair as `make real-pair` leaves it beside the demo: the chat's default (tests/test_real_pair.py checks
    that install_pair takes the mark from the demo). It runs on the demo's files, on a queue the test worker serves."""
    demo_pair.refresh_from_db()
    assert demo_pair.is_default and "not a real model" in demo_pair.name  # the demo says what it is
    return ModelPair.objects.create(name="Qwen2.5-Coder 1.5B", slug="demo-plain", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, num_assistant_tokens=3, is_default=True,
                                    description="A real instruction-tuned code model (a stand-in here).")


def test_a_new_chat_opens_on_the_real_pair_then_on_the_pair_last_used(installed_pair, user, live_server_url, page):
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    assert page.input_value("#pair") == "demo-plain"  # a new user's first chat: on the real pair
    names = page.locator("#pair option").all_inner_texts()
    assert names == ["Qwen2.5-Coder 1.5B", "Demo (tiny, not a real model)"], names  # no "(draft model)"
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        fits = page.evaluate(FITS)
        assert fits["widest"] + 20 <= fits["width"] and fits["right"] <= fits["page"], (width, fits)  # names whole
        shot(page, f"new-chat-real-{width}")

    page.select_option("#pair", "demo-code")
    assert "nonsense" in page.inner_text("#empty-description")  # the demo says what it is
    page.fill("#prompt", PROMPT)
    page.fill("#max-tokens", "8")
    page.click("#send")
    wait_for_answers(page, 1)
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{live_server_url}/")  # a new chat, on any browser of hers: the pair she last used
        page.wait_for_selector("body[data-connected='1']")
        assert page.input_value("#pair") == "demo-code"
        fits = page.evaluate(FITS)
        assert fits["widest"] + 20 <= fits["width"] and fits["right"] <= fits["page"], (width, fits)
        shot(page, f"new-chat-last-used-{width}")


# ------------------------------------------------------------------ 2. answers not cut; Continue
def test_an_answer_is_not_cut_short_by_default(demo_pair, user, live_server_url, page):
    frames = sent_frames(page)
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    assert page.input_value("#max-tokens") == ""  # nothing to set for an answer to finish
    page.fill("#prompt", PROMPT)
    page.click("#send")
    wait_for_answers(page, 1)
    assert "max_tokens" not in frames[-1]["settings"]
    # A browser that kept the old defaults beside another setting (any change kept them all) reads them as the new.
    page.evaluate("""localStorage.setItem('specchat:settings:demo-code',
        JSON.stringify({'max-tokens': '128', temperature: '0', k: '3', threshold: '', speculative: true}))""")
    page.reload()
    page.wait_for_selector("body[data-connected='1']")
    assert [page.input_value(f"#{name}") for name in ("max-tokens", "temperature", "k")] == ["", "", "3"]
    page.fill("#max-tokens", "128")  # set by the user from now on: kept
    page.reload()
    page.wait_for_selector("body[data-connected='1']")
    assert page.input_value("#max-tokens") == "128"
    generation = in_thread(Generation.objects.filter(source="chat").get)
    # Up to the pair's cap, within what the context leaves after the prompt (the demo's context is 1,024 tokens).
    assert generation.params["decoding"]["max_new_tokens"] == min(demo_pair.max_new_tokens_cap,
                                                                 1024 - generation.prompt_tokens)
    assert generation.completion_tokens > 128 or generation.finish_reason == "stop"


CUT_CODE = "Here it is:\n\n```python\ndef merge(a, b):\n    out = []\n    while a and b:"


@pytest.fixture
def cut_and_stopped(demo_pair, user) -> Conversation:
    return kept_turns(pair=demo_pair, user=user, turns=[
        (PROMPT, CUT_CODE, "length"), ("def merge(a, b):", "    result = [", "stopped"), ("class Stack:", "", "stopped")])


def test_continue_follows_every_cut_or_stopped_answer(cut_and_stopped, live_server_url, page):
    conversation = cut_and_stopped
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{conversation.id}/")
    page.wait_for_selector("body[data-connected='1']")
    answers = page.locator("article.assistant")
    wait_for_answers(page, 3)
    continues = [answers.nth(i).locator("button.continue") for i in range(3)]
    assert continues[0].is_visible() and continues[1].is_visible()  # cut (not the last answer), stopped
    assert continues[2].count() == 0  # stopped before its first word: nothing to write on from
    assert answers.nth(2).locator("button.regenerate").is_visible()

    continues[1].click()  # an earlier answer: a new version of its turn, going on from its text
    page.wait_for_function("() => document.querySelectorAll('article.assistant').length === 2 "
                           "&& !document.querySelector('article.assistant.streaming')")
    assert answers.nth(1).locator(".versions span").inner_text() == "2/2"
    newest = in_thread(lambda: Message.objects.select_related("generation").order_by("-id").first())
    assert newest.earlier_text == "    result = [" and newest.text.startswith("    result = [")
    assert newest.generation.prompt.endswith("    result = [")  # written on from the stopped answer's last character
    assert newest.text in answers.nth(1).locator(".body").inner_text()
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        shot(page, f"continued-earlier-{width}")
    answers.nth(1).get_by_role("button", name="Previous version").click()  # the old turns, all still there
    wait_for_answers(page, 3)


# ------------------------------------------------------------------ 3. the speed line
MAIN_ALONE_TOKENS_PER_S = 50.0


@pytest.fixture
def calibrated_demo(demo_pair, redis_client, celery_worker) -> ModelPair:
    """The demo pair with this host's calibration as a worker records it: the fastest main alone's tokens/s, which
    the admin's verdict quotes; ready once the worker's heartbeat carries the K it plans from it (the chat shows the
    plan as of the page's load)."""
    host = this_host(demo_pair.runs_on)  # the test worker's
    HostCalibration.objects.create(pair=demo_pair, host=host.signature, host_facts=host.facts,
                                   status=JobStatus.FINISHED, results={
        "configs": {"f32": {"label": "f32", "tokens_per_s": MAIN_ALONE_TOKENS_PER_S, "streams": 4,
                            "tokens_per_s_streams": 120.0}},
        "fastest": "f32", "own_config": "f32", "best_k": {"1": 2},
        "ks": {"2": {"tokens_per_s": 60.0, "identical": 4, "answers": 4}}})
    deadline = time.monotonic() + 30
    while not _every_worker_planned(demo_pair, live_workers(client=redis_client)):
        assert time.monotonic() < deadline, "no heartbeat planned from the new calibration"
        time.sleep(0.2)
    return demo_pair


def _every_worker_planned(pair: ModelPair, workers: list[dict]) -> bool:
    """Every worker of the pair's heartbeat carries a K planned from the calibration: the page takes the first it
    finds, and a worker that had not planned again yet said None (it once failed the test below so)."""
    serving = [beat for beat in workers if pair.queue in beat.get("queues", ())]
    return bool(serving) and all(isinstance(beat["lone_k"].get(pair.slug), int) for beat in serving)


def test_the_speed_line_counts_from_the_first_token_and_weighs_the_main_alone(calibrated_demo, user, live_server_url,
                                                                            page):
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    k = re.fullmatch(r"auto \((\d+)\)", page.get_attribute("#k", "placeholder"))  # what the server plans here
    assert k, page.get_attribute("#k", "placeholder")
    page.fill("#prompt", PROMPT)
    page.fill("#max-tokens", "48")
    page.click("#send")
    wait_for_answers(page, 1)
    meta = page.locator("article.assistant .meta").inner_text()
    generation = in_thread(Generation.objects.filter(source="chat").get)
    writing = (generation.completion_tokens - 1) / ((generation.duration_ms - generation.ttft_ms) / 1000)
    wait = re.search(r"first token ([\d.]+) (ms|s) · ([\d.]+) tokens/s", meta)
    assert wait, meta  # the wait as its own figure, the rate after it
    assert abs(float(wait[3]) - writing) <= 0.1
    assert abs(float(wait[1]) * (1 if wait[2] == "ms" else 1000) - generation.ttft_ms) <= 100
    faster = re.search(r"([\d.]+)× the main alone", meta)
    assert faster, meta
    assert abs(float(faster[1]) - writing / MAIN_ALONE_TOKENS_PER_S) <= 0.05 + 0.15 * writing / MAIN_ALONE_TOKENS_PER_S
    assert "guesses kept" in meta.split("\n")[1]
    assert len(meta.split("\n")) == 2, meta  # two short lines, the rest behind "Details"
    assert generation.speculative_k == int(k[1])  # as the K option said it would be
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        shot(page, f"speed-line-{width}")

    page.goto(f"{live_server_url}/")  # the main model alone: no speed-up claimed of it
    page.wait_for_selector("body[data-connected='1']")
    page.click("#options-toggle")
    page.uncheck("#speculative")
    page.fill("#prompt", PROMPT)
    page.click("#send")
    wait_for_answers(page, 1)
    assert "×" not in page.locator("article.assistant .meta").inner_text()
    alone = in_thread(lambda: Generation.objects.filter(source="chat").order_by("-created_at").first())
    alone_rate = (alone.completion_tokens - 1) / ((alone.duration_ms - alone.ttft_ms) / 1000)

    page.goto(f"{live_server_url}/")  # weighed now against the faster of the calibration and the main alone's answers
    page.wait_for_selector("body[data-connected='1']")
    page.click("#options-toggle")
    page.check("#speculative")
    page.fill("#prompt", PROMPT)
    page.click("#send")
    wait_for_answers(page, 1)
    meta = page.locator("article.assistant .meta").inner_text()
    again = in_thread(lambda: Generation.objects.filter(source="chat").order_by("-created_at").first())
    writing = (again.completion_tokens - 1) / ((again.duration_ms - again.ttft_ms) / 1000)
    reference = max(MAIN_ALONE_TOKENS_PER_S, alone_rate) if alone.completion_tokens >= 16 else MAIN_ALONE_TOKENS_PER_S
    faster = re.search(r"([\d.]+)× the main alone", meta)
    assert faster and abs(float(faster[1]) - writing / reference) <= 0.05 + 0.15 * writing / reference, (meta, reference)


# ------------------------------------------------------------------ 5. tables
TABLE = ("| Name | Mutable | Ordered | Typical use | Lookup cost | Example literal |\n"
         "|---|---|---|---|---|---|\n"
         "| list | Mutable | Ordered | sequences that grow | linear search | [1, 2, 3] |\n"
         "| tuple | Immutable | Ordered | fixed records | linear search | (1, 2) |\n"
         "| dictionary | Mutable | Insertion-ordered | mapping keys to values | constant on average | {'a': 1} |\n")
WORDS_WHOLE = """() => {
    const table = document.querySelector('article.assistant table');
    const context = document.createElement('canvas').getContext('2d');
    const broken = [];
    for (const cell of table.querySelectorAll('th, td')) {
        const style = getComputedStyle(cell);
        context.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
        const room = cell.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
        for (const word of cell.textContent.split(/\\s+|(?<=-)/).filter(Boolean)) {  // a hyphen may end a line
            if (context.measureText(word).width > room + 0.5) broken.push(word);
        }
    }
    return {broken, scrolls: table.scrollWidth > table.clientWidth, wider: table.scrollWidth > table.parentElement.clientWidth};
}"""


@pytest.fixture
def table_answer(demo_pair, user) -> Conversation:
    demo_pair.completes_text = False  # an answer in Markdown
    demo_pair.save()
    return kept_turns(pair=demo_pair, user=user, turns=[("Compare Python's collections", TABLE, "stop")])


@pytest.mark.parametrize("width, height", SIZES)
def test_tables_keep_words_whole_and_scroll_sideways(table_answer, live_server_url, page, width, height):
    conversation = table_answer
    page.set_viewport_size({"width": width, "height": height})
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{conversation.id}/")
    page.wait_for_selector("article.assistant table")
    found = page.evaluate(WORDS_WHOLE)
    assert found["broken"] == [], found
    if width < 768:
        assert found["scrolls"], found  # wider than a phone's column: it scrolls, the page does not
    shot(page, f"table-{width}")


# ------------------------------------------------------------------ 6. the Markdown export
def test_the_markdown_export_closes_what_an_answer_left_open(demo_pair, user, client):
    conversation = kept_turns(pair=demo_pair, user=user, turns=[
        (PROMPT, CUT_CODE, "length"), ("And with tildes?", "~~~~\nx = 1\n~~~", "stopped"),
        ("And a fence in the info?", "``` py `x`\nnot a fence\n````\n```js\nlet a", "length"),
        ("Last", "Done.", "stop")])
    client.force_login(user)
    exported = client.get(f"/c/{conversation.id}/export.md").content.decode()
    tokens = MarkdownIt("commonmark").parse(exported)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"]
    assert headings == ["You", "Answer"] * 4, exported
    fences = [t.content for t in tokens if t.type == "fence"]
    assert "def merge(a, b):\n    out = []\n    while a and b:\n" in fences  # the cut code, shown as code


# ------------------------------------------------------------------ 4. Regenerate
def test_regenerate_gives_another_answer_and_keeps_a_continued_ones_length(demo_pair, user, live_server_url, page):
    frames = sent_frames(page)
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    page.fill("#prompt", PROMPT)
    page.fill("#max-tokens", "8")
    page.click("#send")
    wait_for_answers(page, 1)
    answer = page.locator("article.assistant")
    answer.locator("button.continue").click()  # 8 tokens more, as the same answer
    page.wait_for_function("() => !document.querySelector('article.assistant.streaming') "
                           "&& document.querySelectorAll('article.assistant button.continue, "
                           "article.assistant button.regenerate').length > 0")
    continued = in_thread(lambda: Message.objects.get(role=Message.Role.ASSISTANT).text)
    answer.locator("button.regenerate").click()
    page.wait_for_selector("article.assistant:not(.streaming) .versions")
    assert frames[-1]["action"] == "regenerate" and frames[-1]["settings"]["temperature"] == 0.7  # none was set
    again = in_thread(lambda: Generation.objects.filter(source="chat").order_by("-created_at").first())
    assert again.params["decoding"]["temperature"] == 0.7
    assert again.params["decoding"]["max_new_tokens"] >= 16  # the length both parts had, not the 8 asked now
    assert again.text != continued  # another answer, not the same one word for word

    page.click("#options-toggle")
    page.fill("#temperature", "0")  # the user's own temperature is kept
    answer.locator("button.regenerate").click()
    page.wait_for_function("() => document.querySelector('article.assistant .versions span')?.textContent === '3/3' "
                           "&& !document.querySelector('article.assistant.streaming')")
    assert frames[-1]["settings"]["temperature"] == 0


# ------------------------------------------------------------------ 7, 10. the options
OPTION_GEOMETRY = """() => {
    const box = (id) => document.getElementById(id).getBoundingClientRect();
    return {sendLeft: box('send').left, sendBelowPrompt: box('send').top - box('prompt').bottom,
            help: document.getElementById('option-help').textContent,
            helpShown: document.getElementById('option-help').getBoundingClientRect().height > 0};
}"""


@pytest.mark.parametrize("width, height", SIZES)
def test_options_say_what_they_do_on_a_tap_and_send_stays_put(demo_pair, user, live_server_url, page, width, height):
    page.set_viewport_size({"width": width, "height": height})
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    closed = page.evaluate(OPTION_GEOMETRY)
    page.click("#options-toggle")
    page.locator("#k").wait_for()
    opened = page.evaluate(OPTION_GEOMETRY)
    assert (opened["sendLeft"], opened["sendBelowPrompt"]) == (closed["sendLeft"], closed["sendBelowPrompt"])
    assert opened["helpShown"]
    page.click("#k")
    assert "guesses ahead" in page.evaluate(OPTION_GEOMETRY)["help"]  # said on a tap, not in a tooltip
    page.click("#temperature")
    assert "0.7 for Regenerate" in page.evaluate(OPTION_GEOMETRY)["help"]
    page.click("#speculative")
    assert "main model writes alone" in page.evaluate(OPTION_GEOMETRY)["help"]
    shot(page, f"options-{width}")


# ------------------------------------------------------------------ 8. long pastes
PASTE = "Why is this slow?\n```python\n" + "\n".join(f"total_{i} = sum(range({i}))  # step {i} of the loop"
                                                   for i in range(30)) + "\n```"  # the demo reads 1,024 tokens
FOLD = """() => { const user = document.querySelector('article.user');
    return {height: user.querySelector('.body').getBoundingClientRect().height,
            toggle: user.querySelector('button.show-all')?.textContent ?? null,
            title: document.querySelector('#conversations a.current, #conversations a')?.textContent ?? ''}; }"""


@pytest.mark.parametrize("width, height", SIZES)
def test_a_long_paste_is_folded_and_the_title_is_short(demo_pair, user, live_server_url, page, width, height):
    page.set_viewport_size({"width": width, "height": height})
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    page.fill("#prompt", PASTE)
    page.fill("#max-tokens", "4")
    page.click("#send")
    wait_for_answers(page, 1)
    for moment in ("sent", "reloaded"):
        folded = page.evaluate(FOLD)
        assert folded["toggle"] == "Show all (33 lines)" and folded["height"] < 320, (moment, folded)
        # a short title, not 80 characters of code: the question's line, until the pair has written one
        assert 0 < len(folded["title"]) <= TITLE_CHARS + 1 and "total_" not in folded["title"], (moment, folded)
        shot(page, f"paste-{moment}-{width}")
        page.reload()
        wait_for_answers(page, 1)
    page.click("article.user button.show-all")
    assert page.evaluate(FOLD)["height"] > 32 * 15  # all of it, on demand
    assert page.locator("article.user button.show-all").inner_text() == "Show less"
    sent = in_thread(lambda: Message.objects.get(role="user").content)
    assert first_message_title(sent) == "Why is this slow?"  # what the list says until the pair writes a title


async def test_a_title_is_cut_at_a_word(demo_pair, user):
    communicator = await connect(user)
    started = await send_message(communicator, max_tokens=2, text="Explain how the garbage collector of CPython "
                                 "finds reference cycles among container objects")
    assert started["title"] == "Explain how the garbage collector of CPython…", started  # the sidebar's, at once
    assert (await Conversation.objects.aget()).title == started["title"]
    await events_until_end(communicator, started["generation"])
    await communicator.disconnect()


PASTED_CODE = "Why does this fail?\n```python\ndef f(x):\n    return x +\n```\nThanks."


@pytest.fixture
def pasted_code(demo_pair, user) -> Conversation:
    demo_pair.completes_text = False  # a chat pair: a message is text, with code in it
    demo_pair.save()
    return kept_turns(pair=demo_pair, user=user, turns=[(PASTED_CODE, "It lacks an operand.", "stop")])


@pytest.mark.parametrize("width, height", SIZES)
def test_code_pasted_in_a_message_is_shown_as_code(pasted_code, live_server_url, page, width, height):
    page.set_viewport_size({"width": width, "height": height})
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{pasted_code.id}/")
    page.wait_for_selector("article.user .code-block code.hljs")
    message = page.locator("article.user")
    assert message.locator(".code-language").inner_text() == "python"
    assert message.locator("code").inner_text() == "def f(x):\n    return x +"
    assert "```" not in message.locator(".body").inner_text()
    assert message.locator(".body").inner_text().startswith("Why does this fail?")
    shot(page, f"pasted-code-{width}")
    message.locator("button.edit").click()
    assert page.input_value("#edit-text") == PASTED_CODE  # edited as typed, fences and all
