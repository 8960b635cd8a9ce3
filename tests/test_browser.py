"""A person in a real browser (Debian's headless Chromium, driven by Playwright): logs in, sends a
prompt, watches tokens arrive and the metrics line appear, colours the answer by speculative step,
then stops a long answer."""

import re

import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker"),
              pytest.mark.database_agnostic]


def test_chat_in_a_browser(demo_pair, user, live_server_url, page, tmp_path):  # Django fixtures before the browser loop
    page.goto(f"{live_server_url}/")
    assert "/accounts/login/" in page.url  # the chat needs a login
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "alice-password")
    page.click("button[type=submit]")
    page.wait_for_selector("body[data-connected='1']")
    assert page.locator("#pair").input_value() == "demo-code"

    # Record how long the answer's text is each time the page changes while it is still streaming.
    page.evaluate("""() => {
        window.streamedLengths = [];
        new MutationObserver(() => {
            const answer = document.querySelector('article.assistant');
            if (answer && answer.classList.contains('streaming'))
                window.streamedLengths.push(answer.querySelector('.body').textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")
    page.fill("#prompt", "def quicksort(numbers):")
    page.fill("#max-tokens", "300")
    page.click("#send")
    answer = page.locator("article.message.assistant").first
    page.wait_for_function("() => document.querySelector('article.assistant:not(.streaming)')")
    lengths = {n for n in page.evaluate("window.streamedLengths") if n}
    assert len(lengths) >= 2, "the text should grow while the answer streams"
    assert answer.locator(".body").inner_text().strip()
    meta = answer.locator(".meta")  # in words, two short lines; the why and the figures in full a tap away
    assert re.search(r"first token [\d.]+ m?s · [\d.]+ tokens/s · \d+ tokens", meta.inner_text())
    assert "% of guesses kept" in meta.inner_text() and "K=" in meta.inner_text()
    assert_details(meta, "draft model guesses the next words", "tok/s after the first token", "tokens/step",
                   "Why: ", "speculation: draft")
    page.screenshot(path="/tmp/shots-chatux/speed-line-details.png")
    assert "/c/" in page.url  # the conversation is kept, and listed in the sidebar after a reload
    page.click("#options-toggle")  # the finer settings wait behind "Options"
    page.check("#show-steps")
    assert answer.locator(".body.steps .main.step-start").count() >= 2  # coloured and marked by step
    assert answer.locator(".body.steps .code-block code.hljs").count() == 1  # still rendered, highlighted
    page.screenshot(path="/tmp/shots-chatux/steps-demo.png")

    # the pair writes the chat's title after its first answer: the list and the heading say it, and keep it
    page.wait_for_function("() => document.getElementById('conversation-title').textContent !== 'def quicksort(numbers):'")
    title = page.locator("#conversation-title").inner_text()
    assert page.locator("#conversations a.current").inner_text() == title and page.title() == f"{title} · SpecChat"
    page.reload()
    assert page.locator("#conversations a").first.inner_text() == title
    page.click("text=+ New chat")  # a fresh conversation: the history would change the answer
    page.wait_for_selector("body[data-connected='1']")
    page.fill("#max-tokens", "500")
    page.click("#options-toggle")
    page.uncheck("#speculative")  # the main alone: slower, so there is time to press Stop
    # The demo main's nonsense may end early in one of the host's computations of it (near-ties): up to three
    # prompts, until one is still being written when Stop is pressed.
    for attempt, prompt in enumerate(("class Stack:\n    def __init__(self):", "import os\n\ndef walk(root):",
                                      "def parse(line):")):
        page.fill("#prompt", prompt)
        page.press("#prompt", "Control+Enter")  # sends; Enter alone is a new line of code
        second = page.locator("article.message.assistant").nth(attempt)
        second.locator(".meta").filter(has_text="writing").wait_for()
        if page.locator("#stop").is_visible():
            page.locator("#stop").click()
            break
        page.wait_for_function("() => !document.querySelector('article.assistant.streaming')")
    second.locator(".meta").filter(has_text="stopped").wait_for()
    assert "draft off, as asked" in second.locator(".meta").inner_text()
    assert_details(second.locator(".meta"), "Why: speculative: false was asked")
    assert not page.locator("#send").is_disabled()


def assert_details(meta, *words: str) -> None:
    """The answer's details: hidden until a tap (a phone has no hover), then saying each of `words`."""
    details = meta.locator("details.more")
    assert details.locator("p").is_hidden()
    details.locator("summary").click()
    for said in words:
        assert said in details.inner_text(), (said, details.inner_text())
