"""Model output is attacker-influenced (prompt injection): in a real browser (Debian's Chromium),
an answer full of hostile HTML must not restyle the page, load anything, replace the composer or
change what the next Send sends, whether it is a kept answer or one arriving as streamed deltas.
And the site's pages carry a Content-Security-Policy that forbids inline script and remote loads.
No worker runs: the hostile text is written where real answers are (the Generation record, the
answer's Redis stream) and daphne serves the page."""

import http.server
import json
import threading

import pytest

from inference import transport
from inference.models import Generation
from tests.conftest import log_in
from tests.test_site_security import finished_generation, running_generation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]

RECORD_CSP_VIOLATIONS = """
window.cspViolations = [];
document.addEventListener('securitypolicyviolation',
    (e) => window.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


class Listener:
    """A local web server that records every request it gets: the attacker's end of a leak."""

    def __init__(self):
        self.paths: list[str] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                listener.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def leak():
    listener = Listener()
    yield listener
    listener.server.shutdown()


def hostile_answer(port: int) -> str:
    url = f"http://127.0.0.1:{port}"
    return (
        "Here is the function you asked for.\n\n"
        "<style>body { background: red !important; }</style>\n"
        f'<img src="{url}/img"> <img srcset="{url}/srcset 2x"> <link rel="stylesheet" href="{url}/css">\n'
        '<input id="prompt" value="the attacker\'s text">\n'
        '<textarea id="prompt" name="prompt">the attacker\'s text</textarea>\n'
        f'<form action="{url}/form" method="post"><button id="send">Send</button></form>\n'
        '<a href="javascript:document.body.dataset.owned=1">click me</a> '
        '<a href="https://docs.python.org/3/">the docs</a>\n'
        f'<svg><image href="{url}/svg"></image></svg> <math><mi>x</mi></math>\n'
        f'<iframe src="{url}/frame"></iframe> <object data="{url}/object"></object> <embed src="{url}/embed">\n'
        f'<div class="app" id="messages" style="position:fixed;inset:0;background:url({url}/bg)">cover</div>\n'
        f'<table background="{url}/table"><tr><td onclick="alert(1)">cell</td></tr></table>\n\n'
        f"![an image]({url}/markdown-image)\n\n"
        # The page's own code-block chrome and highlighting, forged: they must come out as plain text.
        '<div class="code-block"><div class="code-tools"><button class="copy-code">forged copy</button></div></div>'
        '<pre title="python"><code class="hljs"><span class="hljs-keyword">forged span</span></code></pre>\n\n'
        "```python\ndef f():\n    return 1\n```\n\n"
        "end of answer"
    )


PAGE_STATE = """() => {
    const bodies = [...document.querySelectorAll('article.assistant .body')];
    const inside = (selector) => bodies.reduce((n, b) => n + b.querySelectorAll(selector).length, 0);
    return {
        background: getComputedStyle(document.body).backgroundColor,
        prompts: [...document.querySelectorAll('#prompt')]
            .map((e) => e.tagName + (e.closest('#composer') ? ' in composer' : '')),
        messagesBoxes: document.querySelectorAll('#messages').length,
        // The renderer's own chrome around each code block (made after sanitising, from text) is not the model's.
        forbidden: bodies.reduce((n, b) => n + [...b.querySelectorAll(
            'style, img, link, input, textarea, select, form, button, svg, math, iframe, object, embed, '
            + '[style], [id], [class], [name], [src], [srcset], [background], [onclick]')].filter((e) => !(
                e.matches('.code-block, .code-block > .code-tools, .code-tools > span.code-language, '
                          + '.code-tools > button.copy-code.link, .code-block > pre > code.hljs')
                || (e.matches('code.hljs span[class^="hljs-"]') && !e.matches('[id], [style], [name]')))).length, 0),
        chrome: inside('.code-tools'),
        forged: [...document.querySelectorAll('article.assistant .body [class]')]
            .filter((e) => e.textContent.includes('forged') && !e.matches('.code-block, code.hljs')).length,
        links: [...document.querySelectorAll('article.assistant .body a')].map((a) => [a.getAttribute('href'), a.rel]),
        text: bodies.map((b) => b.textContent).join(''),
        code: inside('pre code'),
        highlighted: inside('code.hljs span[class^="hljs-"]'),
        owned: document.body.dataset.owned || null,
        violations: window.cspViolations,
    };
}"""


