"""The admin's inputs bounded (issue 25): the benchmark form's K ranges and prompt count, a pair's
speculation profile refused when invalid, and one already stored serving requests on the default K."""

import json

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from inference.admin import BenchmarkForm
from inference.limits import K_MAX
from inference.models import BenchmarkRun, ModelPair
from inference.serving import speculation
from inference.serving.reasons import Reason

pytestmark = [pytest.mark.django_db(transaction=True)]
VALID = {"max_new_tokens": "16", "repeats": "1", "ks": "1-8", "thresholds": "0.3", "prompts_per_set": "2"}


@pytest.mark.parametrize("change", [
    {"ks": "1-2000000"}, {"ks": "0-3"}, {"ks": f"{K_MAX + 1}"}, {"ks": "8-2"}, {"ks": "-5"}, {"ks": ","},
    {"ks": "1," * 200}, {"prompts_per_set": str(10**12)}, {"thresholds": "0.5," * 20}, {"thresholds": "2"},
])
def test_the_benchmark_form_refuses_out_of_bounds_options(demo_pair, django_user_model, change):
    admin_user = django_user_model.objects.create_superuser("root", "root@example.com", "root-password")
    client = Client()
    client.force_login(admin_user)
    response = client.post("/admin/inference/modelpair/", {
        "action": "run_benchmark", "_selected_action": [demo_pair.pk], "apply": "1", **VALID, **change})
    assert response.status_code == 200 and b"errorlist" in response.content, change
    assert not BenchmarkRun.objects.exists()


def test_the_benchmark_form_reads_ks_once_each_within_the_limits():
    form = BenchmarkForm({**VALID, "ks": f"2, 4-6, 5, 1-{K_MAX}"})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["options"].ks == (2, 4, 5, 6, 1, 3, *range(7, K_MAX + 1))


INVALID_PROFILES = [{"greedy": {"1": "five"}}, {"greedy": {"one": 2}}, {"greedy": [1, 2]}, {"fast": {"1": 2}},
                    {"greedy": {"1": K_MAX + 1}}, {"sampled": {"1": True}}, ["greedy"]]


@pytest.mark.parametrize("profile", INVALID_PROFILES)
def test_an_invalid_speculation_profile_is_refused_by_the_pairs_validation(demo_pair, profile):
    demo_pair.speculation_profile = profile
    with pytest.raises(ValidationError) as refused:
        demo_pair.full_clean()
    assert "speculation_profile" in refused.value.message_dict
    demo_pair.speculation_profile = {"greedy": {"1": 4, "8": 0}, "sampled": {"1": 3}}
    demo_pair.full_clean()


def test_a_stored_invalid_profile_serves_on_the_default_k(demo_pair, celery_worker, api_key):
    """Saved around validation (an old row, a script): each request of the pair was a 500."""
    ModelPair.objects.filter(id=demo_pair.id).update(speculation_profile={"greedy": {"1": "five"}})
    response = Client().post("/v1/completions", data=json.dumps({
        "model": demo_pair.slug, "prompt": "def add(a, b):", "max_tokens": 8}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api_key.secret}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["choices"][0]["text"]
    planned = speculation.plan(pair=ModelPair.objects.get(id=demo_pair.id), asked=speculation.Asked(),
                               load=speculation.Load(streams=1))
    assert planned.k == (demo_pair.num_assistant_tokens or 5)
    assert planned.reasons == (Reason.PAIR_DEFAULT_K_INVALID_PROFILE,)
    assert "profile is invalid" in planned.reason
