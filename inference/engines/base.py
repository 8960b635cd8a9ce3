"""What every engine shares: the pair's spec, a request's decoding settings, the events a request
receives (one StepTokens per speculative step, then Finished), text assembly and speculation counts.

An engine (library.py, exact.py) takes a PairSpec, and `submit(prompt=..., params=...)` returns an
ActiveRequest whose `events` queue the caller drains. Nothing here knows Django, Redis or Celery.
"""

from __future__ import annotations

import contextlib
import json
import queue
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
import openvino as ov
import openvino_genai as og

from inference.engines.grammar import Grammar
from inference.engines.prefill import KEPT_TOKENS
from inference.limits import FinishReason, Route


@dataclass(frozen=True)
class PairSpec:
    """Everything needed to build a pair's pipeline. `speculative=False` builds the main alone,
    on the same backend and scheduler settings: the honest baseline, and per-request opt-out."""

    slug: str
    main_dir: str
    draft_dir: str = ""
    prompt_lookup: bool = False
    device: str = "CPU"
    cache_size_gb: int = 1
    max_num_batched_tokens: int | None = None  # None: the library's default
    prefill_first: bool = False  # whole prompts in steps of their own (the library's dynamic_split_fuse off)
    inference_precision: str = "f32"
    kv_cache_precision: str = "f32"
    speculative: bool = True
    exact_sampling: bool = False  # the exact engine (engines/exact.py) rather than openvino-genai's pipeline
    own_engine: bool = False  # the pair serves its first streams on its exact engine (ModelPair.own_engine_streams)
    speculating_streams: int = 0  # on the exact engine: beyond this many answers, speculating ones join the batch
    prompt_cache_tokens: int = KEPT_TOKENS  # on the exact engine: prompt tokens kept prefilled per model (0: none)
    dynamic_quantization: bool = False  # in the f32 mode on a CPU, int8 activations: exact on the exact engine only

    @property
    def role(self) -> tuple[str, bool, bool]:
        """What the spec is for: a pair's speculative engine, its exact-sampling engine or its main alone.
        A worker keeps one engine per role; a spec with new settings for a role replaces the old engine."""
        return self.slug, self.speculative, self.exact_sampling

    @property
    def uses_draft(self) -> bool:
        return self.speculative and bool(self.draft_dir)

    @property
    def uses_prompt_lookup(self) -> bool:
        return self.speculative and not self.draft_dir and self.prompt_lookup

    @property
    def route(self) -> Route:
        """The route this engine serves (the own engine serves its main alone too, at K=0)."""
        if self.exact_sampling:
            return Route.OWN_SPECULATIVE
        if self.uses_draft:
            return Route.LIBRARY_SPECULATIVE
        return Route.PROMPT_LOOKUP if self.uses_prompt_lookup else Route.LIBRARY_MAIN_ALONE

    @property
    def is_pair_default(self) -> bool:
        """The engine the pair serves as registered, whose state the admin shows (a speculative pair also
        builds its main alone and its exact engine, on demand): its own engine where it has one, else the
        library's pipeline with its draft, or its prompt lookup, or its main alone."""
        if self.own_engine:
            return self.route == Route.OWN_SPECULATIVE
        if self.draft_dir:
            return self.route == Route.LIBRARY_SPECULATIVE
        return self.route == (Route.PROMPT_LOOKUP if self.prompt_lookup else Route.LIBRARY_MAIN_ALONE)

    @property
    def step_budget(self) -> int | None:
        """Tokens one scheduler step may take (None: the library's default). Prefilling whole prompts, a
        step must hold the longest prompt the model takes: the library fails a step whose prompt is longer."""
        if self.prefill_first:
            return max(self.max_num_batched_tokens or 0, context_length(Path(self.main_dir)))
        return self.max_num_batched_tokens

    def device_properties(self) -> dict[str, str]:
        props = {}
        if self.inference_precision:
            props["INFERENCE_PRECISION_HINT"] = self.inference_precision
        if self.kv_cache_precision:
            props["KV_CACHE_PRECISION"] = self.kv_cache_precision
        if self.device == "CPU" and self.inference_precision == "f32" and not self.dynamic_quantization:
            # The CPU quantizes activations of int8/int4-weight matmuls on the fly. Row by row that is bitwise
            # the same for one token and for K+1 (the exact engine relies on it), but the library's paged
            # attention is not: its greedy answers with the draft then differ in near-ties (3 of 8 on the real pair).
            props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = "0"
        return props


DEFAULT_CONTEXT = 2048


