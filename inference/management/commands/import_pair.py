import sys

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from inference.celery_worker import worker_command_line
from inference.models import ImportJob, ModelPair
from inference.pairs import importer


class Command(BaseCommand):
    help = ("Export a main model and its draft (Hugging Face ids, local folders or GGUF files) to OpenVINO IR under "
            "the models root and register the pair. Needs the train extra (torch, transformers, optimum-intel).")

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="Display name of the pair.")
        parser.add_argument("--slug", required=True, help="The `model` name API clients use; also the folder name.")
        parser.add_argument("--main", required=True, help="Hugging Face id, local folder or GGUF file of the main.")
        parser.add_argument("--draft", default="", help="Hugging Face id, local folder or GGUF file of the draft.")
        parser.add_argument("--weight-format", choices=importer.WEIGHT_FORMATS, default="int8")
        parser.add_argument("--draft-weight-format", choices=importer.WEIGHT_FORMATS, default="",
                            help="The draft's own weight format (default: --weight-format).")
        parser.add_argument("--draft-alternative-format", choices=importer.WEIGHT_FORMATS, default="",
                            help="The draft exported in this format too: each host's calibration times a token of "
                                 "both and the own engine loads the cheaper.")
        parser.add_argument("--main-sha256", default="", help="The main GGUF file's published sha256: other bytes "
                            "are refused.")
        parser.add_argument("--draft-sha256", default="", help="The same for the draft's GGUF file.")
        parser.add_argument("--kv-cache-precision", choices=[v for v in ModelPair.KvPrecision.values if v],
                            default=ModelPair._meta.get_field("kv_cache_precision").default)
        parser.add_argument("--device", choices=ModelPair.Device.values, default=ModelPair.Device.CPU,
                            help="The main's device: one a live worker's OpenVINO runtime lists.")
        parser.add_argument("--draft-device", choices=ModelPair.Device.values, default="",
                            help="The draft's device (default: the main's).")

    def handle(self, *args, name, slug, main, draft, weight_format, draft_weight_format, draft_alternative_format,
               main_sha256, draft_sha256, kv_cache_precision, device, draft_device, **options):
        fields = {"name": name, "slug": slug, "main_source": main, "draft_source": draft,
                  "weight_format": weight_format, "draft_weight_format": draft_weight_format,
                  "draft_alternative_format": draft_alternative_format,
                  "main_sha256": main_sha256, "draft_sha256": draft_sha256,
                  "kv_cache_precision": kv_cache_precision, "device": device, "draft_device": draft_device}
        errors = importer.request_errors(**fields)
        if errors:
            raise CommandError(" ".join(errors.values()))
        job = ImportJob.objects.create(**fields)
        try:
            pair = self._run(job)
        except importer.ImportFailed as exc:
            raise CommandError(str(exc)) from exc
        k = f", K={pair.num_assistant_tokens}" if pair.draft_dir else ""
        formats = weight_format + (f"/{draft_weight_format}" if draft_weight_format else "")
        self.stdout.write(self.style.SUCCESS(
            f"registered pair '{pair.slug}' ({pair.main_dir}{' + ' + pair.draft_dir if pair.draft_dir else ''}, "
            f"{formats}{k}).\nServe it: {worker_command_line(queues=[pair.queue])} "
            f"(or restart manage.py serve)."))

    def _run(self, job: ImportJob) -> ModelPair:
        """A bar on a terminal; in a log (CI, `make real-pair > log`) each new output line once, since a bar's
        redraws would repeat its text on one line there."""
        if not sys.stderr.isatty():
            shown = [""]

            def say(fraction: float, stage: str, line: str) -> None:
                if line != shown[0]:
                    shown[0] = line
                    self.stdout.write(f"{fraction:4.0%} {line}")

            return importer.run_import(job=job, on_progress=say)
        with tqdm(total=100, unit="%", bar_format="{desc} {percentage:3.0f}%|{bar:20}| {elapsed}{postfix}") as bar:
            def show(fraction: float, stage: str, line: str) -> None:
                bar.n = round(100 * fraction)
                bar.set_description_str(stage, refresh=False)
                bar.set_postfix_str(line[:60])

            return importer.run_import(job=job, on_progress=show)
