"""The pair list an operator scans and each pair's page: its state on the workers, its speed on its hosts, its
settings; the actions on the selected pairs are in pair_actions."""

from datetime import timedelta

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from inference import selectors, transport
from inference.admin import pair_actions
from inference.admin.benchmarks import benchmark_html
from inference.admin.media import ExtraStyle
from inference.benchmark import records
from inference.models import BenchmarkRun, JobStatus, ModelPair
from inference.serving import calibrated


def worker_words(name: str) -> str:
    """A worker as the admin names it: "host vm, process 14977", not "vm:14977" (serving/worker.py, WORKER_NAME)."""
    host, _, pid = name.rpartition(":")
    return f"host {host}, process {pid}" if host and pid.isdigit() else name


@admin.register(ModelPair)
class ModelPairAdmin(admin.ModelAdmin):
    # The list an operator scans: what each pair is, whether it serves, what speculation gains on its host, and
    # the one thing to do next; the settings are on each pair's page.
    list_display = ("name", "serving_state", "speedup_here", "is_default", "enabled", "next_step")
    list_filter = ("enabled", "device")
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("serving_state", "workers", "load_error", "load_reported_at", "created_at", "latest_benchmark",
                       "profile_run", "live_figures", "precision_mode", "calibrations")
    actions = (pair_actions.load_on_worker, pair_actions.unload_from_worker, pair_actions.run_benchmark,
               pair_actions.calibrate)
    change_form_template = "admin/inference/modelpair/change_form.html"  # Benchmark and Calibrate buttons on top
    Media = ExtraStyle
    # The first screen is what an operator needs (state, the host's verdict and its table); the settings are folded.
    fieldsets = (
        (None, {"fields": ("name", "serving_state", "load_error", "enabled", "is_default")}),
        ("Speed on its hosts", {"fields": ("calibrations", "live_figures")}),
        ("Its workers and their caches", {"fields": ("workers",)}),
        ("What it is", {"classes": ["collapse"], "fields": ("slug", "description", "completes_text", "chat_sampling")}),
        ("Models", {"classes": ["collapse"], "fields": ("main_dir", "draft_dir", "draft_alternative_dir",
                                                        "prompt_lookup", "max_ngram_size", "device", "draft_device")}),
        ("Speculation defaults", {"classes": ["collapse"],
                                  "fields": ("num_assistant_tokens", "assistant_confidence_threshold",
                                             "allow_inexact_sampling", "speculation_profile", "profile_run")}),
        ("Limits and precision", {
            "classes": ["collapse"],
            "fields": ("max_new_tokens_cap", "cache_size_gb", "max_num_batched_tokens", "prefill_first",
                       "inference_precision", "kv_cache_precision", "precision_mode", "own_engine_streams"),
            "description": "Exact mode (f32 and an f32 KV cache): greedy answers with the draft are the main alone's, "
                           "token for token. Fast mode (the device's defaults, both empty): answers with the draft can "
                           "differ in near-ties; they say so. On a calibrated host the main alone and the own engine "
                           "run in the configuration measured fastest there (see the calibration below)."}),
        ("Latest benchmark", {"classes": ["collapse"], "fields": ("latest_benchmark",)}),
    )

    def get_queryset(self, request):
        self._workers = selectors.live_workers(client=transport.sync_client())
        return super().get_queryset(request)

    @admin.display(description="state")
    def serving_state(self, pair: ModelPair) -> str:
        if not pair.pk:
            return "-"
        workers = getattr(self, "_workers", None)
        if workers is None:
            workers = selectors.live_workers(client=transport.sync_client())
        state = selectors.pair_state(pair=pair, workers=workers)
        if state.error:
            return f"{state.state.lower()} ({state.detail or state.error})"
        count = len(state.workers)
        return format_html('<span title="{}">{} on {} worker{}</span>', ", ".join(state.workers), state.state.lower(),
                           count, "" if count == 1 else "s")

    @admin.display(description="workers")
    def workers(self, pair: ModelPair) -> str:
        """Each live worker of the pair and what its cache holds: a conversation's turns go back to the worker that
        holds it (serving/routing.py)."""
        if not pair.pk:
            return "-"
        rows = [(worker_words(worker.name), worker.state, worker.running, worker.routed, f"{worker.cached_tokens:,}",
                 "-" if worker.cache_share is None else f"{worker.cache_share:.0%}")
                for worker in selectors.pair_workers(pair=pair, client=transport.sync_client(),
                                                     since=timezone.now() - timedelta(days=1))]
        if not rows:
            return "No live worker serves it."
        return format_html(
            "<table><tr><th>worker</th><th>state</th><th>answers running there (all pairs)</th>"
            "<th>this pair's answers sent there, not ended</th><th>prompt tokens it keeps for next turns</th>"
            "<th>of the prompts it served today, read from its cache</th></tr>{}</table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                             rows))

    @admin.display(description="speed-up on its host")
    def speedup_here(self, pair: ModelPair) -> str:
        """The newest finished calibration's verdict in one figure, a lone answer with the draft against the baseline
        the chat and /v1/config use too; and the pair's speculative answers lately against the same baseline."""
        calibration = pair.calibrations.filter(status=JobStatus.FINISHED).order_by("-finished_at").first()
        shown = calibrated.summary(calibration) if calibration else {}
        lately = f"; answers lately {shown['speedup_lately']:.2f}x" if shown.get("speedup_lately") else ""
        if shown.get("speedup"):
            return f"{shown['speedup']:.2f}x (K={shown['best_k']}){lately}"
        return f"main alone faster{lately}" if shown.get("verdict") else "not calibrated yet"

    @admin.display(description="next")
    def next_step(self, pair: ModelPair) -> str:
        """The one action the pair's state asks for, on its page."""
        page = reverse("admin:inference_modelpair_change", args=[pair.pk])
        if not pair.enabled:
            return format_html('<a href="{}">enable it</a>', page)
        if not selectors.pair_state(pair=pair, workers=getattr(self, "_workers", [])).served:
            return format_html('<a href="{}">start a worker for it</a>', page)
        return format_html('<a href="{}">benchmark or calibrate</a>', page)

    def get_urls(self):
        own = [path("<int:pair_id>/calibrate/", self.admin_site.admin_view(self.calibrate_one),
                    name="inference_modelpair_calibrate"),
               path("<int:pair_id>/benchmark/", self.admin_site.admin_view(self.benchmark_one),
                    name="inference_modelpair_benchmark")]
        return own + super().get_urls()

    def calibrate_one(self, request, pair_id: int):
        """The pair page's Calibrate button (a POST): as the bulk action, for this pair."""
        if request.method != "POST" or not self.has_change_permission(request):
            raise PermissionDenied
        pair_actions.calibrate(self, request, ModelPair.objects.filter(pk=pair_id))
        return HttpResponseRedirect(reverse("admin:inference_modelpair_change", args=[pair_id]))

    def benchmark_one(self, request, pair_id: int):
        """The pair page's Benchmark button: the bulk action's form, for this pair."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        pairs = ModelPair.objects.filter(pk=pair_id)
        if not pairs.exists():
            raise Http404("No such pair")
        answer = pair_actions.run_benchmark(self, request, pairs)
        return answer or HttpResponseRedirect(reverse("admin:inference_modelpair_change", args=[pair_id]))

    @admin.display(description="measured lately on the workers")
    def live_figures(self, pair: ModelPair) -> str:
        """What each worker's plans follow where it measured the main alone and a K (serving/rates.py)."""
        def rates(by_k: dict) -> str:
            return ", ".join(f"{'the main alone' if k == '0' else 'K=' + k} {rate:.0f} tok/s"
                             for k, rate in sorted(by_k.items(), key=lambda item: int(item[0])))

        rows = [(worker_words(beat["name"]), streams, rates(by_k))
                for beat in selectors.live_workers(client=transport.sync_client())
                for streams, by_k in sorted(beat.get("figures", {}).get(pair.slug, {}).items(),
                                            key=lambda item: int(item[0]))]
        served = [(way["route"], "-" if way["k"] is None else way["k"], way["answers"],
                   f"{way['median_tokens_per_s']:.1f}") for way in selectors.answers_served_lately(pair=pair)]
        answers = format_html(
            "<p>The last answers served, by how:</p><table><tr><th>route</th><th>K</th><th>answers</th>"
            "<th>median tokens/s after the first token</th></tr>{}</table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", served)) if served else ""
        if not rows:
            return format_html("{}<p>The workers' step figures: none yet (they time the library's pipelines, where "
                               "plans follow them once a worker has measured the main alone and a K at a load).</p>",
                               answers or "No answer served yet. ")
        return format_html("{}<table><tr><th>worker</th><th>streams up to</th><th>tokens/s, timing the model's steps "
                           "alone</th></tr>"
                           "{}</table>", answers,
                           format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", rows))

    @admin.display(description="calibrations")
    def calibrations(self, pair: ModelPair) -> str:
        """Each host's latest calibration: where the figures the pair is served with come from."""
        shown = [calibrated.summary(c) for c in selectors.pair_calibrations(pair=pair)] if pair.pk else []
        return render_to_string("admin/inference/hostcalibration/summary.html", {"calibrations": shown})

    @admin.display(description="latest benchmark")
    def latest_benchmark(self, pair: ModelPair) -> str:
        if not pair.pk:
            return "-"
        latest = pair.benchmarks.first()
        pending = ""
        if latest and latest.status != BenchmarkRun.Status.FINISHED:
            pending = format_html("<p>Run #{} is {}: {}</p>", latest.id, latest.status,
                                  latest.error or latest.progress or "waiting for a worker")
        return format_html("{}{}", pending, benchmark_html(records.latest_finished_run(pair=pair)))
