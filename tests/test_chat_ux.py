"""The chat as a person uses it, in Debian's headless Chromium on the real stack (daphne, a Celery worker
running the demo pair): one answer at a time in a conversation, whatever is clicked or typed meanwhile and
in however many tabs; errors in the page's own words; the keyboard."""

import itertools
import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from chatsite.chat.models import Conversation
from inference.models import Generation, ModelPair
from tests.conftest import in_thread, log_in
from tests.test_chat_ui import CODE, LONG_LINE, kept_answer
from tests.test_site_security import finished_generation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]
ONE_AT_A_TIME = "An answer is still being written: wait for it to finish, or stop it (Esc)."
UNSERVED = ("Nobody serves this pair right now, so it cannot answer: ask an admin to start a worker for it, "
            "or pick another pair.")


def wait_for_answer(page, count: int) -> None:
    """Until the page shows `count` answers, the last one ended."""
    page.wait_for_function(f"""() => document.querySelectorAll('article.assistant').length === {count}
        && !document.querySelector('article.assistant.streaming')""")


@contextmanager
def paused(worker):
    """The worker frozen (SIGSTOP) for a few seconds, well within its heartbeat's lifetime: its answer stays
    in flight, however fast the machine writes it otherwise."""
    os.kill(worker.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)


def test_a_conversation_writes_one_answer_at_a_time(demo_pair, user, celery_worker, live_server_url, page):
    sent = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))))
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    page.fill("#prompt", "def quicksort(numbers):")
    page.fill("#max-tokens", "8")
    page.click("#send")
    wait_for_answer(page, 1)
    assert page.evaluate("document.activeElement.id") == "prompt"  # typing goes on after a click on Send
    # Another tab of hers on the same conversation, open before the next answer starts.
    other_tab = page.context.browser.new_context(storage_state=page.context.storage_state()).new_page()
    other_tab.goto(page.url)
    other_tab.wait_for_selector("body[data-connected='1']")

    page.fill("#prompt", "class Stack:")
    page.fill("#max-tokens", "500")
    send = page.locator("#send").bounding_box()
    with paused(celery_worker):  # the answer stays in flight however soon the model would end it (EOS)
        page.press("#prompt", "Control+Enter")
        page.wait_for_selector("article.assistant.streaming")
        assert page.locator("#stop").is_visible() and page.locator("#send").is_hidden()  # Send became Stop
        stop = page.locator("#stop").bounding_box()
        assert abs(stop["x"] + stop["width"] - send["x"] - send["width"]) < 2 and abs(stop["y"] - send["y"]) < 2
        page.fill("#prompt", "def merge(a, b):")
        page.press("#prompt", "Control+Enter")  # the shortcut, with Send hidden
        page.locator("#status", has_text=ONE_AT_A_TIME).wait_for()
        assert page.input_value("#prompt") == "def merge(a, b):"  # kept to send later
        other_tab.fill("#prompt", "x = 1")
        other_tab.click("#send")  # a tab that has not seen the answer start: the server refuses
        other_tab.locator("#status", has_text="An answer is still being written in this chat").wait_for()
        assert other_tab.input_value("#prompt") == "x = 1"
        assert other_tab.locator("article.message").count() == 2  # nothing added
        page.keyboard.press("Escape")  # stops the answer (at the worker's next step, unless it ended first)
    other_tab.context.close()
    page.wait_for_function("() => !document.querySelector('article.assistant.streaming')")
    assert [frame["action"] for frame in sent if frame["action"] in ("send", "stop")] == ["send", "send", "stop"]
    page.press("#prompt", "Control+Enter")  # now the waiting message goes
    wait_for_answer(page, 3)
    assert page.locator("article.user .body").all_inner_texts() == [
        "def quicksort(numbers):", "class Stack:", "def merge(a, b):"]

    def answers():
        conversation = Conversation.objects.get()
        return list(Generation.objects.filter(message__conversation=conversation).order_by("created_at"))

    generations = in_thread(answers)
    assert len(generations) == 3
    assert generations[0].text.strip()
    for before, after in itertools.pairwise(generations):
        assert after.created_at >= before.finished_at  # never two answers written at once
        assert before.text.strip() in after.prompt  # each answer's prompt holds the last (one stopped early: its part)


@pytest.fixture
def unserved_pair(demo_pair):
    ModelPair.objects.create(name="Main alone", slug="main-alone", main_dir=demo_pair.main_dir)  # no draft
    return ModelPair.objects.create(name="Unserved", slug="unserved", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, num_assistant_tokens=3)


