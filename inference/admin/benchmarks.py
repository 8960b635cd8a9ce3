"""A pair's benchmark runs in the admin: the form that starts one on a worker, the results a finished one shows
(on its own page and the pair's), its plots."""

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import path, reverse

from inference.admin.media import ExtraStyle
from inference.benchmark import records, report, runs
from inference.benchmark.summary import table
from inference.limits import K_MAX, K_MIN
from inference.models import BenchmarkRun

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
             if run and records.plot_file(run=run, name=name)]
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
        file = records.plot_file(run=run, name=name)
        if file is None:
            raise Http404("No such plot for this run.")
        return FileResponse(open(file, "rb"), content_type="image/png")
