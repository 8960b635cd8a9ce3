"""The admin as an operator reads it (issue 57, point 9), in Debian's headless Chromium at a laptop's and a phone's
width: the pair list shows each pair's state, its host's speed-up and the next thing to do; a pair's first screen is
its state, the host's verdict with the table per K that backs it, and buttons to benchmark and calibrate, the settings
folded below; a new API key has a copy button and a first request to run. Screenshots go to /tmp/shots-57."""

import pytest
from django.utils import timezone

from inference.models import ApiKey, Generation, HostCalibration, JobStatus, ModelPair
from tests.conftest import in_thread
from tests.test_chat_expectations import SHOTS, SIZES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker"),
              pytest.mark.database_agnostic]
RESULTS = {"configs": {"f32": {"label": "f32", "tokens_per_s": 10.3, "streams": 4, "tokens_per_s_streams": 30.0},
                       "f32-dynamic": {"label": "f32, dynamic quantization", "tokens_per_s": 9.1, "streams": 4,
                                       "tokens_per_s_streams": 28.0}},
           "fastest": "f32", "fastest_again": {"tokens_per_s": 9.8}, "own_config": "f32", "best_k": {"1": 8},
           "ks": {"4": {"tokens_per_s": 12.0, "identical": 4, "answers": 4},
                  "8": {"tokens_per_s": 14.7, "identical": 4, "answers": 4}}}


@pytest.fixture
def operator(demo_pair, django_user_model):
    HostCalibration.objects.create(pair=demo_pair, host="h" * 64, status=JobStatus.FINISHED, results=RESULTS,
                                   host_facts={"cpu": "AMD EPYC", "family": "25", "model": "17", "cores": 2})
    ModelPair.objects.create(name="Nobody serves it", slug="unserved", main_dir=demo_pair.main_dir)
    for rate in (12.0, 14.0, 15.0):  # answers served
        Generation.objects.create(pair=demo_pair, prompt="def f():", status=Generation.Status.FINISHED,
                                  completion_tokens=33, ttft_ms=100.0, duration_ms=100.0 + 32_000 / rate,
                                  speculative_route="own-speculative", speculative_k=8,
                                  finished_at=timezone.now())
    return django_user_model.objects.create_superuser("root", "root@example.com", "root-password")


def admin_login(page, live_server_url: str) -> None:
    page.goto(f"{live_server_url}/admin/login/?next=/admin/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "root-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server_url}/admin/")


