from django.contrib import admin

from inference.models import Generation


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    list_display = ("created_at", "pair", "source", "user", "status", "finish_reason", "completion_tokens",
                    "speculative_mode", "tokens_per_s", "acceptance_rate", "mean_accepted_length")
    list_filter = ("status", "source", "pair", "speculative_mode")
    readonly_fields = [f.name for f in Generation._meta.fields]

    def has_add_permission(self, request):
        return False
