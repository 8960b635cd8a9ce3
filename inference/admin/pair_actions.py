"""What an operator does to the selected pairs from the pair list (and, one pair at a time, from a pair's page):
load or unload them on the live workers, calibrate or benchmark them on a worker that serves them."""

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from inference import selectors, transport
from inference.admin.benchmarks import BenchmarkForm
from inference.benchmark import records
from inference.models import ModelPair
from inference.serving import calibrated


@admin.action(description="Load on every live worker (no restart)", permissions=["change"])
def load_on_worker(modeladmin, request, queryset):
    _control(request, queryset, "load")


@admin.action(description="Unload from every live worker", permissions=["change"])
def unload_from_worker(modeladmin, request, queryset):
    _control(request, queryset, "unload")


def _control(request, queryset, command: str):
    for pair in queryset:
        received = transport.send_control(transport.sync_client(), command=command, slug=pair.slug)
        if received:
            messages.info(request, f"{pair.slug}: {received} worker(s) received it; the state column follows.")
        else:
            messages.error(request, f"{pair.slug}: no live worker answered.")


def _served(request, queryset, *, doing: str) -> list[ModelPair]:
    """The selected pairs some live worker serves; each of the others is reported as not `doing`."""
    workers = selectors.live_workers(client=transport.sync_client())
    served = []
    for pair in queryset:
        state = selectors.pair_state(pair=pair, workers=workers)
        if state.served:
            served.append(pair)
        else:
            messages.error(request, f"Not {doing} {pair.slug}: {state.error}.")
    return served


@admin.action(description="Calibrate on its worker's host", permissions=["change"])
def calibrate(modeladmin, request, queryset):
    for pair in _served(request, queryset, doing="calibrating"):
        calibrated.start_calibration(pair=pair)
        messages.info(request, f"Calibration of {pair.slug} queued on its worker: its page shows the progress.")


@admin.action(description="Run benchmark on a worker", permissions=["change"])
def run_benchmark(modeladmin, request, queryset):
    """First shows BenchmarkForm; its submission queues one run per selected pair."""
    form = BenchmarkForm(request.POST if "apply" in request.POST else None)
    if not form.is_bound or not form.is_valid():
        return TemplateResponse(request, "admin/inference/benchmarkrun/start.html", {
            **modeladmin.admin_site.each_context(request), "title": "Run benchmark on a worker", "form": form,
            "pairs": queryset, "opts": modeladmin.model._meta, "action_checkbox_name": ACTION_CHECKBOX_NAME})
    for pair in _served(request, queryset, doing="benchmarking"):
        run = records.start_benchmark_run(pair=pair, options=form.cleaned_data["options"])
        messages.info(request, format_html('Benchmark of {} queued on its worker: <a href="{}">run #{}</a>.',
                                           pair.slug, reverse("admin:inference_benchmarkrun_change",
                                                              args=[run.id]), run.id))
    return None
