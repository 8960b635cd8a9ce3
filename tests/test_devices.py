"""Devices per model: the main and the draft each run on a device the admin picks from those the workers'
OpenVINO runtimes list. Only the CPU exists here: AUTO (which picks the CPU) and a draft on the CPU beside an
AUTO main are served by both engines with the CPU's answers; a GPU or an NPU is refused when a pair is
registered or moved, and fails the load on a worker, saying so."""

import io
import time
from dataclasses import replace

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command

from inference import pair_checks, selectors
from inference.benchmark.servers import free_port
from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.devices import DeviceUnavailable, runtime_devices
from inference.engines.interface import Finished
from inference.engines.library.pipeline import LibraryEngine
from inference.engines.own.engine import OwnEngine
from inference.engines.spec import PairSpec
from inference.limits import LoadState, Route
from inference.models import ImportJob, ModelPair
from inference.serving import web
from inference.serving.registry import EngineRegistry
from tests.conftest import wait_until_done
from tests.test_pair_checks import admin_form

PAIR = settings.MODELS_ROOT / settings.DEMO_PAIR_DIR
SPEC = PairSpec(slug="devices", main_dir=str(PAIR / "main"), draft_dir=str(PAIR / "draft"),
                pair_default=Route.LIBRARY_SPECULATIVE)
PROMPT = "def quicksort(numbers):"
HERE = ", ".join(runtime_devices())  # "CPU, AUTO" on these machines


def pair_form(**overrides) -> dict:
    """The admin's pair form for the demo pair (under the models root the worker reads too)."""
    return admin_form(**{"main_dir": f"{settings.DEMO_PAIR_DIR}/main", "draft_dir": f"{settings.DEMO_PAIR_DIR}/draft",
                         **overrides})


def answer(engine, *, k: int = 3) -> tuple[list[int], list[float]]:
    """A greedy answer's tokens and their log probabilities."""
    request = engine.submit(prompt=PROMPT, params=DecodingParams(max_new_tokens=24, ignore_eos=True, logprobs=True,
                                                                 speculation=Speculation(k=k) if k else None))
    tokens: list[int] = []
    logprobs: list[float] = []
    while not isinstance(event := request.events.get(timeout=120), Finished):
        tokens += event.token_ids
        logprobs += event.logprobs or []
    assert event.finish_reason == "length", event
    return tokens, logprobs


def library_answer(spec: PairSpec) -> tuple[list[int], list[float]]:
    engine = LibraryEngine(spec)
    try:
        return answer(engine)
    finally:
        engine.close()


@pytest.mark.no_database
def test_the_runtime_here_lists_the_cpu_and_auto():
    assert runtime_devices()[0] == "CPU" and runtime_devices()[-1] == "AUTO"
    assert "GPU" not in runtime_devices() and "NPU" not in runtime_devices()


