"""Why a request is served as it is: one `Reason` code per decision of its plan (serving/planning),
with the figures it names (a `Why`), and the one place the human sentence is made from them (`sentence`).
Programs read the codes (the API's `speculative_reason_codes`, the benchmark); people read the sentence
(`speculative_reason`); no decision reads the sentence. No Django or openvino here: the web side's API
document lists the codes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Reason(StrEnum):
    """Why a plan is what it is: one code per decision, in the order they were taken (see SENTENCES)."""

    INEXACT_ALLOWED = "inexact-allowed"
    ASKED_OFF = "asked-off"
    NO_DRAFT = "no-draft"
    CONSTRAINED = "constrained"
    PROMPT_LOOKUP = "prompt-lookup"
    EXACT_THRESHOLD = "exact-threshold"
    THRESHOLD_ASKED = "threshold-asked"
    K_ASKED = "k-asked"
    LIVE_NEITHER_FASTER = "live-neither-faster"
    LIVE_MAIN_ALONE_FASTER = "live-main-alone-faster"
    LIVE_K_FASTEST = "live-k-fastest"
    EXPLORING_MAIN_ALONE = "exploring-main-alone"
    EXPLORING_SPECULATION = "exploring-speculation"
    PAIR_DEFAULT_THRESHOLD = "pair-default-threshold"
    PAIR_DEFAULT_K = "pair-default-k"
    PAIR_DEFAULT_K_INVALID_PROFILE = "pair-default-k-invalid-profile"
    PROFILE_MAIN_ALONE_FASTER = "profile-main-alone-faster"
    PROFILE_BEST_K = "profile-best-k"
    JOINS_SPECULATIVE_BATCH = "joins-speculative-batch"
    JOINS_MAIN_ALONE_BATCH = "joins-main-alone-batch"
    BEYOND_OWN_STREAMS = "beyond-own-streams"
    OWN_CONSTRAINED = "own-constrained"
    OWN_ENGINE = "own-engine"
    OWN_BATCH = "own-batch"
    OWN_BATCH_SPECULATING = "own-batch-speculating"
    OWN_BATCH_UNTIL_ALONE = "own-batch-until-alone"
    OWN_BATCH_K_ASKED = "own-batch-k-asked"
    ALTERNATIVES = "alternatives"
    HANDED_OVER = "handed-over"
    MOVED_INTO_BATCH = "moved-into-batch"
    K_LOWERED = "k-lowered"
    LOOKUP_IN_BATCH = "lookup-in-batch"
    LEFT_BATCH = "left-batch"
    FAST_MODE = "fast-mode"
    CALIBRATED_BEST_K = "calibrated-best-k"
    CALIBRATED_BEST_K_STOPPED = "calibrated-best-k-draft-stops"
    CALIBRATED_MAIN_ALONE_FASTER = "calibrated-main-alone-faster"
    CALIBRATED_LONG_CONTEXT_LOOKUP = "calibrated-long-context-lookup"
    FASTEST_CONFIG = "fastest-config"
    NOT_CALIBRATED = "not-calibrated"
    K_PER_ANSWER = "k-per-answer"


# Also the API's refusal of top_logprobs on a pair that cannot give them (api/parsing.py).
ALTERNATIVES = "top_logprobs asked: only SpecChat's own engine computes alternatives"
_MEASURED_HERE = ("measured here lately at {load} streams: K={k} {k_rate:.0f} tok/s, "
                  "the main alone {alone_rate:.0f} tok/s")
SENTENCES: dict[Reason, str] = {
    Reason.INEXACT_ALLOWED: "allowed by the pair: answers are not drawn from the main model's distribution",
    Reason.ASKED_OFF: "speculative: false was asked",
    Reason.NO_DRAFT: "the pair has no draft model",
    # Under a grammar the library masks every position the main scores, the draft's proposals included, and
    # on the pair measured the masks cost more than speculation saved (docs/exactness.md#under-a-grammar).
    Reason.CONSTRAINED: "held to a grammar, where speculation measured slower than the main alone; name a K to "
                        "speculate",
    Reason.PROMPT_LOOKUP: "the pair drafts from the prompt's own words",
    Reason.EXACT_THRESHOLD: "the confidence threshold applies to greedy requests; exact sampling takes K",
    Reason.THRESHOLD_ASKED: "confidence threshold asked",
    Reason.K_ASKED: "K asked by the request",
    Reason.LIVE_NEITHER_FASTER: f"neither is clearly faster ({_MEASURED_HERE})",
    Reason.LIVE_MAIN_ALONE_FASTER: f"the main alone is faster ({_MEASURED_HERE})",
    Reason.LIVE_K_FASTEST: f"K={{k}} is fastest ({_MEASURED_HERE})",
    Reason.EXPLORING_MAIN_ALONE: "exploring: the main alone is not measured here lately at {load} streams",
    Reason.EXPLORING_SPECULATION: "exploring: speculation is not measured here lately at {load} streams",
    Reason.PAIR_DEFAULT_THRESHOLD: "the pair's default threshold",
    Reason.PAIR_DEFAULT_K: "the pair's default K (no measured profile)",
    Reason.PAIR_DEFAULT_K_INVALID_PROFILE: "the pair's default K (its speculation profile is invalid)",
    Reason.PROFILE_MAIN_ALONE_FASTER: "the main alone is faster at {streams}+ streams (measured); {load} running here",
    Reason.PROFILE_BEST_K: "best K at {streams}+ streams (measured); {load} running here",
    Reason.JOINS_SPECULATIVE_BATCH: "joins the running speculative batch with K={k} (its highest-load K)",
    Reason.JOINS_MAIN_ALONE_BATCH: "joins the running batch of the main alone",
    Reason.BEYOND_OWN_STREAMS: "{load} of the pair's answers running here",
    # With the draft masked too, its proposals are accepted far more often than on the library's pipeline
    # (docs/exactness.md#under-a-grammar).
    Reason.OWN_CONSTRAINED: "held to a grammar, which the own engine applies to the draft too: the pair's K",
    Reason.OWN_ENGINE: "on SpecChat's own engine (few enough of the pair's answers here)",
    Reason.OWN_BATCH: "the main alone, batched on SpecChat's own engine (more of the pair's answers here than it "
                      "speculates for)",
    Reason.OWN_BATCH_UNTIL_ALONE: "speculating at K={k} once the others have ended",
    Reason.OWN_BATCH_SPECULATING: "speculating at K={k} in one batch with the pair's other answers on SpecChat's "
                                  "own engine (on this host faster than the main alone under load: calibrated)",
    Reason.OWN_BATCH_K_ASKED: "speculating at the K asked, {k}, in one batch with the pair's other answers on "
                              "SpecChat's own engine",
    Reason.ALTERNATIVES: ALTERNATIVES,
    Reason.HANDED_OVER: "handed over to {to} from token {token}, {load} running here ({then})",
    Reason.MOVED_INTO_BATCH: "moved into one batch with the pair's other answers on SpecChat's own engine from token "
                             "{token}, as more came than it speculates for",
    Reason.K_LOWERED: "there at K={k} (the batch's; 0: the main alone), down from K={k_before}",
    Reason.LOOKUP_IN_BATCH: "there the conversation's lookup proposes alone, where it matches (no draft inference)",
    Reason.LEFT_BATCH: "speculating again at K={k} from token {token}, the pair's other answers here done",
    # The device's default precision quantizes activations differently for one token and for K+1 verified at once.
    Reason.FAST_MODE: "fast mode: tokens may differ from the main alone's where two are near-tied",
    Reason.CALIBRATED_BEST_K: "K={k} is fastest for a lone answer on this host (calibrated)",
    Reason.CALIBRATED_BEST_K_STOPPED: "K={k} is fastest for a lone answer on this host, the draft stopping at a token "
                                      "it gives below {stop} (calibrated)",
    Reason.CALIBRATED_MAIN_ALONE_FASTER: "on this host no K beat the main alone for a lone answer (calibrated)",
    Reason.CALIBRATED_LONG_CONTEXT_LOOKUP: "after a prompt of {tokens} tokens or more the draft did not pay on this "
                                           "host (calibrated): guesses come from the conversation alone",
    Reason.FASTEST_CONFIG: "the main alone in its fastest configuration on this host ({config})",
    Reason.NOT_CALIBRATED: "the pair is not calibrated on this host yet: safe defaults meanwhile",
    Reason.K_PER_ANSWER: "the draft proposes fewer tokens a step where this answer's acceptance pays for fewer, at "
                         "this host's costs (calibrated)",
}


@dataclass(frozen=True)
class Why:
    """One decision of a plan: its code and the figures its sentence names ({load}, {k}, ...; a handover's
    `then` is the plan it moved to's own Whys)."""

    code: Reason
    facts: dict = field(default_factory=dict)


def sentence(whys: tuple[Why, ...]) -> str:
    """The human sentence of a plan's decisions: the only place it is made."""
    parts = []
    for why in whys:
        facts = why.facts
        if why.code == Reason.HANDED_OVER:
            facts = {**facts, "to": f"K={facts['to_k']}" if facts["to_k"] else "the main alone",
                     "then": sentence(facts["then"])}
        parts.append(SENTENCES[why.code].format(**facts))
    return "; ".join(part for part in parts if part)
