"""A pair calibrated on the host that serves it, with no manual step: a worker that loads a pair on a host with
no calibration of it measures the host (a calibration made on another host does not count), the admin and
/v1/config show whose host the figures come from and what they decided, answers follow them (the main alone in
the configuration measured fastest), and the admin can calibrate again."""

import time

import pytest
import requests

from inference.limits import Route
from inference.models import HostCalibration, JobStatus, ModelPair
from inference.selectors import live_workers
from inference.serving.precision import CONFIGS
from tests.api_client import PROMPT, post
from tests.conftest import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]
ELSEWHERE = {"configs": {"bf16": {"label": "bf16", "tokens_per_s": 99.0, "streams": 4, "tokens_per_s_streams": 99.0}},
             "fastest": "bf16", "own_config": "bf16", "best_k": {"1": 0}}


def finished(pair: ModelPair, *, after: int = 0, timeout: float = 300) -> HostCalibration:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = pair.calibrations.filter(id__gt=after).exclude(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).first()
        if done:
            assert done.status == JobStatus.FINISHED, done.error
            return done
        time.sleep(0.5)
    raise AssertionError(f"no calibration ended: {list(pair.calibrations.values('status', 'progress'))}")


@pytest.fixture
def pair_on_a_calibrating_worker(demo_pair, stack_env, redis_client, tmp_path):
    # its "draft in another format" is the demo main, a model costlier a token than the draft: timed, and not taken
    pair = ModelPair.objects.create(name="Calibrated", slug="calibrated", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, draft_alternative_dir=demo_pair.main_dir,
                                    num_assistant_tokens=3, own_engine_streams=1)
    pair.elsewhere = HostCalibration.objects.create(pair=pair, host="another host", host_facts={"cpu": "Elsewhere"},
                                                    status=JobStatus.FINISHED, results=ELSEWHERE)
    worker = Worker({**stack_env, "SPECCHAT_CALIBRATE_ON_LOAD": "1", "SPECCHAT_CALIBRATION_BATCH_KS": "2"}, pair.queue,
                    tmp_path / "worker.log")
    try:
        worker.name = worker.wait_ready(redis_client)
        yield pair, worker
    finally:
        worker.stop()