def choose_pair(page, slug: str) -> None:
    """As on a page loaded while a worker served the pair, which nobody serves since."""
    page.evaluate(f"""() => {{ const select = document.getElementById('pair');
        select.querySelector('option[value="{slug}"]').disabled = false; select.value = '{slug}'; }}""")


@pytest.fixture
def kept_chat(demo_pair, user) -> Conversation:
    return finished_generation(pair=demo_pair, user=user).message.conversation


def status_after_send(page, text: str = "def f():") -> str:
    page.locator("#status").evaluate("(el) => { el.textContent = ''; }")
    page.fill("#prompt", text)
    page.click("#send")
    page.wait_for_function("() => document.getElementById('status').textContent !== ''")
    status = page.inner_text("#status")
    assert "`" not in status and "_" not in status, status  # no command line, no API field name
    return status


def test_errors_a_chat_user_causes_are_told_in_the_pages_words(unserved_pair, kept_chat, user, live_server_url,
                                                                 page):
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{kept_chat.id}/")
    page.wait_for_selector("body[data-connected='1']")
    unserved = page.locator("#pair option[value=unserved]")
    assert unserved.is_disabled() and unserved.inner_text() == "Unserved — nobody serves it"  # greyed out, saying why
    assert "ask an admin to start a worker" in unserved.get_attribute("title")

    page.click("#options-toggle")
    page.fill("#k", "3")
    page.fill("#threshold", "0.5")
    assert status_after_send(page).startswith("Options: set K or Threshold, not both")
    page.fill("#threshold", "")

    # The server's own checks, told in the page's words: K for a pair without a draft (checked before
    # whether anybody serves it), then a pair nobody serves.
    choose_pair(page, "main-alone")
    assert status_after_send(page) == ("Options → K: a whole number from 1 to 32, for a pair with a draft model; "
                                       "leave it empty to let the server choose.")
    page.fill("#k", "")
    choose_pair(page, "unserved")
    assert status_after_send(page) == UNSERVED
    assert page.input_value("#prompt") == "def f():"  # nothing is lost
    page.select_option("#pair", "demo-code")

    in_thread(lambda: Conversation.objects.filter(id=kept_chat.id).delete())  # deleted in another tab
    assert status_after_send(page, "my question") == (
        "That chat no longer exists (deleted in another tab?): this is a new one.")
    assert page.input_value("#prompt") == "my question" and page.locator("article.message").count() == 0
    assert page.url == f"{live_server_url}/"
    page.goto(f"{live_server_url}/c/{kept_chat.id}/")  # its address, kept: a new chat, not an error page
    page.wait_for_selector("body[data-connected='1']")
    assert page.inner_text("#status") == "That chat no longer exists (it was deleted): this is a new one."
    assert page.url == f"{live_server_url}/" and page.inner_text("#conversation-title") == "New chat"


SHOTS = Path("/tmp/shots-chatux")
FORMATTED = ("## Sorting\n\nA **stable** sort keeps equal items in order; `sorted()` is one.\n\n"
             "| name | stable | cost | memory needed | implementation |\n| --- | --- | --- | --- | --- |\n"
             "| merge sort | yes<br>always | n log n | n | recursive |\n| quicksort | no | n log n | log n | in place |\n\n"
             "1. Split the list.\n2. Sort each half.\n3. Merge them.\n\n> Timsort is what Python uses.\n\n"
             f"```python\n{CODE}\n```\n\nAnd a long line: {LONG_LINE[:600]}\n\nThe end.")

GEOMETRY = """() => {
    const box = (el) => { const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, height: r.height}; };
    const root = document.scrollingElement;
    const actions = [...document.querySelectorAll('article.assistant .actions')].at(-1);
    return {
        sideways: root.scrollWidth > root.clientWidth, height: innerHeight,
        topbar: box(document.querySelector('.topbar')), messages: box(document.getElementById('messages')),
        actions: actions ? box(actions) : null, composer: box(document.getElementById('composer')),
    };
}"""


@pytest.fixture
def formatted_chat(demo_pair, user) -> Conversation:
    demo_pair.completes_text = False  # answers in Markdown
    demo_pair.description = ("The demo pair: a tiny main model and a tinier draft, trained by the project. Its answers "
                             "are nonsense by construction; it shows the mechanics and the speed of speculative "
                             "decoding, not answer quality.")
    demo_pair.save()
    return kept_answer(pair=demo_pair, user=user, title="Sorting lists in Python, stably and quickly, explained",
                       question="How do I sort a list stably?", text=FORMATTED)