def assert_unharmed(page, *, background: str, leak: Listener) -> None:
    page.wait_for_timeout(500)  # time for any image or style load to be asked for
    state = page.evaluate(PAGE_STATE)
    # The answer itself is shown; the HTML it wrote as text (the forged code block too): one code block.
    assert "end of answer" in state["text"] and state["code"] == 1, state
    assert '<img src="http://127.0.0.1:' in state["text"], state
    assert state["chrome"] == state["code"] and state["highlighted"] > 0, state  # one copy button per block
    assert state["forged"] == 0 and "forged copy" in state["text"], state
    assert state["background"] == background, state
    assert state["prompts"] == ["TEXTAREA in composer"] and state["messagesBoxes"] == 1, state
    assert state["forbidden"] == 0, state
    assert state["links"] and all(href is None or href.startswith(("https:", "http:", "mailto:"))
                                  for href, _ in state["links"]), state
    assert all(rel == "noopener noreferrer nofollow" for href, rel in state["links"] if href), state
    assert state["owned"] is None
    assert leak.paths == []
    assert_no_policy_violation(page, state["violations"])


def assert_no_policy_violation(page, violations: list[str]) -> None:
    """The answer's HTML met no parser of the page: the policy never had to block anything of it, not
    even in a document DOMPurify parses (Chromium reports there what the page's policy forbids)."""
    assert violations == [], violations
    assert page.csp_console == [], page.csp_console


def assert_send_sends_the_users_own_text(page) -> None:
    sent = []
    # A Python function, not the bound builtin: Playwright sets an attribute on its handlers.
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(payload)))  # noqa: PLW0108
    page.reload()  # so the frames of this page's socket are seen
    page.wait_for_selector("body[data-connected='1']")
    page.locator("#composer textarea").fill("my own question")
    page.locator("#composer button[type=submit]").click()
    for _ in range(100):  # the frame is seen by this process a moment after the page sent it
        if any('"send"' in frame for frame in sent):
            break
        page.wait_for_timeout(50)
    sends = [json.loads(frame) for frame in sent if '"send"' in frame]
    assert [s["text"] for s in sends] == ["my own question"]


def open_chat(page, live_server_url: str) -> str:
    """Logs alice in on a fresh chat page, recording what its policy blocks (page.csp_console: Chromium's
    console lines about it); the page's background colour, untouched."""
    page.add_init_script(RECORD_CSP_VIOLATIONS)
    page.csp_console = []
    page.on("console", lambda message: page.csp_console.append(message.text)
            if "Content Security Policy" in message.text else None)
    log_in(page, live_server_url, "alice", "alice-password")
    page.wait_for_selector("body[data-connected='1']")
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


# The database is written before the browser starts: Playwright's sync API runs an event loop in
# this thread, where Django refuses synchronous queries.
@pytest.fixture
def chat_pair(demo_pair):
    """The demo pair as a chat pair: its answers are rendered as Markdown, the path where the answer's
    HTML is parsed (a completion pair's answers are shown as the text of one code block)."""
    demo_pair.completes_text = False
    demo_pair.save(update_fields=["completes_text"])
    return demo_pair


@pytest.fixture
def kept_hostile_answer(chat_pair, user, leak) -> Generation:
    return finished_generation(pair=chat_pair, user=user, text=hostile_answer(leak.port))


@pytest.fixture
def answer_being_written(chat_pair, user) -> Generation:
    from chatsite.chat.models import Conversation, Message

    generation = running_generation(pair=chat_pair, user=user)
    conversation = Conversation.objects.create(user=user, pair=chat_pair, title="def f():")
    asked = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="def f():")
    Message.objects.create(conversation=conversation, parent=asked, role=Message.Role.ASSISTANT,
                           generation=generation)
    return generation


@pytest.fixture
def superuser(transactional_db, django_user_model):
    return django_user_model.objects.create_superuser(username="root", password="root-password")