def context_length(main: Path) -> int:
    """The main model's context window, from its config.json."""
    try:
        config = json.loads((main / "config.json").read_text())
    except (OSError, ValueError):
        return DEFAULT_CONTEXT
    return int(config.get("max_position_embeddings") or DEFAULT_CONTEXT)


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How tokens are chosen; temperature 0 is greedy (then the output is exactly the main's)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False  # each token's log probability under the main's own (raw) distribution
    top_logprobs: int = 0  # and this many most likely alternatives at each position (our exact engine only)
    grammar_kind: str = ""  # output held to a grammar (engines/grammar.py): one of its FIELDS, or none
    grammar_text: str = ""

    @property
    def grammar(self) -> Grammar | None:
        return Grammar(kind=self.grammar_kind, text=self.grammar_text) if self.grammar_kind else None

    def sampling(self) -> dict:
        """These fields alone, to build another Sampling from this one."""
        return {f.name: getattr(self, f.name) for f in fields(Sampling)}


@dataclass(frozen=True, kw_only=True)
class DecodingParams(Sampling):
    """One request's resolved pipeline settings."""

    max_new_tokens: int
    num_assistant_tokens: int | None = None
    assistant_confidence_threshold: float | None = None
    max_ngram_size: int = 3

    def generation_config(self, spec: PairSpec) -> og.GenerationConfig:
        cfg = og.GenerationConfig()
        cfg.max_new_tokens = self.max_new_tokens
        cfg.ignore_eos = self.ignore_eos
        if self.stop:
            cfg.stop_strings = set(self.stop)
        if self.grammar:
            cfg.structured_output_config = self.grammar.config()
        if self.logprobs:
            cfg.logprobs = 1  # the chosen token's (the library returns no alternatives)
        if self.temperature > 0:
            cfg.do_sample = True
            cfg.temperature = self.temperature
            cfg.top_p = self.top_p
            cfg.top_k = self.top_k
            if self.seed is not None:
                cfg.rng_seed = self.seed
        if spec.uses_draft or spec.uses_prompt_lookup:
            # A speculative pipeline fails inside step() when neither is set.
            if self.assistant_confidence_threshold is not None and spec.uses_draft:
                cfg.assistant_confidence_threshold = self.assistant_confidence_threshold
            else:
                cfg.num_assistant_tokens = self.num_assistant_tokens or 5
            if spec.uses_prompt_lookup:
                cfg.max_ngram_size = self.max_ngram_size
        return cfg


def _set_up_numpy_in_openvino() -> None:
    """openvino's bindings set up their numpy API on the first tensor turned into numpy, and threads doing
    that at once deadlock the whole process, its heartbeat included (tests/test_engine_process.py). Seen:
    a fresh process whose 16 threads encode at once hung 4 times in 4; with each tokenizer encoding once
    as it loaded, a fresh process whose threads load the main's and the draft's tokenizers at once (a
    fresh worker loading its pair as the first request of the other path arrives) hung 3 times in 12.
    So once per process, at import: every engine and the web's checks import this module, and the
    import is complete before any thread of theirs can hold a tensor."""
    _ = ov.Tensor(np.zeros(1, dtype=np.int64)).data


_set_up_numpy_in_openvino()


def load_tokenizer(folder: str | Path) -> og.Tokenizer:
    """The folder's OpenVINO tokenizer, safe to use from many threads at once (see above)."""
    return og.Tokenizer(str(folder))


def prompt_token_ids(tokenizer, *, prompt: str, add_special_tokens: bool, prompt_ids: list[int] | None) -> list[int]:
    """What a request starts from: `prompt_ids` as they are (an answer handed over from another engine
    goes on from its prompt and its tokens so far), else the prompt encoded."""
    if prompt_ids is not None:
        return prompt_ids
    return [int(t) for t in tokenizer.encode(prompt, add_special_tokens=add_special_tokens).input_ids.data[0]]


class StepTokens(NamedTuple):
    """The tokens one main step delivered to a request, and when (perf_counter seconds)."""

    token_ids: list[int]
    at: float
    logprobs: list[float] | None = None  # when the request asked: log p_main(token) before temperature
    alternatives: list[list[tuple[int, float]]] | None = None  # per token, the top_logprobs most likely (id, logprob)


class Finished(NamedTuple):
    finish_reason: FinishReason
    error: str = ""


class ActiveRequest:
    """A request inside the batch. Its engine feeds `events`; its owner reads them."""

    def __init__(self, request_id: int, prompt_ids: list[int], added_at: float,
                 on_stop: Callable[[], object] | None = None):
        self.request_id = request_id
        self.on_stop = on_stop
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.added_at = added_at
        self.events: queue.Queue[StepTokens | Finished] = queue.Queue()
        self.stop_requested = False

    def stop(self) -> None:
        """Ask the engine to stop this request before its next step (keeps what was produced)."""
        if self.stop_requested:
            return
        self.stop_requested = True
        if self.on_stop:
            with contextlib.suppress(OSError, EOFError):  # the engine is gone: its reader ends the request
                self.on_stop()


class Engine(Protocol):
    """What the worker, the registry and the benchmark use of an engine: the library's pipeline in a step
    process of its own (engines/library.py) and the exact speculative sampler (engines/exact.py)."""

    spec: PairSpec
    tokenizer: og.Tokenizer
    load_seconds: float
    submitted: int  # requests taken: the registry renews an engine after many

    @property
    def active_count(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    def submit(self, *, prompt: str = "", params: DecodingParams, add_special_tokens: bool = True,
               prompt_ids: list[int] | None = None) -> ActiveRequest: ...

    def close(self) -> None: ...


class TextAssembler:
    """Turns the token runs of successive steps into text pieces without cutting a UTF-8 character.

    Each step gives (draft text, main text): the text of the accepted draft tokens, and of the
    main model's own token that ends the step.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def _stable(self, n: int) -> str:
        decoded = self.tokenizer.decode(self.ids[:n])
        return decoded.rstrip("\ufffd")  # an incomplete character waits for the next tokens

    def _take(self, n: int) -> str:
        stable = self._stable(n)
        if len(stable) <= len(self.text) or not stable.startswith(self.text):
            return ""
        piece, self.text = stable[len(self.text):], stable
        return piece

    def add(self, token_ids: list[int]) -> tuple[str, str]:
        split = len(self.ids) + len(token_ids) - 1
        self.ids.extend(token_ids)
        draft = self._take(split) if len(token_ids) > 1 else ""
        return draft, self._take(len(self.ids))

    def finish(self) -> str:
        """Whatever was held back (a character cut by the end of generation)."""
        decoded = self.tokenizer.decode(self.ids)
        piece = decoded[len(self.text):] if decoded.startswith(self.text) else ""
        self.text += piece
        return piece


@dataclass(frozen=True)
class SpeculationFigures:
    """What one ended generation measured. The one list of these names: the Generation's columns, the
    stream's `done` event, the API's usage, the chat's metrics line and the Prometheus counters all
    take them from here. The speculative ones are None when no draft ran."""

    completion_tokens: int
    main_steps: int
    ttft_ms: float | None
    duration_ms: float
    tokens_per_s: float
    draft_tokens: int | None  # proposed by the draft (None in the confidence-threshold mode: not counted)
    accepted_tokens: int | None
    draft_steps: int | None  # main steps that verified a proposal (vLLM's count of drafts)
    acceptance_rate: float | None
    mean_accepted_length: float | None  # tokens per verifying step, the main's own included
    accepted_by_position: list[int]


FIGURES = tuple(f.name for f in fields(SpeculationFigures))


@dataclass
class SpeculationStats:
    """Counts per generation, from the tokens each main step delivered."""

    num_assistant_tokens: int | None  # K when fixed; None for the confidence-threshold mode or no draft
    speculative: bool
    max_new_tokens: int
    main_steps: int = 0
    tokens: int = 0
    accepted: int = 0
    proposed: int = 0
    draft_steps: int = 0  # main steps that verified the draft's proposal (not plain or prefill ones)
    accepted_by_position: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    last_token_at: float | None = None
    prefill_steps: int = 0
    prefill_next: bool = True

    def add_step(self, n_tokens: int, at: float) -> None:
        remaining = self.max_new_tokens - self.tokens
        self.main_steps += 1
        self.tokens += n_tokens
        self.first_token_at = self.first_token_at or at
        self.last_token_at = at
        if self.prefill_next:  # a prefill step has nothing to verify
            self.prefill_next = False
            self.prefill_steps += 1
            return
        if not self.speculative:
            return
        accepted = n_tokens - 1
        self.draft_steps += 1
        self.accepted += accepted
        if self.num_assistant_tokens:
            # the draft proposes no more than the tokens left after the main's own one
            self.proposed += max(min(self.num_assistant_tokens, remaining - 1), accepted)
        while len(self.accepted_by_position) < accepted:
            self.accepted_by_position.append(0)
        for position in range(accepted):
            self.accepted_by_position[position] += 1

    def hand_over(self, *, num_assistant_tokens: int | None, speculative: bool) -> None:
        """The answer goes on in another engine: its first step there prefills again."""
        self.num_assistant_tokens, self.speculative = num_assistant_tokens, speculative
        self.prefill_next = True

    def summary(self, *, started_at: float, ended_at: float) -> SpeculationFigures:
        decode_steps = max(self.main_steps - self.prefill_steps, 0)
        duration = max(ended_at - started_at, 1e-9)
        return SpeculationFigures(
            completion_tokens=self.tokens,
            main_steps=self.main_steps,
            ttft_ms=(self.first_token_at - started_at) * 1000 if self.first_token_at else None,
            duration_ms=duration * 1000,
            tokens_per_s=self.tokens / duration if self.tokens else 0.0,
            draft_tokens=self.proposed if self.speculative and self.num_assistant_tokens else None,
            accepted_tokens=self.accepted if self.speculative else None,
            draft_steps=self.draft_steps if self.speculative else None,
            acceptance_rate=(self.accepted / self.proposed) if self.proposed else None,
            mean_accepted_length=((self.tokens - self.prefill_steps) / decode_steps)
            if self.speculative and decode_steps else None,
            accepted_by_position=list(self.accepted_by_position) if self.speculative else [],
        )