@pytest.mark.parametrize("width, height", [(1280, 800), (390, 844)])
def test_the_conversation_keeps_the_room(formatted_chat, live_server_url, page, width, height):
    """At a laptop's and a phone's width, light and dark: no sideways scroll, the header on one line at a
    phone's width, at least half the height shows messages with a panel open, and the last answer's
    Copy and Regenerate are in view above the composer."""
    SHOTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": width, "height": height})
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{formatted_chat.id}/")
    page.wait_for_selector("article.assistant .code-block")
    assert page.locator("article.assistant td br").count() == 1  # a model's line break in a table cell
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.locator("article.assistant table").first.screenshot(path=str(SHOTS / f"table-{width}-{scheme}.png"))
        page.evaluate("document.getElementById('messages').scrollTop = 1e9")
        geometry = page.evaluate(GEOMETRY)
        page.screenshot(path=str(SHOTS / f"chat-{width}-{scheme}.png"))
        assert not geometry["sideways"], geometry
        tables = page.evaluate("""() => [...document.querySelectorAll('article.assistant table')].map((t) => ({
            scrolls: t.scrollWidth > t.clientWidth, sign: getComputedStyle(t).backgroundImage}))""")
        assert all("radial-gradient" in t["sign"] for t in tables if t["scrolls"]), tables  # a shadow at the cut
        assert width >= 768 or any(t["scrolls"] for t in tables), tables  # the five columns scroll on a phone
        actions = geometry["actions"]
        assert geometry["messages"]["top"] <= actions["top"] and actions["bottom"] <= geometry["messages"]["bottom"]
        if width < 768:
            assert geometry["topbar"]["height"] < 64, geometry  # one line (it wrapped to three)
            page.click("#actions-toggle")  # the chat's actions, behind a button
            page.locator("#delete").wait_for()
            page.screenshot(path=str(SHOTS / f"menu-{width}-{scheme}.png"))
            assert not page.evaluate(GEOMETRY)["sideways"]
            page.keyboard.press("Escape")
            assert page.locator("#delete").is_hidden()
        for panel, opener in (("options", "#options-toggle"), ("system", "#system-toggle")):
            if panel == "system" and width < 768:  # a phone's top bar keeps the chat's actions behind a button
                page.click("#actions-toggle")
            page.click(opener)
            # The list keeps its end in view once the opened panel has been laid out (a frame or two later).
            page.wait_for_function(f"() => {{ const g = ({GEOMETRY})(); return g.actions.bottom <= g.messages.bottom; }}",
                                   timeout=5000)
            geometry = page.evaluate(GEOMETRY)
            page.screenshot(path=str(SHOTS / f"{panel}-{width}-{scheme}.png"))
            assert geometry["messages"]["height"] >= geometry["height"] / 2, (panel, geometry)
            assert geometry["actions"]["bottom"] <= geometry["messages"]["bottom"], (panel, geometry)
            assert not geometry["sideways"], geometry
            if panel == "system" and width < 768:
                page.click("#actions-toggle")
            page.click(opener)
    page.goto(f"{live_server_url}/")  # a new chat
    page.wait_for_selector("body[data-connected='1']")
    page.screenshot(path=str(SHOTS / f"empty-{width}.png"))
    assert "draft model" in page.inner_text("#empty")  # what speculative decoding is, in two sentences


@pytest.mark.parametrize("width, height", [(1280, 800), (390, 844)])
def test_a_reader_scrolled_up_mid_stream_stays_put_and_can_jump_to_the_latest(formatted_chat, celery_worker,
                                                                               live_server_url, page, width, height):
    """The list follows a streaming answer only while its reader is at the end: one who scrolled up to read keeps
    their place as tokens arrive (it was pulled back within a second), and "Latest" takes them back."""
    page.set_viewport_size({"width": width, "height": height})
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{formatted_chat.id}/")
    page.wait_for_selector("body[data-connected='1']")
    page.fill("#prompt", "And how do I sort it in reverse?")
    page.fill("#max-tokens", "120")
    with paused(celery_worker):  # no token before the reader has scrolled up
        page.click("#send")
        page.wait_for_selector("article.assistant.streaming")
        assert page.locator("#jump-latest").is_hidden()  # at the end, following
        end = page.evaluate("document.getElementById('messages').scrollTop")
        page.mouse.move(width / 2, height / 3)
        page.mouse.wheel(0, -400)  # as a reader scrolls, not a script (smoothly, over a few frames)
        page.wait_for_function(f"() => document.getElementById('messages').scrollTop <= {end - 400}")
        kept = page.evaluate("document.getElementById('messages').scrollTop")
    wait_for_answer(page, 2)
    assert page.locator("article.assistant").last.inner_text().strip()  # the answer came while they read
    assert page.evaluate("document.getElementById('messages').scrollTop") == kept
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"jump-latest-{width}.png"))
    page.click("#jump-latest")
    page.wait_for_function("""() => { const m = document.getElementById('messages');
        return m.scrollHeight - m.scrollTop - m.clientHeight < 40; }""")
    assert page.locator("#jump-latest").is_hidden()


