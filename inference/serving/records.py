"""What both sides of a generation share: the engine spec a pair resolves to, the one way a
generation is failed (the web side fails stalled ones, workers fail their own and orphans), and the
final write of an answer, retried with fresh connections so a database that is briefly away (SQLite
locked, PostgreSQL restarting) does not leave it `running` forever."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from inference import limits, selectors, transport
from inference.engines.decoding import DecodingParams
from inference.engines.spec import HEAD_IDS_FILE, PairSpec
from inference.limits import FinishReason, Route
from inference.models import Generation, ModelPair
from inference.serving import precision
from inference.serving.planning import HostFigures, Plan, pair_default_route

log = logging.getLogger(__name__)
T = TypeVar("T")
NOT_SAVED = "This answer could not be saved (the database did not answer): send it again."


def engine_route(*, pair: ModelPair, route: Route) -> Route:
    """The route of the engine that serves `route` on the pair: its own engine serves both of its routes (its spec
    says Route.OWN_SPECULATIVE, so the two share one engine); the library's speculative route is the pair's draft
    or its prompt lookup, or its main alone without either."""
    if route.is_own_engine() and pair.draft_dir:
        return Route.OWN_SPECULATIVE
    if route == Route.LIBRARY_MAIN_ALONE or not pair.is_speculative:
        return Route.LIBRARY_MAIN_ALONE
    return Route.LIBRARY_SPECULATIVE if pair.draft_dir else Route.PROMPT_LOOKUP


def pair_spec(*, pair: ModelPair, route: Route = Route.LIBRARY_SPECULATIVE,
              calibration: HostFigures | None = None) -> PairSpec:
    """The spec of the engine that serves a route of the pair (engine_route). On a calibrated host the main alone
    and the own engine run in the precision measured fastest there (the library's speculation keeps the pair's
    own: its greedy answers are exact only in f32)."""
    root = Path(settings.MODELS_ROOT)
    own = route.is_own_engine()  # whose main alone is its batch, beside the draft
    head_ids = root / pair.draft_dir / HEAD_IDS_FILE if pair.draft_dir else None  # `make real-pair` writes it
    spec = PairSpec(
        slug=pair.slug,
        main_dir=str(root / pair.main_dir),
        draft_dir=str(root / pair.draft_dir) if pair.draft_dir else "",
        route=engine_route(pair=pair, route=route),
        pair_default=engine_route(pair=pair, route=pair_default_route(pair)),
        device=pair.device,
        draft_device=pair.draft_device,
        cache_size_gb=pair.cache_size_gb,
        max_num_batched_tokens=pair.max_num_batched_tokens,
        prefill_first=pair.prefill_first,
        inference_precision=pair.inference_precision,
        kv_cache_precision=pair.kv_cache_precision,
        speculating_streams=pair.own_engine_streams if pair.draft_dir else 0,
        kv_pool_mb=settings.KV_POOL_MB,
        prefix_caching=settings.PREFIX_CACHING,
        main_rows=settings.MAIN_ROWS,
        dynamic_quantization=bool(pair.own_engine_streams) and own,
        draft_head_ids=str(head_ids) if head_ids and head_ids.is_file() else "",  # read by the own engine alone
        draft_alternative_dir=str(root / pair.draft_alternative_dir) if pair.draft_alternative_dir else "",
    )
    if calibration is None or not calibration.calibrated or (route.speculates() and not own):
        return spec
    if own and calibration.draft_alternative and spec.draft_alternative_dir:
        spec = replace(spec, draft_dir=spec.draft_alternative_dir)  # the cheaper draft token on this host
    config = precision.CONFIGS.get(calibration.own_config if own else calibration.main_alone_config)
    return replace(spec, **config.fields) if config else spec


def planned_decoding(params: DecodingParams, planned: Plan) -> DecodingParams:
    """A request's decoding settings with the speculation its plan chose (none: the main alone)."""
    return replace(params, speculation=planned.speculation)


def with_fresh_connections(write: Callable[[], T], *, what: str) -> T:
    """`write()`, tried again on a fresh connection while the database errors, for up to
    FINAL_WRITE_RETRY_S; then its error is raised. Not retried inside a transaction (its connection
    cannot be replaced there)."""
    deadline = time.monotonic() + settings.FINAL_WRITE_RETRY_S
    pause = 0.2
    while True:
        try:
            return write()
        except (OperationalError, InterfaceError):
            if connection.in_atomic_block or time.monotonic() + pause > deadline:
                raise
            log.warning("%s failed: trying again on a fresh connection", what, exc_info=True)
        with suppress(DatabaseError):
            connection.close()  # the next query opens a new one
        time.sleep(pause)
        pause = min(2 * pause, 2.0)


