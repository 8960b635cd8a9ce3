from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chatsite.chat"
    label = "chat"
    default_auto_field = "django.db.models.BigAutoField"