STEP_COVERAGE = """() => {
    const body = document.querySelector('article.assistant .body');
    const shown = [...body.querySelectorAll('*')].filter((e) => !e.closest('.code-tools'))
        .flatMap((e) => [...e.childNodes]).filter((n) => n.nodeType === Node.TEXT_NODE && n.data.trim());
    const marked = shown.filter((n) => n.parentElement.matches('.draft, .main'));
    const length = (nodes) => nodes.reduce((sum, n) => sum + n.data.trim().length, 0);
    return {steps: body.classList.contains('steps'), strong: body.querySelectorAll('strong').length,
            tables: body.querySelectorAll('table').length, highlighted: body.querySelectorAll('code.hljs span').length,
            starts: body.querySelectorAll('.step-start').length, text: body.textContent,
            covered: length(marked) / length(shown)};
}"""


@pytest.fixture
def stepped_answer(formatted_chat) -> Generation:
    """The formatted answer as written in steps of two 5-character tokens, cut across the Markdown syntax."""
    generation = formatted_chat.messages.get(role="assistant").generation
    pieces = [FORMATTED[i:i + 5] for i in range(0, len(FORMATTED), 5)]
    generation.steps = [[pieces[i], pieces[i + 1] if i + 1 < len(pieces) else ""] for i in range(0, len(pieces), 2)]
    generation.save(update_fields=["steps"])
    return generation


def test_show_steps_keeps_the_rendering_and_marks_each_step(stepped_answer, live_server_url, page):
    generation = stepped_answer
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{generation.message.conversation_id}/")
    page.wait_for_selector("article.assistant .code-block")
    page.click("#options-toggle")
    page.check("#show-steps")
    state = page.evaluate(STEP_COVERAGE)
    assert state["steps"] and state["strong"] == 1 and state["tables"] == 1 and state["highlighted"] > 100, state
    assert "```" not in state["text"] and "**" not in state["text"], state  # still rendered, not raw Markdown
    assert state["starts"] >= len(generation.steps) * 0.9 and state["covered"] > 0.95, state
    page.screenshot(path=str(SHOTS / "steps-markdown.png"))


@pytest.fixture
def two_chats(formatted_chat, demo_pair, user) -> Conversation:
    kept_answer(pair=demo_pair, user=user, title="Parsing dates", question="How do I parse a date?", text="Use `strptime`.")
    return formatted_chat


def test_keyboard_search_and_kept_settings(two_chats, live_server_url, page):
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{two_chats.id}/")
    page.wait_for_selector("body[data-connected='1']")
    assert page.get_attribute("#messages", "aria-live") is None  # a screen reader reads the status, not every chunk
    assert page.get_attribute("#status", "role") == "status"

    page.fill("#search", "timsort python")  # words of the answer, not of the title
    page.locator("#conversations li:visible a", has_text="Sorting lists").wait_for()
    assert page.locator("#conversations li:visible").count() == 1
    page.fill("#search", "")

    page.click("#rename")
    page.keyboard.press("Escape")
    assert page.locator("#rename-form").is_hidden() and page.locator("#conversation-title").is_visible()
    page.click("article.user button.edit")
    page.keyboard.press("Escape")
    assert page.locator("article.user .edit-form").count() == 0
    assert page.inner_text("article.user .body") == "How do I sort a list stably?"

    page.fill("#max-tokens", "77")
    page.click("#options-toggle")
    page.fill("#temperature", "0.7")
    page.reload()
    page.wait_for_selector("body[data-connected='1']")
    assert page.input_value("#max-tokens") == "77" and page.input_value("#temperature") == "0.7"  # kept for the pair

    page.goto(f"{live_server_url}/")
    page.wait_for_selector("body[data-connected='1']")
    page.click("#system-toggle")
    page.fill("#system-prompt", "Answer briefly.")
    page.click("#save-system")
    page.locator("#system-state", has_text="Kept for this chat's first message.").wait_for()
    page.fill("#prompt", "def f():")
    page.fill("#max-tokens", "8")
    page.click("#send")
    wait_for_answer(page, 1)
    assert page.inner_text("#system-state") == ""  # the chat exists: the note is done with
