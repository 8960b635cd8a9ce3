"""The pairs and live figures the planner's tests plan with."""

from inference.limits import Route
from inference.models import ModelPair
from inference.serving.speculation import LiveFigures

PROFILE = {"greedy": {"1": 4, "4": 2, "16": 0}, "sampled": {"1": 3, "8": 0}}


def pair(**fields) -> ModelPair:
    defaults = {"slug": "p", "main_dir": "m", "draft_dir": "d", "num_assistant_tokens": 5}
    return ModelPair(**{**defaults, **fields})


PROFILED = {"speculation_profile": PROFILE}
OWN = {"own_engine_streams": 2, "num_assistant_tokens": 3, "speculation_profile": PROFILE}  # its own engine, 2 streams
FAST = {"inference_precision": "", "kv_cache_precision": "", "speculation_profile": PROFILE}
LOOKUP = {"draft_dir": "", "prompt_lookup": True}
LIB, LOOKS, ALONE, OWN_K, OWN_ALONE = (Route.LIBRARY_SPECULATIVE, Route.PROMPT_LOOKUP, Route.LIBRARY_MAIN_ALONE,
                                       Route.OWN_SPECULATIVE, Route.OWN_MAIN_ALONE)


def live(rates: dict[int, float], *, exploring: bool = False) -> LiveFigures:
    return LiveFigures(rates=rates, exploring=exploring)
