from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.cache import add_never_cache_headers

from inference.api.auth import set_new_key
from inference.models import ApiKey, ModelPair

SHOWN_ONCE = "api_key_shown_once"  # session key: a new key's id and secret, until its "created" page is seen


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Creating a key generates it; only its hash is stored, so its secret is shown once. The add form's POST
    redirects to the key's "created" page (a reload there must not make a second key), which takes the secret out
    of the session, server-side, on its first view and is marked never to be cached. Not in a message: Django keeps
    messages in a signed but readable cookie, which proxies and logs keep."""

    list_display = ("name", "prefix", "user", "max_concurrent", "revoked", "created_at", "last_used_at")
    list_filter = ("revoked",)
    readonly_fields = ("prefix", "created_at", "last_used_at")

    def save_model(self, request, obj, form, change):
        if not change:
            request.new_api_key_secret = set_new_key(obj)  # read by response_add, in this request only
        super().save_model(request, obj, form, change)

    def response_add(self, request, obj, post_url_continue=None):
        request.session[SHOWN_ONCE] = {"key": obj.pk, "secret": request.new_api_key_secret}
        return HttpResponseRedirect(reverse("admin:inference_apikey_created", args=[obj.pk]))

    def get_urls(self):
        return [path("<int:key_id>/created/", self.admin_site.admin_view(self.created),
                     name="inference_apikey_created"), *super().get_urls()]

    def created(self, request, key_id: int):
        key = get_object_or_404(ApiKey, pk=key_id)
        if not self.has_view_permission(request, key):
            raise PermissionDenied
        shown = request.session.get(SHOWN_ONCE) or {}
        secret = shown.get("secret") if shown.get("key") == key.pk else None
        if secret:
            del request.session[SHOWN_ONCE]
        pair = ModelPair.objects.filter(enabled=True).order_by("-is_default", "name").first()
        response = TemplateResponse(request, "admin/inference/apikey/created.html", {
            **self.admin_site.each_context(request), "title": f"API key '{key.name}' created",
            "key": key, "secret": secret, "opts": self.model._meta,
            "base_url": request.build_absolute_uri("/").rstrip("/"), "model": pair.slug if pair else "<model>"})
        add_never_cache_headers(response)
        return response
