"""Ranges and names every side agrees on: read by the pair registry's checks, the request checks and
the OpenAPI document, so that a limit is written once."""

from __future__ import annotations

from enum import StrEnum

K_MIN, K_MAX = 1, 32  # num_assistant_tokens: tokens the draft proposes per step
DEFAULT_K = 5  # what the library falls back to when a speculative request names neither K nor a threshold
TEMPERATURE_MAX = 2
TOP_K_MAX = 100_000
REPETITION_PENALTY_MAX = 2  # vLLM's bound too: past it, answers lose their words' own repeats
MAX_SEED = 2**64 - 1  # openvino-genai's rng_seed is a size_t
MAX_STOP_STRINGS = 4
MAX_STOP_LENGTH = 256  # characters in one stop string: the pipeline looks for each in every new piece of text
# JSON a user sends (an API body, a tool call's arguments): nesting and number sizes no field needs. JSON
# schemas in response_format and tools nest two levels per object level.
MAX_JSON_DEPTH = 64
MAX_NUMBER_DIGITS = 1000
# The pipeline keeps temperature and the confidence threshold as float32: far smaller values become 0
# (the pipeline then refuses the request on the worker) or a denormal (NaN garbage).
FLOAT32_TINY = 1e-30
DEFAULT_MAX_NEW_TOKENS = 256  # when a request names no max_tokens (and the pair's cap allows it)
# A chat conversation longer than the model's context leaves out its oldest turns so that the answer keeps room
# for its max tokens (up to half the context); the newest message alone is still sent when it leaves this many.
MIN_ANSWER_TOKENS = 64
SYSTEM_PROMPT_MAX_CHARS = 16_000  # a chat conversation's; about 4,000 tokens, an eighth of a 32k context
# A chat message's text, refused over this before it is tokenized: about a 32k context's worth at 4 characters a
# token (tokenizing 2.4 MB took 1.3 s of the web process here).
MESSAGE_MAX_CHARS = 128_000


class ServingState(StrEnum):
    """A pair's state as the API and admin show it (OpenVINO Model Server's names)."""

    AVAILABLE = "AVAILABLE"
    LOADING = "LOADING"
    UNAVAILABLE = "UNAVAILABLE"


class LoadState(StrEnum):
    """A pair's engine in one worker, as its heartbeat reports it."""

    LOADING = "loading"
    AVAILABLE = "available"
    FAILED = "failed"


class FinishReason(StrEnum):
    """How an answer ended: what engines report, the worker records and the API maps to OpenAI's names."""

    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_tokens reached
    STOPPED = "stopped"  # the client asked to stop
    REPEATING = "repeating"  # the chat's answer stopped as it repeated itself (serving/repetition.py)
    ERROR = "error"


class Route(StrEnum):
    """Which engine serves an answer, and how: the one name every decision asks (serving/planning plans
    it, serving/records.py builds its engine's spec), in the style of SGLang's SpeculativeAlgorithm."""

    LIBRARY_SPECULATIVE = "library-speculative"  # openvino-genai's pipeline verifying the draft's tokens
    PROMPT_LOOKUP = "prompt-lookup"  # openvino-genai's pipeline drafting from the prompt's own n-grams
    LIBRARY_MAIN_ALONE = "library-main-alone"  # openvino-genai's pipeline of the main alone
    OWN_SPECULATIVE = "own-speculative"  # the own engine (engines/own/engine.py): exact speculation, greedy or sampled
    OWN_MAIN_ALONE = "own-main-alone"  # the own engine handed no speculation, its steps shared with the other answers'

    def is_own_engine(self) -> bool:
        return self in (Route.OWN_SPECULATIVE, Route.OWN_MAIN_ALONE)

    def is_main_alone(self) -> bool:
        return self in (Route.LIBRARY_MAIN_ALONE, Route.OWN_MAIN_ALONE)

    def speculates(self) -> bool:
        return not self.is_main_alone()


class Drafter(StrEnum):
    """What proposed a step's tokens: each one's proposals and acceptance are counted apart (API usage, /metrics)."""

    DRAFT = "draft"  # the draft model
    # the answer's own history: the own engine's prompt lookup (engines/own/proposers/prompt_lookup.py) or the library's
    NGRAM = "ngram"


class SpeculativeMode(StrEnum):
    """How an answer was served, stated on every answer (API usage, chat metrics line, admin)."""

    DRAFT = "draft"  # greedy, verified by openvino-genai: exactly the main's output
    EXACT_SAMPLING = "draft-exact-sampling"  # sampled, verified by our exact rule (engines/own/engine.py)
    INEXACT_SAMPLING = "draft-inexact-sampling"  # sampled by the library with a draft: allowed per pair only
    PROMPT_LOOKUP = "prompt-lookup"
    OFF = "off"  # the main alone, with the reason why
