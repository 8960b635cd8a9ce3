from django.urls import include, path, re_path, register_converter

from inference.api import views
from inference.api.ids import AnswerIdConverter

register_converter(AnswerIdConverter, "answer_id")

versioned = [
    path("completions", views.completions),
    path("chat/completions", views.chat_completions),
    path("completions/<answer_id:generation_id>/events", views.events, {"chat": False}),
    path("chat/completions/<answer_id:generation_id>/events", views.events, {"chat": True}),
    path("completions/<answer_id:generation_id>/cancel", views.cancel, {"chat": False}),
    path("chat/completions/<answer_id:generation_id>/cancel", views.cancel, {"chat": True}),
    path("models", views.models),
    path("config", views.config),
    path("openapi.json", views.openapi_document),
]

urlpatterns = [
    path("v1/", include(versioned)),
    path("v3/", include(versioned)),  # OpenVINO Model Server's prefix, so its clients work unchanged
    path("health", views.health),
    path("metrics", views.metrics),
    re_path(r"^v[13]/", views.not_found),
]
