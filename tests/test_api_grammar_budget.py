"""A grammar that takes the library forever to compile is refused with a 400 naming its field, and grammar
requests from other keys are not held behind it (engines/grammar/checks.py): through the live API, on the
demo pair, with the web process's own checker processes."""

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from inference.api.auth import set_new_key
from inference.engines.grammar.checks import MAX_GRAMMAR_CHARS
from inference.models import ApiKey, Generation
from tests.api_client import PROMPT, post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker"),
              pytest.mark.database_agnostic]
HOSTILE = "((a{{1,300}}){{1,300}}){{1,{n}}}"  # one nesting past the audit's 1.6 s: it did not end in minutes


def new_key(name: str) -> str:
    key = ApiKey(name=name, max_concurrent=4)
    secret = set_new_key(key)
    key.save()
    return secret


def checkers(base_url: str) -> set[int]:
    """The grammar checker processes of the daphne serving `base_url`."""
    port = base_url.rsplit(":", 1)[1]
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            cmdline = (status.parent / "cmdline").read_bytes().split(b"\0")
            parent = next(line.split()[1] for line in status.read_text().splitlines() if line.startswith("PPid:"))
            parent_cmdline = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
        except (OSError, StopIteration):
            continue  # it ended meanwhile
        if b"inference.engines.grammar.checks" in cmdline and b"daphne" in parent_cmdline \
                and port.encode() in parent_cmdline:
            found.add(int(status.parent.name))
    return found


def timed_regex_request(base_url: str, key: str, regex: str) -> float:
    started = time.monotonic()
    response = post(base_url, "/v1/completions", key, {"model": "demo-code", "prompt": PROMPT, "max_tokens": 4,
                                                       "regex": regex}, timeout=60)
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def test_a_hostile_regex_is_refused_while_other_keys_grammars_keep_their_latency(live_server_url, demo_pair, settings):
    ordinary, hostile = new_key("ordinary"), new_key("hostile")
    requests_made = iter(range(1000))  # each ordinary regex is new: it is compiled, not read from the verdicts kept

    def ordinary_round(count: int) -> list[float]:
        return [timed_regex_request(live_server_url, ordinary, f"[a-z]{{2,8}}-{next(requests_made)}")
                for _ in range(count)]

    ordinary_round(3)  # the checkers start with the first grammar, the pair's engine with the first answer
    alone = ordinary_round(8)

    refusals = []
    done = threading.Event()
    hostile_regexes = iter(range(300, 10_000))  # a new one each time: none is refused from the verdicts kept

    def send_hostile() -> None:
        while not done.is_set():
            refusals.append(post(live_server_url, "/v1/completions", hostile, {
                "model": "demo-code", "prompt": PROMPT, "max_tokens": 4,
                "regex": HOSTILE.format(n=next(hostile_regexes))}, timeout=60))

    attackers = [threading.Thread(target=send_hostile) for _ in range(3)]  # at once, as a script would
    for attacker in attackers:
        attacker.start()
    try:
        time.sleep(0.3)  # the first hostile regexes are compiling
        beside = ordinary_round(8)
    finally:
        done.set()
        for attacker in attackers:
            attacker.join(90)
    compiled = [r for r in refusals if r.status_code == 400]
    assert compiled and all(r.status_code in (400, 429) for r in refusals), [r.text for r in refusals]
    error = compiled[0].json()["error"]
    assert error["param"] == "regex" and "did not compile within" in error["message"], error
    # the key's others, sent at once, were told to send one at a time rather than queued behind it
    assert all("one at a time" in r.json()["error"]["message"] or "being replaced" in r.json()["error"]["message"]
               for r in refusals if r.status_code == 429), [r.text for r in refusals]
    assert Generation.objects.filter(api_key__name="hostile").count() == 0
    p50_alone, p50_beside = statistics.median(alone), statistics.median(beside)
    print(f"\n{len(refusals)} hostile regexes refused; ordinary p50 {p50_alone * 1000:.0f} ms alone, "
          f"{p50_beside * 1000:.0f} ms beside them")
    # Held behind one lock, each would wait out at least one hostile compile of the whole budget; what is left is the
    # checkers' CPU on a shared 2-core host (217 ms alone, 679 ms beside them on an AVX2 host with a conversion beside).
    assert p50_beside < 2 * p50_alone + settings.GRAMMAR_COMPILE_MS / 2000, (alone, beside)


def test_a_refused_grammar_sent_again_is_refused_from_the_verdicts_kept(live_server_url, demo_pair, api_key):
    body = {"model": "demo-code", "prompt": PROMPT, "regex": HOSTILE.format(n=299)}
    first = post(live_server_url, "/v1/completions", api_key.secret, body, timeout=60)
    assert first.status_code == 400 and first.json()["error"]["param"] == "regex", first.text
    deadline = time.monotonic() + 60
    while len(running := checkers(live_server_url)) < 2:  # the one killed over the budget is replaced
        assert time.monotonic() < deadline, running
        time.sleep(0.2)
    again = post(live_server_url, "/v1/completions", api_key.secret, body, timeout=60)
    assert again.json() == first.json()
    assert checkers(live_server_url) == running  # no checker compiled it again, so none was killed


def test_a_grammar_over_the_size_cap_is_refused_naming_the_field(live_server_url, demo_pair, api_key):
    schema = {"type": "string", "description": "x" * MAX_GRAMMAR_CHARS}
    response = post(live_server_url, "/v1/chat/completions", api_key.secret, {
        "model": "demo-code", "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "response_format.json_schema.schema" and f"{MAX_GRAMMAR_CHARS:,}" in error["message"]
    assert Generation.objects.count() == 0


def test_one_keys_hostile_grammars_are_answered_within_half_a_budget_more(live_server_url, demo_pair, settings):
    """Issue 56, row 4: a hostile regex was refused 1.9-3.0 s after it was sent against a 1 s budget (its key's
    checker restarting first), and three at once from one key after 2.8, 5.3 and 8.0 s (queued behind each other)."""
    key = new_key("hostile")
    timed_regex_request(live_server_url, key, "[a-z]{2,8}")  # the checkers started
    hostile_regexes = iter(range(300, 100, -1))
    bound = 2 * settings.GRAMMAR_COMPILE_MS / 1000  # the bar is 1.5 (measured: 1.06-1.38 s); room for a busy CI

    def hostile(_=None) -> tuple[float, int]:
        started = time.monotonic()
        regex = HOSTILE.format(n=next(hostile_regexes)).replace("a", "b")  # none refused earlier, from the verdicts
        response = post(live_server_url, "/v1/completions", key, {"model": "demo-code", "prompt": PROMPT, "max_tokens": 4,
                                                                "regex": regex})
        assert response.status_code in (400, 429) and response.json()["error"]["param"] == "regex", response.text
        return time.monotonic() - started, response.status_code

    one_after_another = [hostile(), hostile()]
    with ThreadPoolExecutor(3) as pool:
        at_once = list(pool.map(hostile, range(3)))
    print(f"\none after another: {one_after_another}; three at once: {at_once}")
    assert one_after_another[0][1] == 400 and all(took < bound for took, _ in one_after_another + at_once), (
        one_after_another, at_once)
