"""The chat page as a person uses it, in Debian's headless Chromium on the real stack (daphne, and a
Celery worker where an answer is written): long output never widens the page at a laptop's or a
phone's width, code is highlighted and copied, conversations are renamed, searched, given a system
prompt, exported, deleted, and the last message edited and sent again. Screenshots go to /tmp/shots."""

import json
from pathlib import Path

import pytest

from chatsite.chat import selectors
from chatsite.chat.models import Conversation, Message
from inference.models import Generation, ModelPair
from tests.conftest import in_thread, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]
SHOTS = Path("/tmp/shots")
LONG_LINE = "".join(f"{i:04d}" for i in range(500))  # 2,000 characters, no space to break at
CODE = "\n".join([f"def step_{i}(values):", f"    return [v * {i} for v in values if v > {i}]  # line {i}"][i % 2]
                 for i in range(99)) + "\nresult = " + " + ".join(f"step_{i}([1, 2, 3])[0]" for i in range(0, 98, 2))


def kept_answer(*, pair, user, title: str, question: str, text: str) -> Conversation:
    """A finished answer in a conversation of its own, as the worker leaves it."""
    generation = Generation.objects.create(
        pair=pair, user=user, prompt=question, status=Generation.Status.FINISHED, text=text, steps=[["", text]],
        finish_reason="stop", completion_tokens=1, main_steps=1, tokens_per_s=12.5, ttft_ms=40.0)
    conversation = Conversation.objects.create(user=user, pair=pair, title=title)
    asked = Message.objects.create(conversation=conversation, role=Message.Role.USER, content=question)
    Message.objects.create(conversation=conversation, parent=asked, role=Message.Role.ASSISTANT,
                           generation=generation)
    return conversation


@pytest.fixture
def chat_pair(demo_pair):
    """The demo pair as a chat pair (answers in Markdown), with a description."""
    demo_pair.completes_text = False
    demo_pair.description = "Answers in Markdown for this test."
    demo_pair.save()
    return demo_pair


@pytest.fixture
def long_conversation(chat_pair, user) -> Conversation:
    text = f"Here is one very long line:\n\n{LONG_LINE}\n\nand the code:\n\n```python\n{CODE}\n```\n\nThe end."
    return kept_answer(pair=chat_pair, user=user, title="Long output", question="Show me long output", text=text)


LAYOUT = """() => {
    const root = document.scrollingElement;
    const box = (id) => { const r = document.getElementById(id).getBoundingClientRect();
                          return [r.left, r.top, r.right, r.bottom]; };
    const pre = document.querySelector('article.assistant pre');
    return {
        scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, width: innerWidth, height: innerHeight,
        prompt: box('prompt'), send: box('send'), sidebar: box('sidebar'),
        preScrolls: pre.scrollWidth > pre.clientWidth,
        highlighted: document.querySelectorAll('article.assistant code.hljs span[class^="hljs-"]').length,
        keywords: document.querySelectorAll('article.assistant code.hljs .hljs-keyword').length,
    };
}"""


@pytest.mark.parametrize("width, height", [(1280, 800), (390, 844)])
def test_long_output_never_widens_the_page(long_conversation, live_server_url, page, width, height):
    SHOTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": width, "height": height})
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server_url)
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{long_conversation.id}/")
    page.wait_for_selector("body[data-connected='1']")
    page.wait_for_selector("article.assistant .code-block")
    layout = page.evaluate(LAYOUT)
    assert layout["scrollWidth"] <= layout["clientWidth"] == width, layout
    left, top, right, bottom = layout["prompt"]
    assert left >= 0 and top >= 0 and right <= width and bottom <= height, layout  # the composer in view
    assert layout["send"][2] <= width and layout["send"][3] <= height, layout
    assert layout["preScrolls"], "the code's long line scrolls inside its block"
    assert layout["highlighted"] > 100 and layout["keywords"] >= 50, layout
    page.screenshot(path=str(SHOTS / f"long-{width}.png"))
    page.locator("article.assistant pre").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / f"code-{width}.png"))

    copy = page.locator("article.assistant button.copy-code")
    copy.click()
    page.locator("article.assistant button.copy-code.copied", has_text="Copied").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == CODE
    answer_copy = page.locator("article.assistant button.copy-answer")
    answer_copy.click()
    page.locator("article.assistant button.copy-answer.copied").wait_for()
    assert page.evaluate("navigator.clipboard.readText()").endswith("```\n\nThe end.")

    if width < 768:  # the sidebar waits off screen behind a button
        assert layout["sidebar"][2] <= 0, layout
        page.click("#sidebar-toggle")
        page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().left >= 0")
        assert page.locator("#conversations a", has_text="Long output").is_visible()
        page.screenshot(path=str(SHOTS / f"sidebar-{width}.png"))
        page.click("#backdrop", position={"x": width - 20, "y": 300})
        page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().right <= 0")
    else:
        assert layout["sidebar"][0] == 0, layout
    page.emulate_media(color_scheme="dark")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(23, 23, 27)"
    assert page.evaluate("document.scrollingElement.scrollWidth <= document.scrollingElement.clientWidth")
    page.screenshot(path=str(SHOTS / f"dark-{width}.png"))


