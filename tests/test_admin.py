"""The admin's inputs bounded (issue 25): the benchmark form's K ranges and prompt count."""

import pytest
from django.test import Client

from inference.admin.benchmarks import BenchmarkForm
from inference.limits import K_MAX
from inference.models import BenchmarkRun

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
