from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from chatsite.chat import views as chat_views

urlpatterns = [
    path("", chat_views.chat, name="chat"),
    path("c/<int:conversation_id>/", chat_views.chat, name="conversation"),
    path("c/new/", chat_views.new_conversation, name="conversation-new"),
    path("c/search/", chat_views.search, name="conversation-search"),
    path("c/<int:conversation_id>/rename/", chat_views.rename, name="conversation-rename"),
    path("c/<int:conversation_id>/system/", chat_views.system_prompt, name="conversation-system"),
    path("c/<int:conversation_id>/delete/", chat_views.delete, name="conversation-delete"),
    path("m/<int:message_id>/edit/", chat_views.edit, name="message-edit"),
    path("m/<int:message_id>/show/", chat_views.show_version, name="message-show"),
    path("c/<int:conversation_id>/export.md", chat_views.export, {"fmt": "md"}, name="conversation-export-md"),
    path("c/<int:conversation_id>/export.json", chat_views.export, {"fmt": "json"}, name="conversation-export-json"),
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", include("inference.api.urls")),
]
