"""A long paste in the chat, in Chromium on real parts (daphne, a Celery worker, the own engine on the demo pair): the
answer's line says how far the prompt's reading got before the first token, not a blank wait, and the next turn reads
the conversation from the prefix cache."""

import pytest

from inference.models import Generation
from tests.conftest import in_thread, log_in
from tests.test_chat_ux import wait_for_answer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker"),
              pytest.mark.database_agnostic]

PASTE = "\n".join(f"def step_{n}(state, value):\n    state[{n}] = value * {n} + len(state)\n    return state"
                  for n in range(20))


@pytest.fixture
def own_engine_pair(demo_pair):
    """Lone answers on the own engine, as the real pair's catalogue sets (saved before the browser starts its loop)."""
    demo_pair.own_engine_streams = 1
    demo_pair.save()
    return demo_pair


def test_a_long_paste_says_how_far_its_reading_got_and_the_follow_up_reads_little(own_engine_pair, user,
                                                                                   live_server_url, page):
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    page.evaluate("""() => {
        window.metaSeen = [];
        new MutationObserver(() => document.querySelectorAll('article.assistant .meta').forEach(
            (meta) => window.metaSeen.push(meta.textContent))).observe(document.body, {subtree: true,
                                                                                   childList: true,
                                                                                   characterData: true});
    }""")
    page.fill("#prompt", f"Here is my file:\n{PASTE}\nWhat does step_3 return?")
    page.click("#options-toggle")
    page.fill("#max-tokens", "8")
    page.click("#send")
    wait_for_answer(page, 1)
    seen = page.evaluate("window.metaSeen")
    reading = [text for text in seen if text.startswith("Reading the prompt:")]
    assert reading and "%" in reading[-1] and "tokens" in reading[-1], seen[:20]
    assert not page.locator("article.assistant .meta").inner_text().startswith("Reading the prompt")

    page.fill("#prompt", "And step_4?")
    page.click("#send")
    wait_for_answer(page, 2)
    first, follow_up = in_thread(lambda: list(Generation.objects.filter(source="chat").order_by("created_at")))
    assert follow_up.cached_tokens >= (first.prompt_tokens - 1) // 64 * 64 > 0
