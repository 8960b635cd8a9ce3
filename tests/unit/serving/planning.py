"""The pairs and live figures the planner's tests plan with."""

from dataclasses import replace

from inference.limits import Route
from inference.models import ModelPair
from inference.serving.planning import HostFigures, LiveFigures

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


# What a host's calibration measured (serving/calibrated.py reads them so)
HOST = "AMD EPYC (family 26 model 2; avx512f), 2 cores"
SPECULATES = HostFigures(host=HOST, main_alone_config="defaults", own_config="f32-dynamic", best_k={1: 2})
# where verifying many tokens costs little more than one (the Intel host): K=8, the draft stopping where it is unsure
LONG_STEPS = HostFigures(host=HOST, main_alone_config="f32-dynamic", own_config="f32-dynamic", best_k={1: 8},
                         draft_stop_below=0.5)
LOSES = HostFigures(host=HOST, main_alone_config="f32-dynamic", own_config="f32-dynamic", best_k={1: 0})
# the host's costs timed too (a draft token, the verify of 2, 3, ... tokens): the draft's K follows each answer
COSTED = replace(SPECULATES, best_k={1: 4}, step_costs=(0.3, 0.93, 0.94, 1.01, 1.06))
NOT_YET = HostFigures(host=HOST)
# where the library's pipeline ran the main alone fastest (bf16 here, a configuration the own engine is not exact in,
# at one stream and under load: this Zen 5 host): an own pair's main alone runs on its own engine all the same, in
# the configuration it is exact in (the calibration may record the library faster; the plan reads it no more)
LIBRARY_FASTER = HostFigures(host=HOST, main_alone_config="bf16", own_config="f32-dynamic", best_k={1: 3})
# answers beyond the pair's speculating streams speculate at K=2 in the own engine's batch (the Intel host, model 167)
BATCHES = replace(COSTED, batch_k=2)