@pytest.fixture
def three_conversations(chat_pair, user) -> dict[str, Conversation]:
    chat_pair.slug = "nobody-serves-this"  # the session's worker, if an earlier test started it, serves demo-code
    chat_pair.save(update_fields=["slug"])
    return {title: kept_answer(pair=chat_pair, user=user, title=title, question=f"About {title}", text=f"**{title}**")
            for title in ("Sorting lists", "Parsing dates", "Sorting dicts")}


def test_conversations_are_renamed_searched_exported_and_deleted(three_conversations, user, live_server_url, page):
    conversation = three_conversations["Parsing dates"]
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{conversation.id}/")
    page.wait_for_selector("body[data-connected='1']")

    page.fill("#search", "sort")
    visible = page.locator("#conversations li:visible a")
    assert sorted(visible.all_inner_texts()) == ["Sorting dicts", "Sorting lists"]
    page.fill("#search", "nothing like it")
    assert page.locator("#no-match").is_visible()
    page.fill("#search", "")
    assert page.locator("#conversations li:visible").count() == 3

    page.click("#rename")
    page.fill("#rename-input", "  Dates,   parsed  ")
    page.click("#rename-form button[type=submit]")
    page.locator("#conversation-title", has_text="Dates, parsed").wait_for()
    assert page.locator("#conversations a.current").inner_text() == "Dates, parsed"
    assert page.title() == "Dates, parsed · SpecChat"

    page.click("#system-toggle")
    page.fill("#system-prompt", "Answer in French.")
    page.click("#save-system")
    page.locator("#system-state", has_text="Saved").wait_for()

    markdown = page.request.get(f"{live_server_url}/c/{conversation.id}/export.md")
    assert markdown.headers["content-disposition"] == 'attachment; filename="dates-parsed.md"'
    assert markdown.text().startswith("# Dates, parsed\n") and "Answer in French." in markdown.text()
    exported = json.loads(page.request.get(f"{live_server_url}/c/{conversation.id}/export.json").text())
    assert exported["system_prompt"] == "Answer in French."
    assert [m["content"] for m in exported["messages"]] == ["About Parsing dates", "**Parsing dates**"]

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete")
    page.wait_for_url(f"{live_server_url}/")
    assert sorted(page.locator("#conversations a").all_inner_texts()) == ["Sorting dicts", "Sorting lists"]
    assert page.locator("#empty-description").inner_text() == "Answers in Markdown for this test."
    assert page.locator("#empty-unavailable").is_visible()  # no worker serves it: what to do is said
    assert "ask an admin to start a worker" in page.locator("#empty-unavailable").inner_text()
    page.screenshot(path=str(SHOTS / "empty-1280.png"))

    titles = in_thread(lambda: set(Conversation.objects.filter(user=user).values_list("title", flat=True)))
    assert titles == {"Sorting dicts", "Sorting lists"}
    assert page.request.get(f"{live_server_url}/c/{conversation.id}/export.json").status == 404


