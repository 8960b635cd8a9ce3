from celery import current_app
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db import transaction
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from inference import selectors, transport
from inference.admin.media import ExtraStyle
from inference.celery_worker import worker_command_line
from inference.models import ImportJob, ModelPair
from inference.pairs import importer


class ImportJobForm(forms.ModelForm):
    weight_format = forms.ChoiceField(choices=[(f, f) for f in importer.WEIGHT_FORMATS], initial="int8")
    draft_weight_format = forms.ChoiceField(choices=[("", "as the main"), *((f, f) for f in importer.WEIGHT_FORMATS)],
                                            required=False, initial="")
    draft_alternative_format = forms.ChoiceField(
        label="Draft also in", choices=[("", "no other format"), *((f, f) for f in importer.WEIGHT_FORMATS)],
        required=False, initial="",
        help_text="The draft exported in this format too: each host's calibration times a token of both and loads "
                  "the cheaper (int4 with AVX-512, int8 with AVX2 on the hosts measured).")
    kv_cache_precision = forms.ChoiceField(choices=ModelPair.KvPrecision.choices, required=False,
                                           initial=ModelPair._meta.get_field("kv_cache_precision").default)
    device = forms.ChoiceField(label="Main device", choices=ModelPair.Device.choices, initial=ModelPair.Device.CPU)
    draft_device = forms.ChoiceField(label="Draft device", choices=ModelPair.DRAFT_DEVICES,
                                     required=False, initial="")

    class Meta:
        model = ImportJob
        fields = ("name", "slug", "main_source", "draft_source", "weight_format", "draft_weight_format",
                  "draft_alternative_format", "main_sha256", "draft_sha256", "kv_cache_precision", "device",
                  "draft_device")
        help_texts = {
            "main_source": "Hugging Face id (downloaded by the worker), a folder or a GGUF file on the worker's "
                           "machine.",
            "draft_source": "The same for the draft; it must share the main's tokenizer. Empty: main alone.",
        }

    def clean(self):
        data = super().clean()
        fields = {name: data.get(name) or "" for name in self.Meta.fields}
        for field, message in importer.request_errors(**fields).items():
            self.add_error(field, message)
        workers = selectors.live_workers(client=transport.sync_client())
        if not any(settings.CONTROL_QUEUE in w.get("queues", []) for w in workers):
            raise forms.ValidationError(
                f"No live worker consumes the '{settings.CONTROL_QUEUE}' queue, so nothing would run this import: "
                f"start one where the train extra is installed "
                f"({worker_command_line(queues=[settings.CONTROL_QUEUE])}), or run manage.py import_pair.")
        return data


@admin.register(ImportJob)
class ImportJobAdmin(admin.ModelAdmin):
    """The "import pair" form: the add form queues the export on a worker, the change page follows it."""

    form = ImportJobForm
    change_form_template = "admin/inference/importjob/change_form.html"  # refreshes while the job runs
    Media = ExtraStyle
    list_display = ("created_at", "name", "slug", "status", "progress", "pair")
    list_filter = ("status",)
    readonly_fields = ("output",)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ImportJobForm.Meta.fields
        return ("status", "progress", "error", "pair", *ImportJobForm.Meta.fields, "created_at", "finished_at",
                "output")

    def get_prepopulated_fields(self, request, obj=None):
        return {"slug": ("name",)} if obj is None else {}

    def has_change_permission(self, request, obj=None):
        return False  # a job is a record; import again under another slug instead

    @admin.display(description="output")
    def output(self, job: ImportJob) -> str:
        return format_html('<pre class="specchat-log">{}</pre>', job.log or "-")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        transaction.on_commit(lambda: current_app.send_task("inference.import_pair", args=[obj.pk],
                                                             queue=settings.CONTROL_QUEUE))

    def response_add(self, request, obj, post_url_continue=None):
        messages.info(request, f"Import of '{obj.slug}' queued; this page follows its progress.")
        return HttpResponseRedirect(reverse("admin:inference_importjob_change", args=[obj.pk]))