def test_the_pair_list_and_page_put_what_an_operator_needs_first(operator, demo_pair, live_server_url, page):
    admin_login(page, live_server_url)
    for _ in range(60):  # the worker loads the pair just registered
        page.goto(f"{live_server_url}/admin/inference/modelpair/")
        if "available on" in page.inner_text("#result_list"):
            break
        page.wait_for_timeout(1000)
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{live_server_url}/admin/inference/modelpair/")
        headers = [h.strip() for h in page.locator("#result_list thead th").all_inner_texts()][1:]  # after the box
        assert headers == ["NAME", "STATE", "SPEED-UP ON ITS HOST", "IS DEFAULT", "ENABLED", "NEXT"], headers
        row = page.locator("#result_list tr", has_text=demo_pair.name)
        assert row.locator("td.field-serving_state").inner_text() == "available on 1 worker"  # not host:pid
        # 14.7 / 9.8, as the verdict; beside it the answers lately (14.0 tok/s after their first token)
        assert row.locator("td.field-speedup_here").inner_text() == "1.50x (K=8); answers lately 1.43x"
        unserved = page.locator("#result_list tr", has_text="Nobody serves it")
        assert unserved.locator("td.field-next_step").inner_text() == "start a worker for it"
        if width > 1000:
            state = row.locator("td.field-serving_state").bounding_box()
            assert state["x"] + state["width"] <= width  # on screen, not scrolled off
        page.screenshot(path=str(SHOTS / f"admin-pairs-{width}.png"), full_page=True)

        page.goto(f"{live_server_url}/admin/inference/modelpair/{demo_pair.pk}/change/")
        first_screen = {name: page.get_by_text(text, exact=False).first.bounding_box()["y"] < height
                        for name, text in (("verdict", "makes a lone answer 1.50x as fast"), ("K row", "K=8 (chosen)"),
                                           ("benchmark", "Run a benchmark"), ("calibrate", "Calibrate on its host"),
                                           ("state", "available on 1 worker"))}
        page.screenshot(path=str(SHOTS / f"admin-pair-{width}.png"))
        page.screenshot(path=str(SHOTS / f"admin-pair-{width}-full.png"), full_page=True)
        if width > 1000:
            assert all(first_screen.values()), first_screen
        assert page.locator("#id_main_dir").is_hidden()  # the settings, folded
        served = page.locator(".field-live_figures tr", has_text="own-speculative").inner_text().split()
        assert served == ["own-speculative", "8", "3", "14.0"], served  # live figures once answers are served

    page.click("text=Run a benchmark")  # a button, not a hidden bulk action
    page.locator("input[name=apply]").wait_for()
    assert demo_pair.name in page.inner_text("#content")
    page.goto(f"{live_server_url}/admin/inference/modelpair/")
    unserved_id = page.locator("#result_list tr", has_text="Nobody serves it").locator("a").first.get_attribute("href")
    page.goto(f"{live_server_url}{unserved_id}")
    page.click("text=Calibrate on its host")
    page.locator(".messagelist", has_text="Not calibrating unserved").wait_for()
    assert in_thread(lambda: HostCalibration.objects.filter(pair__slug="unserved").count()) == 0


def test_a_new_key_is_copied_and_tried_in_one_step(operator, demo_pair, live_server_url, page):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server_url)
    admin_login(page, live_server_url)
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{live_server_url}/admin/inference/apikey/add/")
        page.fill("#id_name", f"laptop-{width}")
        page.click("input[name=_save]")
        secret = page.inner_text("#api-key-secret")
        page.click("button[data-copy=api-key-secret]")
        page.get_by_role("button", name="Copied").wait_for()
        assert page.evaluate("navigator.clipboard.readText()") == secret
        example = page.inner_text("#api-key-example")
        assert f"Bearer {secret}" in example and f"{live_server_url}/v1/chat/completions" in example
        assert '"model": "demo-code"' in example
        page.screenshot(path=str(SHOTS / f"admin-key-{width}.png"))
        assert page.evaluate("document.documentElement.scrollWidth") <= width or width < 768
    assert in_thread(ApiKey.objects.count) == 2


def test_the_answers_list_shows_its_speed_figures_rounded_and_on_screen(operator, demo_pair, live_server_url, page):
    in_thread(lambda: Generation.objects.create(
        pair=demo_pair, prompt="def g():", status=Generation.Status.FINISHED, tokens_per_s=8.1,  # with the wait
        completion_tokens=33, ttft_ms=100.0, duration_ms=100.0 + 32_000 / 9.747552543593327,  # 9.7 after it
        acceptance_rate=0.9134, mean_accepted_length=3.4567, speculative_mode="draft", finished_at=timezone.now()))
    admin_login(page, live_server_url)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{live_server_url}/admin/inference/generation/?o=-3")  # by speed, slowest last
    row = page.locator("#result_list tbody tr").last
    shown = [row.locator(f"td.field-{name}").inner_text() for name in ("speed", "guesses_kept", "kept_per_step")]
    assert shown == ["9.7", "91%", "3.46"], shown
    visible = page.locator("#changelist .results").bounding_box()  # the table scrolls within it
    for name in ("speed", "guesses_kept", "kept_per_step", "speculative_mode", "status"):
        box = row.locator(f"td.field-{name}").bounding_box()
        assert box["x"] + box["width"] <= visible["x"] + visible["width"], name  # in view, not scrolled off
    page.screenshot(path=str(SHOTS / "admin-generations-1280.png"), full_page=True)
