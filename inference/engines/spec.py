"""A pair's spec: everything needed to build one of its engines, and the main model's context window.

An engine (library/pipeline.py, own/engine.py) is built from a PairSpec; the worker keeps one engine per `role`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from inference.engines.devices import AUTO
from inference.limits import Drafter, Route

# Where no size is set, the own engine's KV pools (main and draft together, engines/own/block_pool.py) take this share
# of the memory available when the engine loads, as vLLM sizes its pool from a memory fraction. Pages count only once
# written: a pool costs what the answers and the conversations it keeps have used.
KV_POOL_SHARE = 0.25
KV_POOL_MIN_MB = 64
HEAD_IDS_FILE = "head_vocabulary.npy"  # beside a draft's IR: the ids its head keeps (pairs/head_vocabulary.py)


# Which of a pair's engines a spec builds: a worker keeps one engine per (slug, role). The own engine serves both own
# routes, its main alone an answer handed no speculation (engines/own/engine.py), so the two share one role; the
# library's draft and its prompt lookup are the pair's one speculative pipeline (an edited pair's replaces the other).
ROLES: dict[Route, str] = {
    Route.LIBRARY_SPECULATIVE: "library-speculative",
    Route.PROMPT_LOOKUP: "library-speculative",
    Route.LIBRARY_MAIN_ALONE: "library-main-alone",
    Route.OWN_SPECULATIVE: "own",
    Route.OWN_MAIN_ALONE: "own",
}


@dataclass(frozen=True)
class PairSpec:
    """Everything needed to build one of a pair's engines, the route it serves included: the library's pipeline
    with its draft or its prompt lookup, its main alone (the honest baseline, and the per-request opt-out, on the
    same backend and scheduler settings), or the own engine. The own engine's spec says Route.OWN_SPECULATIVE: that
    one engine serves the pair's own main alone too (an answer handed no speculation), so serving/records.py's
    pair_spec gives both own routes the same spec."""

    slug: str
    main_dir: str
    draft_dir: str = ""
    route: Route = Route.LIBRARY_SPECULATIVE  # the engine it builds (serving/registry.py's ENGINES)
    # The route of the engine the pair serves as registered (serving/planning's pair_default_route), whose state the
    # admin shows and which stays when idle; None: a spec built outside serving/records.py's pair_spec, none of whose
    # engines is a registered pair's
    pair_default: Route | None = None
    device: str = "CPU"  # the main's
    draft_device: str = ""  # "": the main's device
    cache_size_gb: int = 1
    max_num_batched_tokens: int | None = None  # None: the library's default
    prefill_first: bool = False  # whole prompts in steps of their own (the library's dynamic_split_fuse off)
    inference_precision: str = "f32"
    kv_cache_precision: str = "f32"
    speculating_streams: int = 0  # on the own engine: beyond this many answers, speculating ones join the batch
    kv_pool_mb: int = 0  # on the own engine: its KV pools' size, main and draft together (0: KV_POOL_SHARE of the RAM)
    prefix_caching: bool = True  # on the own engine: blocks kept for prompts to come (off: every prompt read whole)
    dynamic_quantization: bool = False  # in the f32 mode on a CPU, int8 activations: exact on the own engine only
    chained_lookup: bool = True  # on the own engine: the prompt lookup proposes first, the draft where it has nothing
    draft_head_ids: str = ""  # on the own engine: a file of the ids the draft's head keeps (engines/own/draft_head.py)
    draft_alternative_dir: str = ""  # the same draft in another weight format: a calibration keeps the cheaper
    drafters_judged: bool = True  # on the own engine: a drafter sits out where it does not pay (engines/own/payoff.py)
    main_rows: str = "auto"  # on the own engine: how the main computes an answer's tokens (settings.MAIN_ROWS)

    def __post_init__(self) -> None:
        if self.route == Route.OWN_MAIN_ALONE:
            raise ValueError("the own engine's spec says Route.OWN_SPECULATIVE: it serves its main alone too")
        if self.route in (Route.LIBRARY_SPECULATIVE, Route.OWN_SPECULATIVE) and not self.draft_dir:
            raise ValueError(f"{self.route} needs a draft model (draft_dir)")

    @property
    def role(self) -> tuple[str, str]:
        """Which of the pair's engines the spec is for (ROLES): a worker keeps one engine per role; a spec with new
        settings for a role replaces the old engine."""
        return self.slug, ROLES[self.route]

    @property
    def uses_draft(self) -> bool:
        return self.route in (Route.LIBRARY_SPECULATIVE, Route.OWN_SPECULATIVE)

    @property
    def draft_runs_on(self) -> str:
        return self.draft_device or self.device

    @property
    def devices(self) -> dict[str, str]:
        """Model ("main", "draft") -> the device this engine runs it on."""
        return {"main": self.device, **({"draft": self.draft_runs_on} if self.uses_draft else {})}

    @property
    def uses_prompt_lookup(self) -> bool:
        """The library's prompt lookup (the own engine's is `chained_lookup`, beside its draft)."""
        return self.route == Route.PROMPT_LOOKUP

    @property
    def drafter(self) -> Drafter:
        """What proposes on this engine where its steps do not say (the own engine's steps say, step by step)."""
        return Drafter.NGRAM if self.uses_prompt_lookup else Drafter.DRAFT

    @property
    def is_pair_default(self) -> bool:
        """The engine the pair serves as registered, whose state the admin shows (a speculative pair also
        builds its main alone and its own engine, on demand)."""
        return self.route == self.pair_default

    @property
    def step_budget(self) -> int | None:
        """Tokens one scheduler step may take (None: the library's default). Prefilling whole prompts, a
        step must hold the longest prompt the model takes: the library fails a step whose prompt is longer."""
        if self.prefill_first:
            return max(self.max_num_batched_tokens or 0, context_length(Path(self.main_dir)))
        return self.max_num_batched_tokens

    def kv_pool_bytes(self) -> int:
        """The own engine's KV pools together: `kv_pool_mb`, or a share of the memory available now."""
        if self.kv_pool_mb:
            return self.kv_pool_mb * 2**20
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # the RAM free now
        return max(int(available * KV_POOL_SHARE), KV_POOL_MIN_MB * 2**20)

    def device_properties(self, *, device: str) -> dict[str, str]:
        """What a model is compiled with on `device`: the precision hints, and the CPU's switch below on the CPU
        and on AUTO, which hands it to the device it picks (openvino-genai's pipeline ignores a switch scoped to
        the CPU in DEVICE_PROPERTIES); a GPU or an NPU named never gets it."""
        props = {}
        if self.inference_precision:
            props["INFERENCE_PRECISION_HINT"] = self.inference_precision
        if self.kv_cache_precision:
            props["KV_CACHE_PRECISION"] = self.kv_cache_precision
        if device in ("CPU", AUTO) and self.inference_precision == "f32" and not self.dynamic_quantization:
            # The CPU quantizes activations of int8/int4-weight matmuls on the fly. Row by row that is bitwise
            # the same for one token and for K+1 (the own engine relies on it), but the library's paged
            # attention is not: its greedy answers with the draft then differ in near-ties
            # (docs/exactness.md#greedy-identity-and-the-cpus-kernels).
            props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = "0"
        return props



def library_route(spec: PairSpec, *, speculative: bool) -> Route:
    """The library's route over a spec's models: its draft's, or its prompt lookup's where the spec has that, or
    the main alone (`speculative` off, or nothing to draft with)."""
    if speculative and spec.draft_dir:
        return Route.LIBRARY_SPECULATIVE
    return Route.PROMPT_LOOKUP if speculative and spec.route == Route.PROMPT_LOOKUP else Route.LIBRARY_MAIN_ALONE


DEFAULT_CONTEXT = 2048


def context_length(main: Path) -> int:
    """The main model's context window, from its config.json."""
    try:
        config = json.loads((main / "config.json").read_text())
    except (OSError, ValueError):
        return DEFAULT_CONTEXT
    return int(config.get("max_position_embeddings") or DEFAULT_CONTEXT)
