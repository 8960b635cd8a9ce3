from django.contrib import admin
from django.urls import include, path

from chatsite.chat import views as chat_views

urlpatterns = [
    path("", chat_views.chat, name="chat"),
    path("c/<int:conversation_id>/", chat_views.chat, name="conversation"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", include("inference.api.urls")),
]
