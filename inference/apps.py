from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    verbose_name = "Inference: pairs and generations"
    default_auto_field = "django.db.models.BigAutoField"

