from django.contrib import admin
from django.db.models import ExpressionWrapper, F, FloatField
from django.db.models.functions import Coalesce, NullIf
from django.utils import timezone

from inference.models import Generation


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    """Answers as records: the speed figures first (rounded as the chat shows them) and few short columns, so that
    they fit beside the filters at 1280 px; the rest (tokens, finish reason, source, user) on each answer's page."""

    list_display = ("when", "pair_slug", "speed", "guesses_kept", "kept_per_step", "speculative_mode", "status")
    list_select_related = ("pair",)
    list_filter = ("status", "source", "pair", "speculative_mode")
    readonly_fields = [f.name for f in Generation._meta.fields]

    def has_add_permission(self, request):
        return False

    @admin.display(description="when", ordering="created_at")
    def when(self, generation: Generation) -> str:
        return timezone.localtime(generation.created_at).strftime("%b %d %H:%M")

    @admin.display(description="pair", ordering="pair__slug")
    def pair_slug(self, generation: Generation) -> str:
        return generation.pair.slug

    def get_queryset(self, request):
        """The rate after the first token, as a column the list sorts by (the figure is writing_rate's)."""
        after_first = NullIf(F("duration_ms") - Coalesce(F("ttft_ms"), 0.0), 0.0)
        return super().get_queryset(request).annotate(writing_rate=ExpressionWrapper(
            (F("completion_tokens") - 1) * 1000.0 / after_first, output_field=FloatField()))

    @admin.display(description="tok/s", ordering="writing_rate")
    def speed(self, generation: Generation) -> str:
        """After the first token, as the chat's line says it (the wait is the answer's own figure on its page)."""
        rate = generation.writing_tokens_per_s
        return "" if rate is None else f"{rate:.1f}"

    @admin.display(description="kept", ordering="acceptance_rate")
    def guesses_kept(self, generation: Generation) -> str:
        """The share of guessed tokens the main kept."""
        return "" if generation.acceptance_rate is None else f"{generation.acceptance_rate:.0%}"

    @admin.display(description="a step", ordering="mean_accepted_length")
    def kept_per_step(self, generation: Generation) -> str:
        """Tokens a verify delivered on average."""
        return "" if generation.mean_accepted_length is None else f"{generation.mean_accepted_length:.2f}"