def reconnecting(func: Callable[..., T]) -> Callable[..., T]:
    """`func`, with this thread's connection dropped when the database errors, so the next call opens a
    new one: Django replaces a broken connection only between requests, and a stream or a chat socket
    is one long request (a PostgreSQL restart ends every connection)."""
    @functools.wraps(func)
    def call(*args, **kwargs) -> T:
        try:
            return func(*args, **kwargs)
        except DatabaseError:
            if not connection.in_atomic_block:
                with suppress(DatabaseError):
                    connection.close()
            raise
    return call


def finish_generation(*, generation_id, status: str, **fields) -> bool:
    """The answer's record written as it ended (retried, see with_fresh_connections); False if it was no
    longer running (failed meanwhile by another process). Raises DatabaseError if it cannot be written."""
    return bool(with_fresh_connections(
        lambda: Generation.objects.filter(id=generation_id, status=Generation.Status.RUNNING).update(
            status=status, **fields),
        what=f"the final write of generation {generation_id}"))


def fail_generation(*, generation_id, message: str) -> str | None:
    """Mark a generation failed and put the error on its stream; None if it had already ended. If the
    database cannot be written (retried first), the error still goes on the stream, so its readers end."""
    def write() -> int:
        with transaction.atomic():
            return Generation.objects.filter(
                id=generation_id, status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]
            ).update(status=Generation.Status.FAILED, error=message, finish_reason=FinishReason.ERROR,
                     finished_at=timezone.now())

    try:
        updated = with_fresh_connections(write, what=f"failing generation {generation_id}")
    except DatabaseError:
        log.exception("generation %s could not be marked failed: its readers get the error all the same",
                      generation_id)
        updated = 1
    if not updated:
        return None
    client = transport.sync_client()
    transport.request_cancel(client, generation_id)  # a worker still running it (taken for dead) stops
    return transport.append_event(client, generation_id, {"type": "error", "message": message})


def queue_timeout(slug: str) -> str:
    return f"No worker of '{slug}' picked this answer up within {settings.QUEUE_TIMEOUT_S} s; send it again."


def worker_died(worker: str) -> str:
    return f"The worker running this answer ({worker}) stopped before it finished."


UNSERVED_AFTER_S = 2  # a queued answer whose pair nobody serves is failed after this (heartbeats lag a little)


def stalled_generation_problem(*, generation_id) -> str:
    """Why a generation that sends nothing will never finish, or '' while it may."""
    generation = Generation.objects.select_related("pair").filter(id=generation_id).first()
    if generation is None or generation.is_done:
        return ""
    client = transport.sync_client()
    if not selectors.heartbeats_settled(client=client):
        return ""  # Redis just restarted: the workers have not announced themselves again yet
    if generation.status == Generation.Status.RUNNING:
        if generation.worker and not selectors.worker_is_alive(client=client, name=generation.worker):
            return worker_died(generation.worker)
        return ""
    return queued_problem(pair=generation.pair, waited=(timezone.now() - generation.created_at).total_seconds(),
                          workers=selectors.live_workers(client=client))


def queued_problem(*, pair: ModelPair, waited: float, workers: list[dict]) -> str:
    """Why an answer queued for `waited` seconds will never be picked up, or '' while it may be
    (`workers`: the live workers' heartbeats)."""
    if waited >= settings.QUEUE_TIMEOUT_S:
        return queue_timeout(pair.slug)
    state = selectors.pair_state(pair=pair, workers=workers)
    if not state.served and waited >= UNSERVED_AFTER_S:
        return f"No worker can serve '{pair.slug}': {state.error}."
    if waited >= settings.STALL_TIMEOUT_S and state.state != limits.ServingState.AVAILABLE:
        return f"'{pair.slug}' did not become available within {settings.STALL_TIMEOUT_S} s."
    return ""


def fail_if_stalled(*, generation_id) -> bool:
    """Fail the generation if it will never finish (see stalled_generation_problem); True if it was failed."""
    problem = stalled_generation_problem(generation_id=generation_id)
    if problem:
        fail_generation(generation_id=generation_id, message=problem)
    return bool(problem)
