"""A request's settings in openvino-genai's terms: the GenerationConfig a pipeline takes, with its structured output
(engines/grammar/structured_output.py). The web side builds one only to ask the library whether it would refuse the
settings."""

from __future__ import annotations

import openvino_genai as og

from inference.engines.decoding import DecodingParams
from inference.engines.grammar.structured_output import structured_output_config
from inference.engines.spec import PairSpec


def generation_config(params: DecodingParams, spec: PairSpec) -> og.GenerationConfig:
    cfg = og.GenerationConfig()
    cfg.max_new_tokens = params.max_new_tokens
    cfg.ignore_eos = params.ignore_eos
    if params.stop:
        cfg.stop_strings = set(params.stop)
    if params.grammar:
        cfg.structured_output_config = structured_output_config(params.grammar)
    if params.logprobs:
        cfg.logprobs = 1  # the chosen token's (the library returns no alternatives)
    if params.repetition_penalty != 1.0:
        cfg.repetition_penalty = params.repetition_penalty
    if params.temperature > 0:
        cfg.do_sample = True
        cfg.temperature = params.temperature
        cfg.top_p = params.top_p
        cfg.top_k = params.top_k
        if params.seed is not None:
            cfg.rng_seed = params.seed
    if spec.uses_draft or spec.uses_prompt_lookup:
        # A speculative pipeline fails inside step() when neither is set: the plan always sets one.
        speculation = params.speculation
        if speculation is None or (speculation.k is None and not spec.uses_draft):
            raise ValueError(f"{spec.slug} speculates: its requests name a K (a confidence threshold with a draft)")
        if speculation.threshold is not None:
            cfg.assistant_confidence_threshold = speculation.threshold
        else:
            cfg.num_assistant_tokens = speculation.k
        if spec.uses_prompt_lookup:
            cfg.max_ngram_size = params.max_ngram_size
    return cfg