@pytest.mark.no_database
def test_the_cpus_own_switch_goes_to_the_cpu_and_auto_alone():
    """DYNAMIC_QUANTIZATION_GROUP_SIZE=0 is the CPU's switch for exact greedy answers: a GPU or NPU named is not
    sent it; AUTO is, for the CPU it picks (the test below shows it arrives)."""
    for device in ("CPU", "AUTO"):
        assert SPEC.device_properties(device=device)["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "0"
    for elsewhere in ("GPU", "NPU"):
        assert SPEC.device_properties(device=elsewhere) == {"INFERENCE_PRECISION_HINT": "f32",
                                                            "KV_CACHE_PRECISION": "f32"}


@pytest.mark.no_database
def test_the_library_engine_on_auto_with_its_draft_on_the_cpu_answers_as_on_the_cpu():
    """Bitwise the same log probabilities, with the CPU's dynamic quantization off and on: AUTO picks the CPU and
    passes it the CPU's switch. Where int8 activations change the answer (hosts with VNNI; not AVX2 alone), the two
    settings differ, so the switch is seen to reach the CPU."""
    on_cpu = library_answer(SPEC)
    assert library_answer(replace(SPEC, device="AUTO", draft_device="CPU")) == on_cpu
    quantized = library_answer(replace(SPEC, dynamic_quantization=True))
    assert library_answer(replace(SPEC, device="AUTO", dynamic_quantization=True)) == quantized


@pytest.mark.no_database
def test_the_own_engine_on_auto_with_its_draft_on_the_cpu_answers_as_on_the_cpu():
    own = replace(SPEC, route=Route.OWN_SPECULATIVE, pair_default=Route.OWN_SPECULATIVE, dynamic_quantization=True)
    on_cpu = answer(OwnEngine(own))
    engine = OwnEngine(replace(own, device="AUTO", draft_device="CPU"))
    assert answer(engine) == on_cpu
    tokens, logprobs = answer(engine, k=0)
    assert tokens == on_cpu[0]  # the main alone's, token for token
    # bitwise with AVX-512 kernels; with AVX2 a row alone and K+1 rows agree within 1e-5 (docs/exactness.md)
    assert logprobs == pytest.approx(on_cpu[1], abs=1e-5)


@pytest.mark.no_database
def test_a_worker_refuses_to_load_a_model_on_a_device_it_lacks():
    registry = EngineRegistry()
    for spec, words in ((replace(SPEC, device="GPU"), "The main device GPU"),
                        (replace(SPEC, draft_device="NPU"), "The draft device NPU")):
        with pytest.raises(DeviceUnavailable, match=f"{words} is not available. Devices on this worker: {HERE}."):
            registry.get(spec)
        assert registry.states[SPEC.slug]["state"] == LoadState.FAILED
        assert words in registry.states[SPEC.slug]["error"]
    assert not registry.loaded()


@pytest.mark.no_database
def test_a_pairs_live_figures_start_afresh_when_its_devices_change():
    """What the pair delivered on one device says nothing of another: the plans' live figures restart."""
    registry = EngineRegistry(live_figures_s=600, live_figures_min_step_s=0.5)
    own = replace(SPEC, route=Route.OWN_SPECULATIVE, pair_default=Route.OWN_SPECULATIVE, dynamic_quantization=True)
    registry.get(own)
    registry.rates_of(own.slug).record(k=3, streams=1, tokens=40, seconds=1.0)
    registry.get(replace(own, prefix_caching=False))  # other settings, the same devices: kept
    assert registry.rates_of(own.slug).figures() == {1: {3: 40.0}}
    registry.get(replace(own, prefix_caching=False, device="AUTO"))
    assert registry.rates_of(own.slug).figures() == {}


@pytest.mark.no_database
def test_with_no_worker_to_ask_a_pair_may_name_what_this_runtime_lists():
    """Redis away, as when `make real-pair` registers a pair: no live worker can be asked."""
    with redis.Redis(port=free_port(), socket_connect_timeout=1) as away:
        available = pair_checks.registrable_devices(client=away)
    assert available.names == runtime_devices() and "OpenVINO runtime" in available.where


def test_the_admin_registers_a_pair_on_devices_a_worker_has_and_refuses_others(admin_client):
    for device, draft_device, field, refused in (("GPU", "", "main", "GPU"), ("CPU", "NPU", "draft", "NPU")):
        page = admin_client.post("/admin/inference/modelpair/add/",
                                 pair_form(device=device, draft_device=draft_device)).content.decode()
        assert f"The {field} device {refused} is not available. Devices " in page and f": {HERE}." in page
    assert not ModelPair.objects.exists()
    response = admin_client.post("/admin/inference/modelpair/add/", pair_form(device="AUTO", draft_device="CPU"))
    assert response.status_code == 302, response.content[:2000]
    pair = ModelPair.objects.get(slug="mine")
    assert pair.devices == {"main": "AUTO", "draft": "CPU"}
    page = admin_client.get(f"/admin/inference/modelpair/{pair.id}/change/").content.decode()
    assert '<option value="AUTO" selected>' in page and '<option value="CPU" selected>' in page  # its devices, shown


def test_a_device_a_live_worker_lists_may_be_named(admin_client, redis_client):
    """A worker with a GPU (its heartbeat, as one would write it) lets a pair name the GPU."""
    from inference.serving.lifecycle import announce_worker, retire_worker

    name = "gpu-host:1"
    announce_worker(client=redis_client, name=name, payload={"name": name, "queues": [], "devices": ["CPU", "GPU",
                                                                                                    "AUTO"]}, ttl_s=30)
    try:
        assert "GPU" in pair_checks.registrable_devices(client=redis_client).names
        response = admin_client.post("/admin/inference/modelpair/add/", pair_form(device="GPU"))
        assert response.status_code == 302, response.content[:2000]
    finally:
        retire_worker(client=redis_client, name=name)


def test_an_import_on_a_device_no_worker_has_is_refused_before_it_starts(admin_client):
    with pytest.raises(CommandError, match="The main device GPU is not available"):
        call_command("import_pair", name="On a GPU", slug="on-gpu", main="Qwen/nowhere", device="GPU",
                     stdout=io.StringIO())
    page = admin_client.post("/admin/inference/importjob/add/", {
        "name": "On an NPU", "slug": "on-npu", "main_source": "Qwen/nowhere", "draft_source": "Qwen/nowhere-small",
        "weight_format": "int8", "device": "CPU", "draft_device": "NPU"}).content.decode()
    assert "The draft device NPU is not available" in page
    assert not ImportJob.objects.exists() and not ModelPair.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_pair_moved_to_a_device_its_worker_lacks_fails_to_load_saying_so(admin_client, demo_pair, celery_worker,
                                                                             redis_client):
    beat = next(b for b in selectors.live_workers(client=redis_client) if b["name"] == celery_worker.name)
    assert beat["devices"] == list(runtime_devices())
    # Saved around validation, as if a GPU worker had been there when it was registered.
    pair = ModelPair.objects.create(name="Broken", slug="broken", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, num_assistant_tokens=3, device="GPU")
    admin_client.post("/admin/inference/modelpair/", {"action": "load_on_worker", "_selected_action": [pair.id]})
    said = f"The main device GPU is not available. Devices on this worker: {HERE}."
    deadline = time.monotonic() + 60
    while said not in pair.load_error and time.monotonic() < deadline:
        time.sleep(0.5)
        pair.refresh_from_db()
    assert pair.load_error == f"DeviceUnavailable: {said}"
    page = admin_client.get(f"/admin/inference/modelpair/{pair.id}/change/").content.decode()
    assert said in page and "Traceback" not in page
    # Its devices unchanged, an edit is not refused for them; moving its draft to an NPU is.
    form = pair_form(name="Broken", slug="broken", device="GPU")
    assert admin_client.post(f"/admin/inference/modelpair/{pair.id}/change/",
                             {**form, "description": "Waits for its GPU."}).status_code == 302
    page = admin_client.post(f"/admin/inference/modelpair/{pair.id}/change/",
                             {**form, "draft_device": "NPU"}).content.decode()
    assert "The draft device NPU is not available" in page
    # Back on the CPU it loads, and the session's worker holds no failure under this slug for later tests.
    ModelPair.objects.filter(id=pair.id).update(device="CPU")
    admin_client.post("/admin/inference/modelpair/", {"action": "load_on_worker", "_selected_action": [pair.id]})
    while pair.load_error and time.monotonic() < deadline + 60:
        time.sleep(0.5)
        pair.refresh_from_db()
    assert not pair.load_error


@pytest.mark.django_db(transaction=True)
def test_a_pair_registered_on_auto_with_its_draft_on_the_cpu_is_served_by_both_engines(demo_pair, celery_worker):
    demo_pair.device, demo_pair.draft_device = "AUTO", "CPU"
    demo_pair.full_clean()
    demo_pair.save()
    for own_engine_streams, route in ((0, "library-speculative"), (1, "own-speculative")):
        demo_pair.own_engine_streams = own_engine_streams
        demo_pair.save()
        served = wait_until_done(web.start_generation(pair=demo_pair, prompt=PROMPT, options=web.GenerationOptions(
            max_new_tokens=16, ignore_eos=True)).id)
        assert served.status == "finished" and served.completion_tokens == 16, served.error
        assert served.speculative_route == route and served.accepted_tokens
