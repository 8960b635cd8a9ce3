"""What both sides of a generation share: the engine spec a pair resolves to, and the one way a
generation is failed (the web side fails stalled ones, workers fail their own and orphans)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference import transport
from inference.engines.base import DecodingParams, PairSpec
from inference.models import Generation, ModelPair
from inference.serving.speculation import Plan


def pair_spec(*, pair: ModelPair, speculative: bool = True, exact_sampling: bool = False) -> PairSpec:
    root = Path(settings.MODELS_ROOT)
    return PairSpec(
        slug=pair.slug,
        main_dir=str(root / pair.main_dir),
        draft_dir=str(root / pair.draft_dir) if pair.draft_dir else "",
        prompt_lookup=pair.prompt_lookup,
        device=pair.device,
        cache_size_gb=pair.cache_size_gb,
        max_num_batched_tokens=pair.max_num_batched_tokens,
        prefill_first=pair.prefill_first,
        inference_precision=pair.inference_precision,
        kv_cache_precision=pair.kv_cache_precision,
        speculative=speculative and pair.is_speculative,
        exact_sampling=exact_sampling and speculative and bool(pair.draft_dir),
    )


def planned_decoding(params: DecodingParams, planned: Plan) -> DecodingParams:
    """A request's decoding settings with the K or threshold its plan chose."""
    return replace(params, num_assistant_tokens=planned.k, assistant_confidence_threshold=planned.threshold)


def fail_generation(*, generation_id, message: str) -> str | None:
    """Mark a generation failed and put the error on its stream; None if it had already ended."""
    with transaction.atomic():
        updated = Generation.objects.filter(
            id=generation_id, status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]
        ).update(status=Generation.Status.FAILED, error=message, finish_reason="error", finished_at=timezone.now())
    if not updated:
        return None
    client = transport.sync_client()
    transport.request_cancel(client, generation_id)  # a worker still running it (taken for dead) stops
    return transport.append_event(client, generation_id, {"type": "error", "message": message})


def queue_timeout(slug: str) -> str:
    return f"No worker of '{slug}' picked this answer up within {settings.QUEUE_TIMEOUT_S} s; send it again."


def worker_died(worker: str) -> str:
    return f"The worker running this answer ({worker}) stopped before it finished."