def test_a_new_host_calibrates_on_load_and_its_answers_follow_it(pair_on_a_calibrating_worker, live_server_url,
                                                                 api_key, admin_client, redis_client):
    pair, worker = pair_on_a_calibrating_worker
    calibration = finished(pair, after=pair.elsewhere.id)
    assert calibration.host != "another host" and calibration.host_facts["device"] == "CPU"
    results = calibration.results
    assert {"f32", "f32-dynamic", "defaults"} <= set(results["configs"])  # every configuration the CPU offers
    fastest = max(results["configs"], key=lambda name: results["configs"][name]["tokens_per_s"])
    assert results["fastest"] == fastest and set(results["ks"]) == {"1", "2", "4"}
    assert results["ks"]["4"]["draft_stop_below"] == 0.5 and "draft_stop_below" not in results["ks"]["2"]
    assert all(line["identical"] == line["answers"] for line in results["ks"].values())  # greedy identity, each K
    assert set(results["verify_cost"]) == {str(n) for n in range(1, 9)} and set(results["library_alone"]) == {"1", "4"}
    assert results["draft_ms"]["draft"] < results["draft_ms"]["alternative"] and "draft" not in results
    if results["best_k"]["1"]:  # after a long prompt, kept: the K long answers get, or 0 where the main alone won
        long = results["long_context"]
        assert long["tokens"] == min(2000, 1024 - results["budget"]["max_new_tokens"] - 64) and long["k"] in (0, results["best_k"]["1"]) and long["drafted"]["answers"] == 2
        # where the main alone won there: from the length where the gain fell to nothing, between the two prompts'
        assert long["drafted"]["identical"] == 2 and (long["from_tokens"] is None if long["k"] else
                                                       results["prompt_tokens"] <= long["from_tokens"] <= long["tokens"])
        # the lookup alone timed beside it, the main alone's text too: the draft kept only where it beat both; the
        # steps' costs timed there too, which a long answer's K weighs (the draft the engine loads, alone)
        assert long["lookup_only"]["answers"] == long["lookup_only"]["identical"] == 2 and list(long["draft_ms"]) == [
            "draft"] and set(long["verify_cost"]) == set(results["verify_cost"])
        assert bool(long["k"]) == (long["drafted"]["tokens_per_s"] > max(
            long[line]["tokens_per_s"] for line in ("lookup_only", "own_main_alone", "fastest")))
    for line in (results["fastest_again"], results["own_main_alone"]):  # the verdict under load weighs both
        assert line["first_token_ms"] > 0 and line["first_token_ms_streams"] > 0
    in_batch = results["batch_ks"]["2"]  # asked for: four answers at once speculating in the own engine's batch
    assert in_batch["answers"] and in_batch["answers"] % 4 == 0 and in_batch["acceptance"] > 0
    assert results["batch_k"] == (2 if in_batch["identical"] == in_batch["answers"] and in_batch["tokens_per_s"] > max(
        results["own_main_alone"]["tokens_per_s_streams"], results["fastest_again"]["tokens_per_s_streams"]) else 0)

    page = admin_client.get(f"/admin/inference/modelpair/{pair.id}/change/").content.decode()
    assert calibration.host_facts["cpu"] in page and "Elsewhere" in page  # each host's own calibration
    assert "the fastest main alone" in page or "slower than the main alone" in page
    shown = requests.get(f"{live_server_url}/v1/config", headers={"Authorization": f"Bearer {api_key.secret}"},
                         timeout=30).json()["calibrated"]["calibrations"]  # an API key's: they describe the host
    assert {entry["host_signature"] for entry in shown} == {calibration.host, "another host"}
    here = next(entry for entry in shown if entry["host_signature"] == calibration.host)
    assert here["measured_at"] and here["fastest_config"] == fastest

    def ask(**extra) -> dict:
        answer = post(live_server_url, "/v1/completions", api_key.secret,
                      {"model": pair.slug, "prompt": PROMPT, "max_tokens": 16, **extra})
        assert answer.status_code == 200, answer.text
        return answer.json()

    answered_off = ask(speculative=False)  # on the own engine, whatever the library measured
    off = answered_off["usage"]
    assert off["speculative_route"] == "own-main-alone"
    config = CONFIGS[results["own_config"]]
    assert f"fastest configuration on this host ({config.label})" in off["speculative_reason"]
    answered = ask()
    lone = answered["usage"]
    # one computation of the main: speculation off writes the same text
    assert answered["choices"][0]["text"] == answered_off["choices"][0]["text"]
    calibrated_k = results["best_k"]["1"]
    stops = calibrated_k and "draft_stop_below" in results["ks"][str(calibrated_k)]
    assert ("calibrated-best-k-draft-stops" if stops else "calibrated-best-k" if calibrated_k
            else "calibrated-main-alone-faster") in lone["speculative_reason_codes"]
    assert lone["speculative_k"] == (calibrated_k or None)
    time.sleep(3)  # a heartbeat: the engine that ran the main alone, in the configuration the host measured
    ran = next(engine for beat in live_workers(client=redis_client) if beat["name"] == worker.name
               for engine in beat["engines"] if engine["slug"] == pair.slug
               and engine["route"] == Route.OWN_SPECULATIVE)
    assert {key: ran[key] for key in config.fields} == config.fields

    response = admin_client.post("/admin/inference/modelpair/", {"action": "calibrate", "_selected_action": [pair.id]})
    assert response.status_code == 302
    again = finished(pair, after=calibration.id)
    assert again.host == calibration.host and again.finished_at > calibration.finished_at