@pytest.mark.usefixtures("celery_worker")
def test_system_prompt_edit_and_resend_and_the_last_answers_controls(demo_pair, user, live_server_url, page):
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    assert "continues Python code" in page.locator("#empty-description").inner_text()
    assert not page.locator("#empty-unavailable").is_visible()  # the worker serves it
    page.screenshot(path=str(SHOTS / "empty-390.png"))

    page.fill("#max-tokens", "1500")  # over the pair's cap of 512: said before anything is sent
    page.fill("#prompt", "def add(a, b):")
    page.click("#send")
    assert "Max tokens is at most 512 for this pair." in page.locator("#status").inner_text()
    assert page.locator("article.message").count() == 0

    page.click("#actions-toggle")  # a phone's top bar keeps the chat's actions behind a button
    page.click("#system-toggle")
    page.fill("#system-prompt", "Small helpers")
    page.fill("#max-tokens", "24")
    page.click("#send")
    page.wait_for_selector("article.assistant:not(.streaming) .actions")
    answer = page.locator("article.assistant").first
    assert answer.locator("code.hljs").inner_text().startswith("def add(a, b):")  # one block with the prompt
    assert answer.locator("code.hljs span[class^='hljs-']").count() > 0
    conversation = in_thread(lambda: Conversation.objects.get(user=user))
    assert conversation.system_prompt == "Small helpers"
    assert conversation.title == "def add(a, b):" or conversation.title_source == "model"  # the pair's, once written
    first_prompt = in_thread(lambda: Generation.objects.filter(source="chat").get().prompt)
    assert first_prompt.startswith("# Small helpers\n")  # the demo template's system line

    page.fill("#prompt", "def sub(a, b):")
    page.click("#send")
    page.wait_for_function("() => document.querySelectorAll('article.assistant:not(.streaming) .actions').length == 2")
    assert page.locator("button.regenerate:visible").count() == 1  # only under the last answer
    assert page.locator("button.edit:visible").count() == 2  # on every message sent
    page.screenshot(path=str(SHOTS / "completion-390.png"))

    page.locator("button.edit").last.click()
    page.fill("#edit-text", "def mul(a, b):")
    page.click("button.save-edit")
    page.wait_for_function("""() => [...document.querySelectorAll('article.assistant:not(.streaming) code.hljs')]
                                   .some((code) => code.textContent.startsWith('def mul(a, b):'))""")
    assert page.locator("article.assistant:not(.streaming) .actions").count() == 2
    last = page.locator("article.assistant").last
    assert last.locator("code.hljs").inner_text().startswith("def mul(a, b):")
    assert page.locator("article.user").all_inner_texts()[-1].startswith("def mul(a, b):")
    messages = in_thread(lambda: list(selectors.messages_of(conversation=conversation)))  # the path shown
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2].content == "def mul(a, b):" and messages[3].generation.status == "finished"
    assert messages[3].generation.prompt.startswith("# Small helpers\n")
    assert messages[3].generation.prompt.endswith("def mul(a, b):")

    page.reload()  # the same after a reload
    page.wait_for_selector("article.assistant:not(.streaming) .actions")
    assert page.locator("article.user").count() == 2
    assert page.locator("button.regenerate:visible").count() == 1
    assert page.locator("article.user").last.locator(".versions").inner_text().split() == ["‹", "2/2", "›"]


def test_default_pair_description_favicon_and_unserved_hint(demo_pair, user, client):
    ModelPair.objects.create(name="Aardvark", slug="aardvark", main_dir=demo_pair.main_dir,
                             draft_dir=demo_pair.draft_dir, num_assistant_tokens=3, description="Nobody serves it.")
    client.force_login(user)
    data = client.get("/").context["page_data"]
    assert data["pair"] == "demo-code"  # the admin's default, though another pair sorts first
    by_slug = {p["slug"]: p for p in data["pairs"]}
    assert by_slug["aardvark"]["served"] is False and by_slug["aardvark"]["description"] == "Nobody serves it."
    ModelPair.objects.filter(slug="aardvark").update(is_default=False)
    aardvark = ModelPair.objects.get(slug="aardvark")
    aardvark.is_default = True
    aardvark.save()
    assert list(ModelPair.objects.filter(is_default=True).values_list("slug", flat=True)) == ["aardvark"]
    assert client.get("/").context["page_data"]["pair"] == "aardvark"

    favicon = client.get("/favicon.ico")
    assert favicon.status_code == 301 and favicon["Location"].endswith("favicon.svg")
    assert b'rel="icon"' in client.get("/").content


ACCESSIBILITY = """() => {
    const visible = (e) => e.offsetParent !== null || getComputedStyle(e).position === 'fixed';
    const name = (e) => (e.getAttribute('aria-label') || [...(e.labels || [])].map((l) => l.textContent).join('')
                         || (e.tagName === 'BUTTON' ? e.textContent : '') || '').trim();
    const unlabelled = [...document.querySelectorAll('input:not([type=hidden]), select, textarea, button')]
        .filter((e) => !name(e)).map((e) => e.outerHTML.slice(0, 80));
    const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
    const luminance = ([r, g, b]) => [r, g, b].map((v) => { v /= 255;
        return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
        .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
    const background = (e) => { for (; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
                                   if (c.length < 4 || c[3] > 0) return c; } return [255, 255, 255]; };
    const low = [];
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
        const e = walker.currentNode.parentElement;
        if (!walker.currentNode.textContent.trim() || !visible(e) || e.closest('[disabled], .visually-hidden, script'))
            continue;
        const [a, b] = [luminance(rgb(getComputedStyle(e).color)), luminance(background(e))];
        const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        if (ratio < 4.5) low.push(`${ratio.toFixed(2)} ${e.tagName}.${e.className} "${e.textContent.slice(0, 30)}"`);
    }
    return {unlabelled, low};
}"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_controls_are_labelled_and_text_contrasts(long_conversation, live_server_url, page, scheme):
    """An axe-style check of what a screen reader and a weak eye meet: every control named, every
    text at 4.5:1 against its background (WCAG AA), in both colour schemes."""
    page.emulate_media(color_scheme=scheme)
    log_in(page, live_server_url, "alice", "alice-password", next_path=f"/c/{long_conversation.id}/")
    page.wait_for_selector("article.assistant .code-block")
    page.click("#system-toggle")
    page.click("#options-toggle")
    assert page.evaluate(ACCESSIBILITY) == {"unlabelled": [], "low": []}
