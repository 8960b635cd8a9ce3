import json

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from inference.demo import SLUG, main_model
from inference.models import ModelPair


class Command(BaseCommand):
    help = ("Register (or refresh) the shipped demo pair from inference/models/demo-code/pair.json. Its main is "
            "built from the committed one first if needed (a few seconds, no torch); --main small registers the "
            "committed 62 M-parameter main instead (the test suite's pair).")

    def add_arguments(self, parser):
        parser.add_argument("--main", choices=("large", "small"), default="large")

    def handle(self, *args, main: str, **options):
        folder = settings.MODELS_ROOT / settings.DEMO_PAIR_DIR
        info = json.loads((folder / "pair.json").read_text()) if (folder / "pair.json").exists() else {}
        measured = info.get("measured_large" if main == "large" else "measured", {})
        if main == "large":
            main_model.build(out=self.stdout.write)
        pair = ModelPair.objects.filter(slug=SLUG).first() or ModelPair(slug=SLUG)
        pair.name = "Demo (tiny, not a real model)"
        pair.description = ("A tiny model trained only to show how the app works: its answers are nonsense. It "
                            "continues Python code: type the start of a function (its def line). For real answers "
                            "pick a real model, which an admin installs.")
        pair.completes_text = True
        pair.is_default = pair.is_default or not ModelPair.objects.filter(is_default=True).exists()
        pair.main_dir = f"{settings.DEMO_PAIR_DIR}/{main_model.TARGET.name if main == 'large' else 'main'}"
        pair.draft_dir = f"{settings.DEMO_PAIR_DIR}/draft"
        pair.num_assistant_tokens = measured.get("best_k") or 4
        pair.speculation_profile = measured.get("profile", {})
        pair.inference_precision = info.get("recommended", {}).get("inference_precision", "f32")
        pair.kv_cache_precision = info.get("recommended", {}).get("kv_cache_precision", "f32")
        try:
            pair.full_clean()
        except ValidationError as exc:
            raise CommandError(f"The demo pair cannot be registered: {exc.message_dict}") from exc
        pair.save()
        self.stdout.write(f"registered pair '{pair.slug}' ({pair.main_dir} + {pair.draft_dir}, "
                          f"K={pair.num_assistant_tokens})")
