"""Prometheus metrics, named like vLLM's so existing dashboards fit.

Generations end in Celery workers while /metrics is served by the web process, so the counters and
histograms live in one Redis hash that workers increment (HINCRBYFLOAT is atomic across
processes) and the web process renders. Each field is a Prometheus sample name with its labels;
histogram buckets are stored cumulative, as the text format wants them. The queue gauges are read
from the database when scraped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from django.db.models import Count

from inference.limits import Drafter, FinishReason
from inference.models import Generation
from inference.selectors import live_workers
from inference.transport import METRICS_KEY

if TYPE_CHECKING:
    from inference.engines.speculation_stats import SpeculationFigures

log = logging.getLogger(__name__)

# vLLM's buckets for the same histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)
# ours -> vLLM's finished_reason
FINISH_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.STOPPED: "abort",
                  FinishReason.REPEATING: "abort"}


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # counter, histogram or gauge
    help: str


FAMILIES = (
    Family("vllm:request_success", "counter",
           "Generations that ended, by finished_reason (abort: stopped by the client)."),
    Family("specchat_request_errors", "counter", "Generations that ended in an engine error."),
    Family("vllm:prompt_tokens", "counter", "Prompt tokens processed."),
    Family("vllm:generation_tokens", "counter", "Tokens generated."),
    Family("vllm:prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache."),
    Family("vllm:prefix_cache_hits", "counter", "Prompt tokens found in the prefix cache (not prefilled again)."),
    Family("specchat_prefix_cache_bytes", "gauge",
           "Bytes a worker's KV pools hold cached for prompts to come, for a pair (the own engine's main and draft; "
           "within SPECCHAT_KV_POOL_MB)."),
    Family("specchat_kv_blocks_held", "gauge",
           "KV blocks a worker's running answers hold for a pair (the own engine's pools; 0 when none runs)."),
    Family("vllm:time_to_first_token_seconds", "histogram",
           "Time from the request entering the batch to its first token."),
    Family("vllm:time_per_output_token_seconds", "histogram",
           "Mean time per output token after the first, observed once per output token."),
    Family("vllm:e2e_request_latency_seconds", "histogram",
           "Time from the request entering the batch to its last token."),
    Family("vllm:spec_decode_num_drafts", "counter", "Main-model steps that verified a speculation."),
    Family("vllm:spec_decode_num_draft_tokens", "counter",
           "Tokens proposed by the draft (fixed-K requests only: the confidence-threshold mode does not report them)."),
    Family("vllm:spec_decode_num_accepted_tokens", "counter", "Proposed tokens the main model accepted."),
    Family("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
           "Accepted tokens by their position in the speculation (0 = first proposed token)."),
    Family("specchat_spec_decode_num_drafts_by_drafter", "counter",
           "vllm:spec_decode_num_drafts by what proposed (drafter: draft, the draft model, or ngram, the lookup of "
           "the answer's own history)."),
    Family("specchat_spec_decode_num_draft_tokens_by_drafter", "counter",
           "vllm:spec_decode_num_draft_tokens by what proposed them (drafter: draft or ngram)."),
    Family("specchat_spec_decode_num_accepted_tokens_by_drafter", "counter",
           "vllm:spec_decode_num_accepted_tokens by what proposed them (drafter: draft or ngram)."),
    Family("specchat_requests_by_mode", "counter",
           "Generations by how they were served: speculative mode and the K chosen (asked, measured best at the "
           "worker's load, or the pair's default)."),
    Family("specchat_live_tokens_per_second", "gauge",
           "Tokens per second of step time a worker's engines delivered lately, by K (0: the main alone) and "
           "streams bucket: the figures its plans follow where both the main alone and a K are measured."),
    Family("specchat_routed_requests", "counter",
           "Generations the web side sent to a worker, by how it chose (by: cache, the worker holding most of the "
           "prompt's blocks; load, the least busy; shared, the pair's queue, no worker known)."),
    Family("specchat_worker_prompt_tokens", "counter", "vllm:prompt_tokens by the worker that served them."),
    Family("specchat_worker_cached_prompt_tokens", "counter",
           "vllm:prefix_cache_hits by the worker that served them: over specchat_worker_prompt_tokens, the cache "
           "share of each worker's prompts."),
    Family("vllm:num_requests_running", "gauge", "Generations running on a worker."),
    Family("vllm:num_requests_waiting", "gauge", "Generations queued for a worker."),
)
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def _sample(name: str, labels: dict[str, str]) -> str:
    def escape(value: str) -> str:
        return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    inner = ",".join(f'{key}="{escape(value)}"' for key, value in labels.items())
    return f"{name}{{{inner}}}" if inner else name


def _observe(pipe, name: str, labels: dict, buckets: tuple[float, ...], value: float, times: int = 1) -> None:
    for bound in buckets:  # every bucket, by 0 when above the value, so each series has all of them
        pipe.hincrbyfloat(METRICS_KEY, _sample(f"{name}_bucket", {**labels, "le": repr(bound)}),
                          times if value <= bound else 0)
    pipe.hincrbyfloat(METRICS_KEY, _sample(f"{name}_bucket", {**labels, "le": "+Inf"}), times)
    pipe.hincrbyfloat(METRICS_KEY, _sample(f"{name}_sum", labels), value * times)
    pipe.hincrbyfloat(METRICS_KEY, _sample(f"{name}_count", labels), times)


def count_route(*, client: redis.Redis, pair: str, by: str) -> None:
    """Count one routed generation (web side). Never raises: metrics must not refuse a request."""
    try:
        client.hincrbyfloat(METRICS_KEY, _sample("specchat_routed_requests_total", {"model_name": pair, "by": by}), 1)
    except redis.RedisError:
        log.exception("could not count a routed generation of %s", pair)


def record_generation(*, client: redis.Redis, pair: str, finish_reason: FinishReason, prompt_tokens: int,
                      cached_tokens: int, figures: SpeculationFigures, mode: str, k: int | None,
                      worker: str = "") -> None:
    """Count one ended generation (worker side). Never raises: metrics must not break a generation."""
    labels = {"model_name": pair}
    try:
        pipe = client.pipeline(transaction=False)

        def count(name: str, value: float, extra: dict | None = None) -> None:
            pipe.hincrbyfloat(METRICS_KEY, _sample(f"{name}_total", {**labels, **(extra or {})}), value)

        if finish_reason in FINISH_REASONS:
            count("vllm:request_success", 1, {"finished_reason": FINISH_REASONS[finish_reason]})
        else:
            count("specchat_request_errors", 1)
        count("specchat_requests_by_mode", 1, {"mode": mode, "k": str(k) if k is not None else ""})
        tokens = figures.completion_tokens
        count("vllm:prompt_tokens", prompt_tokens)
        count("vllm:prefix_cache_queries", prompt_tokens)
        count("vllm:prefix_cache_hits", cached_tokens)
        if worker:
            count("specchat_worker_prompt_tokens", prompt_tokens, {"worker": worker})
            count("specchat_worker_cached_prompt_tokens", cached_tokens, {"worker": worker})
        count("vllm:generation_tokens", tokens)
        if figures.ttft_ms is not None:
            ttft = figures.ttft_ms / 1000
            _observe(pipe, "vllm:time_to_first_token_seconds", labels, TTFT_BUCKETS, ttft)
            _observe(pipe, "vllm:e2e_request_latency_seconds", labels, E2E_BUCKETS, figures.duration_ms / 1000)
            if tokens > 1:
                per_token = (figures.duration_ms / 1000 - ttft) / (tokens - 1)
                _observe(pipe, "vllm:time_per_output_token_seconds", labels, TPOT_BUCKETS, per_token, tokens - 1)
        if figures.accepted_tokens is not None:
            count("vllm:spec_decode_num_drafts", figures.draft_steps or 0)
            count("vllm:spec_decode_num_accepted_tokens", figures.accepted_tokens)
            if figures.draft_tokens is not None:
                count("vllm:spec_decode_num_draft_tokens", figures.draft_tokens)
            for position, accepted in enumerate(figures.accepted_by_position):
                count("vllm:spec_decode_num_accepted_tokens_per_pos", accepted, {"position": str(position)})
            _count_by_drafter(count, figures)
        pipe.execute()
    except Exception:
        log.exception("could not record the metrics of a generation of %s", pair)


def _count_by_drafter(count: Callable[[str, float, dict], None], figures: SpeculationFigures) -> None:
    """The speculation counts split between the n-gram lookup and the draft model (the rest)."""
    shares = (("num_drafts", figures.draft_steps or 0, figures.ngram_draft_steps),
              ("num_draft_tokens", figures.draft_tokens, figures.ngram_draft_tokens),
              ("num_accepted_tokens", figures.accepted_tokens, figures.ngram_accepted_tokens))
    for name, total, ngram in shares:
        if total is None:
            continue
        for drafter, value in ((Drafter.NGRAM, ngram or 0), (Drafter.DRAFT, total - (ngram or 0))):
            count(f"specchat_spec_decode_{name}_by_drafter", value, {"drafter": drafter})


def _queue_gauges() -> dict[str, float]:
    rows = (Generation.objects.filter(status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING])
            .values("pair__slug", "status").annotate(n=Count("id")))
    names: dict[str, str] = {Generation.Status.QUEUED: "vllm:num_requests_waiting",
             Generation.Status.RUNNING: "vllm:num_requests_running"}
    return {_sample(names[row["status"]], {"model_name": row["pair__slug"]}): row["n"] for row in rows}


def _live_gauges(client: redis.Redis) -> dict[str, float]:
    beats = live_workers(client=client)
    return {**{_sample("specchat_live_tokens_per_second",
                       {"model_name": slug, "worker": beat["name"], "k": k, "streams": streams}): rate
               for beat in beats
               for slug, by_streams in beat.get("figures", {}).items()
               for streams, by_k in by_streams.items() for k, rate in by_k.items()},
            **{_sample("specchat_prefix_cache_bytes", {"model_name": slug, "worker": beat["name"]}): held
               for beat in beats for slug, held in beat.get("prefix_cache_bytes", {}).items()},
            **{_sample("specchat_kv_blocks_held", {"model_name": slug, "worker": beat["name"]}): held
               for beat in beats for slug, held in beat.get("kv_blocks_held", {}).items()}}


def _order(sample: str, names: tuple[str, ...]) -> tuple:
    """Series together, then bucket/sum/count, buckets by increasing `le`."""
    name, _, labels = sample.partition("{")
    series, _, le = labels.partition(',le="')
    return series, names.index(name), float(le.rstrip('"}')) if le else 0.0


def exposition(*, client: redis.Redis) -> str:
    """Everything recorded so far, in the Prometheus text format (version 0.0.4)."""
    recorded: Any = client.hgetall(METRICS_KEY)  # str keys, with decode_responses
    samples: dict[str, float] = {**{field: float(value) for field, value in recorded.items()}, **_queue_gauges(),
                                 **_live_gauges(client)}
    lines = []
    for family in FAMILIES:
        names = tuple(family.name + suffix for suffix in SUFFIXES[family.kind])
        mine = sorted((s for s in samples if s.partition("{")[0] in names), key=lambda s: _order(s, names))
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}"]
        lines += [f"{sample} {samples[sample]:.17g}" for sample in mine]
    return "\n".join(lines) + "\n"
