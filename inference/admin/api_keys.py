from django.contrib import admin
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers

from inference.api.auth import set_new_key
from inference.models import ApiKey, ModelPair


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