def test_hostile_kept_answer_changes_nothing(kept_hostile_answer, live_server_url, page, leak):
    background = open_chat(page, live_server_url)
    page.goto(f"{live_server_url}/c/{kept_hostile_answer.message.conversation_id}/")
    page.wait_for_selector("body[data-connected='1']")
    assert_unharmed(page, background=background, leak=leak)
    assert_send_sends_the_users_own_text(page)
    assert_unharmed(page, background=background, leak=leak)


def test_hostile_streamed_answer_changes_nothing(answer_being_written, live_server_url, page, leak):
    generation = answer_being_written
    background = open_chat(page, live_server_url)
    page.goto(f"{live_server_url}/c/{generation.message.conversation_id}/")
    page.wait_for_selector("body[data-connected='1']")

    text = hostile_answer(leak.port)
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]  # tags cut across tokens, as a model writes them
    writer = transport.StreamWriter(transport.sync_client(), generation.id)
    writer.send({"type": "start", "prompt_tokens": 4, "worker": "worker@host:1234"})
    for start in range(0, len(pieces), 20):
        writer.send({"type": "delta", "steps": [["", piece] for piece in pieces[start:start + 20]]})
    page.wait_for_function("() => document.querySelector('article.assistant .body').textContent.includes('end of')")
    assert page.locator("article.assistant.streaming").count() == 1  # still streaming: the delta path rendered it
    assert_unharmed(page, background=background, leak=leak)

    writer.send({"type": "done", "finish_reason": "stop", "prompt_tokens": 4, "text": text, "completion_tokens": 90,
                 "main_steps": 90})
    page.wait_for_selector("article.assistant:not(.streaming)")
    assert_unharmed(page, background=background, leak=leak)
    assert_send_sends_the_users_own_text(page)  # after a reload: the kept answer rendered anew
    page.wait_for_selector("article.assistant:not(.streaming) .code-block")
    assert_no_policy_violation(page, page.evaluate("window.cspViolations"))


def test_pages_forbid_inline_script_and_remote_loads(user, live_server_url, page, leak):
    page.add_init_script(RECORD_CSP_VIOLATIONS)
    login = page.goto(f"{live_server_url}/accounts/login/")
    log_in(page, live_server_url, "alice", "alice-password")
    chat = page.goto(f"{live_server_url}/")
    page.wait_for_selector("body[data-connected='1']")  # the page's own script runs under the policy
    for response in (login, chat):
        policy = response.headers.get("content-security-policy", "")
        for directive in ("default-src 'self'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:",
                          "frame-ancestors 'none'", "form-action 'self'", "base-uri 'none'"):
            assert directive in policy, (directive, policy)
        assert "connect-src 'self' ws://127.0.0.1:" in policy, policy
    assert page.evaluate("window.cspViolations") == []

    # Whatever got past a sanitiser: an inline script, an inline style, a remote image.
    page.evaluate(f"""() => {{
        const script = document.createElement('script');
        script.textContent = 'window.inlineRan = true';
        document.head.appendChild(script);
        const style = document.createElement('style');
        style.textContent = 'body {{ background: red !important; }}';
        document.head.appendChild(style);
        document.body.insertAdjacentHTML('beforeend', '<img src="http://127.0.0.1:{leak.port}/csp">');
    }}""")
    page.wait_for_timeout(500)
    assert page.evaluate("window.inlineRan") is None
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != "rgb(255, 0, 0)"
    assert leak.paths == []
    violations = page.evaluate("window.cspViolations")
    assert any(v.startswith("script-src") for v in violations) and any(v.startswith("img-src") for v in violations)


def test_admin_works_under_its_policy(demo_pair, superuser, live_server_url, page):
    page.add_init_script(RECORD_CSP_VIOLATIONS)
    page.goto(f"{live_server_url}/admin/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "root-password")
    page.click("input[type=submit]")
    response = page.goto(f"{live_server_url}/admin/inference/modelpair/add/")
    assert "script-src 'self'" in response.headers.get("content-security-policy", "")
    page.locator("#id_name").press_sequentially("My Pair")
    assert page.locator("#id_slug").input_value() == "my-pair"  # the admin's own scripts run
    page.goto(f"{live_server_url}/admin/inference/modelpair/")
    page.locator("#action-toggle").check()
    assert page.locator("input.action-select:checked").count() == 1
    assert [v for v in page.evaluate("window.cspViolations") if v.startswith("script")] == []
