from django.contrib import admin

from inference.models import Generation


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    """Answers as records: the speed figures first (rounded as the chat shows them), so they fit at 1280 px."""

    list_display = ("created_at", "pair", "speculative_mode", "speed", "guesses_kept", "kept_per_step",
                    "completion_tokens", "status", "finish_reason", "source", "user")
    list_filter = ("status", "source", "pair", "speculative_mode")
    readonly_fields = [f.name for f in Generation._meta.fields]

    def has_add_permission(self, request):
        return False

    @admin.display(description="tokens/s", ordering="tokens_per_s")
    def speed(self, generation: Generation) -> str:
        return "" if generation.tokens_per_s is None else f"{generation.tokens_per_s:.1f}"

    @admin.display(description="guesses kept", ordering="acceptance_rate")
    def guesses_kept(self, generation: Generation) -> str:
        return "" if generation.acceptance_rate is None else f"{generation.acceptance_rate:.0%}"

    @admin.display(description="tokens a step", ordering="mean_accepted_length")
    def kept_per_step(self, generation: Generation) -> str:
        return "" if generation.mean_accepted_length is None else f"{generation.mean_accepted_length:.2f}"
