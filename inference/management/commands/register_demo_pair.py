import json

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from inference.models import ModelPair


class Command(BaseCommand):
    help = "Register (or refresh) the shipped demo pair from inference/models/demo-code/pair.json."

    def handle(self, *args, **options):
        folder = settings.MODELS_ROOT / settings.DEMO_PAIR_DIR
        info = json.loads((folder / "pair.json").read_text()) if (folder / "pair.json").exists() else {}
        best_k = info.get("measured", {}).get("best_k") or 4
        pair = ModelPair.objects.filter(slug="demo-code").first() or ModelPair(slug="demo-code")
        pair.name = "Demo code pair"
        pair.main_dir = f"{settings.DEMO_PAIR_DIR}/main"
        pair.draft_dir = f"{settings.DEMO_PAIR_DIR}/draft"
        pair.num_assistant_tokens = pair.num_assistant_tokens or best_k
        pair.inference_precision = info.get("recommended", {}).get("inference_precision", "f32")
        pair.kv_cache_precision = info.get("recommended", {}).get("kv_cache_precision", "f32")
        try:
            pair.full_clean()
        except ValidationError as exc:
            raise CommandError(f"The demo pair cannot be registered: {exc.message_dict}") from exc
        pair.save()
        self.stdout.write(f"registered pair '{pair.slug}' ({pair.main_dir} + {pair.draft_dir}, K={pair.num_assistant_tokens})")
