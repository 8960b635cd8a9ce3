from celery import current_app
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import FileResponse, Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html, format_html_join

from inference import selectors, transport
from inference.api.auth import set_new_key
from inference.benchmark import report, runs
from inference.benchmark.summary import table
from inference.celery_worker import worker_command_line
from inference.limits import K_MAX, K_MIN
from inference.models import ApiKey, BenchmarkRun, Generation, ImportJob, JobStatus, ModelPair
from inference.pairs import importer
from inference.serving import calibrated


class ExtraStyle:
    """The styles of what these admin pages add: a file rather than inline styles (see chatsite/csp.py)."""

    css = {"all": ["admin-extra.css"]}


@admin.register(ModelPair)
class ModelPairAdmin(admin.ModelAdmin):
    # The list an operator scans: what each pair is, whether it serves, what speculation gains on its host, and
    # the one thing to do next; the settings are on each pair's page.
    list_display = ("name", "serving_state", "speedup_here", "is_default", "enabled", "next_step")
    list_filter = ("enabled", "device")
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("serving_state", "load_error", "load_reported_at", "created_at", "latest_benchmark",
                       "profile_run", "live_figures", "precision_mode", "calibrations")
    actions = ("load_on_worker", "unload_from_worker", "run_benchmark", "calibrate")
    change_form_template = "admin/inference/modelpair/change_form.html"  # Benchmark and Calibrate buttons on top
    Media = ExtraStyle
    # The first screen is what an operator needs (state, the host's verdict and its table); the settings are folded.
    fieldsets = (
        (None, {"fields": ("name", "serving_state", "load_error", "enabled", "is_default")}),
        ("Speed on its hosts", {"fields": ("calibrations", "live_figures")}),
        ("What it is", {"classes": ["collapse"], "fields": ("slug", "description", "completes_text")}),
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

    @admin.display(description="speed-up on its host")
    def speedup_here(self, pair: ModelPair) -> str:
        """The newest finished calibration's verdict, in one figure: a lone answer with the draft against the
        fastest main alone there."""
        calibration = pair.calibrations.filter(status=JobStatus.FINISHED).order_by("-finished_at").first()
        shown = calibrated.summary(calibration) if calibration else {}
        if shown.get("speedup"):
            return f"{shown['speedup']:.2f}x (K={shown['best_k']})"
        return "main alone faster" if shown.get("verdict") else "not calibrated yet"

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
        self.calibrate(request, ModelPair.objects.filter(pk=pair_id))
        return HttpResponseRedirect(reverse("admin:inference_modelpair_change", args=[pair_id]))

    def benchmark_one(self, request, pair_id: int):
        """The pair page's Benchmark button: the bulk action's form, for this pair."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        pairs = ModelPair.objects.filter(pk=pair_id)
        if not pairs.exists():
            raise Http404("No such pair")
        answer = self.run_benchmark(request, pairs)
        return answer or HttpResponseRedirect(reverse("admin:inference_modelpair_change", args=[pair_id]))

    @admin.display(description="measured lately on the workers")
    def live_figures(self, pair: ModelPair) -> str:
        """What each worker's plans follow where it measured the main alone and a K (serving/rates.py)."""
        rows = [(beat["name"], streams, ", ".join(f"{'the main alone' if k == '0' else 'K=' + k} {rate:.0f} tok/s"
                                                   for k, rate in sorted(by_k.items(), key=lambda item: int(item[0]))))
                for beat in selectors.live_workers(client=transport.sync_client())
                for streams, by_k in sorted(beat.get("figures", {}).get(pair.slug, {}).items(),
                                            key=lambda item: int(item[0]))]
        served = [(way["route"], "-" if way["k"] is None else way["k"], way["answers"],
                   f"{way['median_tokens_per_s']:.1f}") for way in selectors.answers_served_lately(pair=pair)]
        answers = format_html(
            "<p>The last answers served, by how:</p><table><tr><th>route</th><th>K</th><th>answers</th>"
            "<th>median tok/s</th></tr>{}</table>", format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td>"
                                                                         "<td>{}</td></tr>", served)) if served else ""
        if not rows:
            return format_html("{}<p>The workers' step figures: none yet (they time the library's pipelines, where "
                               "plans follow them once a worker has measured the main alone and a K at a load).</p>",
                               answers or "No answer served yet. ")
        return format_html("{}<table><tr><th>worker</th><th>streams up to</th><th>tokens/s of step time</th></tr>"
                           "{}</table>", answers,
                           format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", rows))

    @admin.action(description="Load on every live worker (no restart)", permissions=["change"])
    def load_on_worker(self, request, queryset):
        self._control(request, queryset, "load")

    @admin.action(description="Unload from every live worker", permissions=["change"])
    def unload_from_worker(self, request, queryset):
        self._control(request, queryset, "unload")

    def _control(self, request, queryset, command: str):
        for pair in queryset:
            received = transport.send_control(transport.sync_client(), command=command, slug=pair.slug)
            if received:
                messages.info(request, f"{pair.slug}: {received} worker(s) received it; the state column follows.")
            else:
                messages.error(request, f"{pair.slug}: no live worker answered.")


    @staticmethod
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
    def calibrate(self, request, queryset):
        for pair in self._served(request, queryset, doing="calibrating"):
            calibrated.start_calibration(pair=pair)
            messages.info(request, f"Calibration of {pair.slug} queued on its worker: its page shows the progress.")

    @admin.display(description="calibrations")
    def calibrations(self, pair: ModelPair) -> str:
        """Each host's latest calibration: where the figures the pair is served with come from."""
        shown = [calibrated.summary(c) for c in selectors.pair_calibrations(pair=pair)] if pair.pk else []
        return render_to_string("admin/inference/hostcalibration/summary.html", {"calibrations": shown})

    @admin.action(description="Run benchmark on a worker", permissions=["change"])
    def run_benchmark(self, request, queryset):
        """First shows BenchmarkForm; its submission queues one run per selected pair."""
        form = BenchmarkForm(request.POST if "apply" in request.POST else None)
        if not form.is_bound or not form.is_valid():
            return TemplateResponse(request, "admin/inference/benchmarkrun/start.html", {
                **self.admin_site.each_context(request), "title": "Run benchmark on a worker", "form": form,
                "pairs": queryset, "opts": self.model._meta, "action_checkbox_name": ACTION_CHECKBOX_NAME})
        for pair in self._served(request, queryset, doing="benchmarking"):
            run = runs.start_benchmark_run(pair=pair, options=form.cleaned_data["options"])
            messages.info(request, format_html('Benchmark of {} queued on its worker: <a href="{}">run #{}</a>.',
                                               pair.slug, reverse("admin:inference_benchmarkrun_change",
                                                                  args=[run.id]), run.id))
        return None

    @admin.display(description="latest benchmark")
    def latest_benchmark(self, pair: ModelPair) -> str:
        if not pair.pk:
            return "-"
        latest = pair.benchmarks.first()
        pending = ""
        if latest and latest.status != BenchmarkRun.Status.FINISHED:
            pending = format_html("<p>Run #{} is {}: {}</p>", latest.id, latest.status,
                                  latest.error or latest.progress or "waiting for a worker")
        return format_html("{}{}", pending, benchmark_html(runs.latest_finished_run(pair=pair)))


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    list_display = ("created_at", "pair", "source", "user", "status", "finish_reason", "completion_tokens",
                    "speculative_mode", "tokens_per_s", "acceptance_rate", "mean_accepted_length")
    list_filter = ("status", "source", "pair", "speculative_mode")
    readonly_fields = [f.name for f in Generation._meta.fields]

    def has_add_permission(self, request):
        return False


class ImportJobForm(forms.ModelForm):
    weight_format = forms.ChoiceField(choices=[(f, f) for f in importer.WEIGHT_FORMATS], initial="int8")
    draft_weight_format = forms.ChoiceField(choices=[("", "as the main"), *((f, f) for f in importer.WEIGHT_FORMATS)],
                                            required=False, initial="")
    draft_alternative_format = forms.ChoiceField(
        label="Draft also in", choices=[("", "no other format"), *((f, f) for f in importer.WEIGHT_FORMATS)],
        required=False, initial="",
        help_text="The draft exported in this format too: each host's calibration times a token of both and loads "
                  "the cheaper (int4 with AVX-512, int8 with AVX2 on the hosts measured).")
    kv_cache_precision = forms.ChoiceField(choices=ModelPair.KvPrecision.choices, required=False,
                                           initial=ModelPair._meta.get_field("kv_cache_precision").default)
    device = forms.ChoiceField(label="Main device", choices=ModelPair.Device.choices, initial=ModelPair.Device.CPU)
    draft_device = forms.ChoiceField(label="Draft device", choices=ModelPair.DRAFT_DEVICES,
                                     required=False, initial="")

    class Meta:
        model = ImportJob
        fields = ("name", "slug", "main_source", "draft_source", "weight_format", "draft_weight_format",
                  "draft_alternative_format", "main_sha256", "draft_sha256", "kv_cache_precision", "device",
                  "draft_device")
        help_texts = {
            "main_source": "Hugging Face id (downloaded by the worker), a folder or a GGUF file on the worker's "
                           "machine.",
            "draft_source": "The same for the draft; it must share the main's tokenizer. Empty: main alone.",
        }

    def clean(self):
        data = super().clean()
        fields = {name: data.get(name) or "" for name in self.Meta.fields}
        for field, message in importer.request_errors(**fields).items():
            self.add_error(field, message)
        workers = selectors.live_workers(client=transport.sync_client())
        if not any(settings.CONTROL_QUEUE in w.get("queues", []) for w in workers):
            raise forms.ValidationError(
                f"No live worker consumes the '{settings.CONTROL_QUEUE}' queue, so nothing would run this import: "
                f"start one where the train extra is installed "
                f"({worker_command_line(queues=[settings.CONTROL_QUEUE])}), or run manage.py import_pair.")
        return data


@admin.register(ImportJob)
class ImportJobAdmin(admin.ModelAdmin):
    """The "import pair" form: the add form queues the export on a worker, the change page follows it."""

    form = ImportJobForm
    change_form_template = "admin/inference/importjob/change_form.html"  # refreshes while the job runs
    Media = ExtraStyle
    list_display = ("created_at", "name", "slug", "status", "progress", "pair")
    list_filter = ("status",)
    readonly_fields = ("output",)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ImportJobForm.Meta.fields
        return ("status", "progress", "error", "pair", *ImportJobForm.Meta.fields, "created_at", "finished_at",
                "output")

    def get_prepopulated_fields(self, request, obj=None):
        return {"slug": ("name",)} if obj is None else {}

    def has_change_permission(self, request, obj=None):
        return False  # a job is a record; import again under another slug instead

    @admin.display(description="output")
    def output(self, job: ImportJob) -> str:
        return format_html('<pre class="specchat-log">{}</pre>', job.log or "-")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        transaction.on_commit(lambda: current_app.send_task("inference.import_pair", args=[obj.pk],
                                                             queue=settings.CONTROL_QUEUE))

    def response_add(self, request, obj, post_url_continue=None):
        messages.info(request, f"Import of '{obj.slug}' queued; this page follows its progress.")
        return HttpResponseRedirect(reverse("admin:inference_importjob_change", args=[obj.pk]))


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Creating a key generates it; only its hash is stored, so its secret is shown once: in the answer to
    the add form itself, marked never to be cached. Not in a message: Django keeps messages in a signed
    but readable cookie, which proxies and logs keep."""

    list_display = ("name", "prefix", "user", "max_concurrent", "revoked", "created_at", "last_used_at")
    list_filter = ("revoked",)
    readonly_fields = ("prefix", "created_at", "last_used_at")

    def save_model(self, request, obj, form, change):
        if not change:
            request.new_api_key_secret = set_new_key(obj)  # read by response_add, in this request only
        super().save_model(request, obj, form, change)

    def response_add(self, request, obj, post_url_continue=None):
        pair = ModelPair.objects.filter(enabled=True).order_by("-is_default", "name").first()
        response = TemplateResponse(request, "admin/inference/apikey/created.html", {
            **self.admin_site.each_context(request), "title": f"API key '{obj.name}' created",
            "key": obj, "secret": request.new_api_key_secret, "opts": self.model._meta,
            "base_url": request.build_absolute_uri("/").rstrip("/"), "model": pair.slug if pair else "<model>"})
        add_never_cache_headers(response)
        return response


# ------------------------------------------------------------------ benchmarks
MAX_PROMPTS_PER_SET = 50  # the held-out sets hold at most 16 prompts each
MAX_THRESHOLDS = 10


class BenchmarkForm(forms.Form):
    """What a benchmark started from the admin measures: in-process, on the worker's own engines
    (the stack and the concurrency sweep need `manage.py benchmark`)."""

    _defaults = runs.BenchmarkOptions()
    max_new_tokens = forms.IntegerField(min_value=2, max_value=4096, initial=_defaults.max_new_tokens)
    repeats = forms.IntegerField(min_value=1, max_value=20, initial=_defaults.repeats)
    ks = forms.CharField(initial="1-8", max_length=200,
                         help_text=f"K values, e.g. 1-8 or 2,4,6 (each {K_MIN}-{K_MAX}).")
    thresholds = forms.CharField(initial=",".join(f"{t:g}" for t in _defaults.thresholds), required=False,
                                 max_length=200, help_text="Confidence thresholds, e.g. 0.3,0.5; empty for none.")
    prompts_per_set = forms.IntegerField(min_value=1, max_value=MAX_PROMPTS_PER_SET, initial=_defaults.prompts_per_set,
                                         help_text="Held-out prompts from each of the code and prose sets.")

    def clean_ks(self) -> tuple[int, ...]:
        """Each range's bounds are checked before it is expanded: `1-2000000` made 2 million K values
        (107 MiB) in the web process."""
        values: list[int] = []
        for part in filter(None, self.cleaned_data["ks"].replace(" ", "").split(",")):
            low, _, high = part.partition("-")
            try:
                first, last = int(low), int(high or low)
            except ValueError:
                raise forms.ValidationError(
                    f"Invalid options: {part[:20]!r} is neither a K nor a range such as 1-8.") from None
            if not K_MIN <= first <= last <= K_MAX:
                raise forms.ValidationError(
                    f"Invalid options: K values must be within {K_MIN}-{K_MAX}, low to high: not {part[:20]}.")
            values += [k for k in range(first, last + 1) if k not in values]
        if not values:
            raise forms.ValidationError("Invalid options: name at least one K.")
        return tuple(values)

    def clean_thresholds(self) -> tuple[float, ...]:
        try:
            values = runs.float_list(self.cleaned_data["thresholds"])
        except ValueError:
            raise forms.ValidationError("Invalid options: thresholds are numbers in (0, 1), e.g. 0.3,0.5.") from None
        if len(values) > MAX_THRESHOLDS or not all(0 < t < 1 for t in values):
            raise forms.ValidationError(f"Invalid options: at most {MAX_THRESHOLDS} thresholds, each in (0, 1).")
        return values

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            data["options"] = runs.BenchmarkOptions(
                max_new_tokens=data["max_new_tokens"], repeats=data["repeats"], ks=data["ks"],
                thresholds=data["thresholds"], prompts_per_set=data["prompts_per_set"],
                clients=(), concurrency=())
        except ValueError as exc:
            raise forms.ValidationError(f"Invalid options: {exc}") from exc
        return data


def benchmark_html(run: BenchmarkRun | None) -> str:
    """A finished run's tables, bars and plots (served by BenchmarkRunAdmin.plot)."""
    results = run.results if run else {}
    tables = []
    if results:
        tables.append(("Variants", table([r for r in results["rows"] if not r["set"]])))
        if results.get("by_set"):
            tables.append(("In-process by prompt set", table(results["by_set"], report.SET_COLUMNS)))
        if results.get("ttft_profile"):
            tables.append(("Where the stack's TTFT goes (p50, ms)",
                           table(results["ttft_profile"], report.PROFILE_COLUMNS)))
        if results.get("concurrency"):
            tables.append(("Concurrency", table(results["concurrency"], report.CONCURRENCY_COLUMNS)))
        if results.get("steady"):
            tables.append((report.STEADY_TITLE, table(results["steady"], report.STEADY_COLUMNS)))
    plots = [reverse("admin:inference_benchmarkrun_plot", args=[run.id, name]) for name in report.PLOTS
             if run and runs.plot_file(run=run, name=name)]
    return render_to_string("admin/inference/benchmarkrun/report.html", {
        "run": run if results else None, "results": results, "tables": tables, "plots": plots,
        "bars": [report.bar_line(b) for b in results.get("bars", [])]})


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(admin.ModelAdmin):
    list_display = ("created_at", "pair", "status", "progress", "finished_at")
    list_filter = ("status", "pair")
    Media = ExtraStyle
    fields = ("pair", "status", "progress", "error", "options", "report_dir", "created_at", "finished_at", "report")
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # started from the pair list ("Run benchmark on a worker") or manage.py benchmark

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="results")
    def report(self, run: BenchmarkRun) -> str:
        return benchmark_html(run if run.status == BenchmarkRun.Status.FINISHED else None)

    def get_urls(self):
        plot = path("<int:run_id>/plot/<str:name>", self.admin_site.admin_view(self.plot),
                    name="inference_benchmarkrun_plot")
        return [plot, *super().get_urls()]

    def plot(self, request, run_id: int, name: str):
        run = get_object_or_404(BenchmarkRun, id=run_id)
        if not self.has_view_permission(request, run):
            raise PermissionDenied
        file = runs.plot_file(run=run, name=name)
        if file is None:
            raise Http404("No such plot for this run.")
        return FileResponse(open(file, "rb"), content_type="image/png")



