"""Whether an answer speculates, at which K, and why, before any engine is chosen: the first rule of `CHOICES` that
answers (what the request named, then this worker's live figures, the host's calibration, the pair's measured profile,
the pair's defaults), then, for a request that left it to the pair, the batch already running here (`_joining`).

The figures: the live ones (serving/rates.py) where this worker measured both the main alone and a K at the load
lately; the calibration (serving/calibrated.py), measured on the own engine, for a pair whose own engine serves lone
answers; the profile (`manage.py profile_pair`) by the largest concurrency measured not above the load."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from inference.limits import DEFAULT_K
from inference.models import ModelPair
from inference.pair_checks import profile_errors
from inference.serving.planning.decision import Choice
from inference.serving.planning.inputs import Situation
from inference.serving.reasons import Reason, Why

log = logging.getLogger(__name__)

# Ks within this fraction of the fastest one's tokens/s are as fast as it (within a burst's run-to-run
# spread: docs/benchmark.md). The smallest of them serves: its steps are shorter, so a request joining the
# batch waits less for its first token.
AS_FAST = 0.97
# This worker's recent figures decide where one path is this much faster than the other at the load (it repays a
# handover's prefill, beyond a burst's spread). Closer, the request joins the batch that runs, or the main alone.
LIVE_MARGIN = 1.10


def quickest_k(rates: dict[int, float]) -> int:
    """The smallest K as fast as the fastest, from {K: tokens/s}."""
    top = max(rates.values())
    return min(k for k, rate in rates.items() if rate >= AS_FAST * top)


def live_k(live: dict[int, float] | None) -> tuple[int | None, dict] | None:
    """(the clearly faster K, 0 for the main alone, or None if neither is; the figures) from {K: tokens/s}
    measured lately at the load, when the main alone (K=0) and a K are in it; of several Ks, quickest_k's."""
    alone = (live or {}).get(0)
    drafted = {k: rate for k, rate in (live or {}).items() if k > 0}
    if not alone or not drafted:
        return None
    k = quickest_k(drafted)
    figures = {"k": k, "k_rate": drafted[k], "alone_rate": alone}
    if drafted[k] >= LIVE_MARGIN * alone:
        return k, figures
    return (0 if alone >= LIVE_MARGIN * drafted[k] else None), figures


def measured_k(*, pair: ModelPair, sampled: bool, load: int) -> tuple[int, int] | None:
    """(best K, at how many streams) from the pair's profile for this load: the entry measured at the
    largest concurrency not above it. 0 means the main alone was fastest there. None: not measured."""
    measured = _profile(pair, sampled=sampled)
    if not measured:
        return None
    at_or_below = [entry for entry in measured if entry[0] <= load]
    streams, k = at_or_below[-1] if at_or_below else measured[0]
    return k, streams


def _profile(pair: ModelPair, *, sampled: bool) -> list[tuple[int, int]]:
    """The pair's measured (streams, best K) entries for greedy or sampled requests, by streams; none if
    the stored profile is invalid (saved around the pair's validation)."""
    if profile_errors(pair.speculation_profile):
        log.warning("pair %s: its speculation profile is invalid, the default K serves", pair.slug)
        return []
    table = (pair.speculation_profile or {}).get("sampled" if sampled else "greedy") or {}
    return sorted((int(streams), int(k)) for streams, k in table.items())


def highest_load_k(pair: ModelPair) -> int | None:
    """The K the profile chose at its highest load where speculation won, else the pair's own."""
    winning = [(streams, k) for streams, k in _profile(pair, sampled=False) if k > 0]
    return winning[-1][1] if winning else pair.num_assistant_tokens


def pair_k(pair: ModelPair) -> int:
    """The pair's own K, where a K is needed and nothing chose one."""
    return pair.num_assistant_tokens or DEFAULT_K


def _alone(code: Reason, facts: dict | None = None, **fields) -> Choice:
    return Choice(alone=True, why=(Why(code, facts or {}),), **fields)


def _drafting(k: int | None, code: Reason, facts: dict | None = None, **fields) -> Choice:
    return Choice(k=k, why=(Why(code, facts or {}),), **fields)


def asked_off(s: Situation) -> Choice | None:
    return _alone(Reason.ASKED_OFF) if not s.asked.speculative else None


def no_draft(s: Situation) -> Choice | None:
    return _alone(Reason.NO_DRAFT) if not s.pair.is_speculative else None


def in_own_batch(s: Situation) -> Choice | None:
    """Beyond the answers the pair speculates for, its own engine's one batch, where a verify of many tokens costs
    more than the draft saves: speculating at the K the host measured faster there than the batched main alone (its
    K in the batch too: `_in_batch`), else the main alone there (docs/speculation.md#speculating-in-the-batch). What
    the request named, its alternatives and the library's inexact sampling choose as anywhere."""
    asked = s.asked
    named = asked.k is not None or (asked.threshold is not None and not s.exact)
    inexact = asked.sampled and not s.exact
    if not s.beyond_own_streams or not s.pair.draft_dir or named or asked.alternatives or inexact:
        return None
    beyond = Why(Reason.BEYOND_OWN_STREAMS, {"load": s.streams})
    if s.calibrated and s.host is not None and (k := s.host.batch_k):
        return Choice(k=k, why=(beyond, Why(Reason.OWN_BATCH_SPECULATING, {"k": k})))
    return Choice(alone=True, why=(beyond,))


def under_grammar(s: Situation) -> Choice | None:
    """Under a grammar the library's speculation measured slower than the main alone: only a named K speculates. The
    own engine masks the draft's proposals too, which then pay: a lone answer there speculates at the pair's K."""
    named = s.asked.k is not None or s.asked.threshold is not None
    if not s.asked.constrained or named or s.asked.sampled:
        return None
    return _drafting(pair_k(s.pair), Reason.OWN_CONSTRAINED) if s.lone else _alone(Reason.CONSTRAINED)


def prompt_lookup(s: Situation) -> Choice | None:
    """A pair without a draft model drafts from the prompt (it samples from the main, compared with the n-gram:
    exact)."""
    if s.pair.draft_dir:
        return None
    k = s.asked.k or pair_k(s.pair)
    return _drafting(k, Reason.K_ASKED if s.asked.k else Reason.PROMPT_LOOKUP)


def named(s: Situation) -> Choice | None:
    """What the request named, it gets: a K, or a threshold (the library's; exact sampling takes the pair's K)."""
    if s.asked.threshold is not None and s.exact:
        return _drafting(pair_k(s.pair), Reason.EXACT_THRESHOLD)
    if s.asked.threshold is not None:
        return Choice(threshold=s.asked.threshold, why=(Why(Reason.THRESHOLD_ASKED),))
    if s.asked.k is not None:
        return _drafting(s.asked.k, Reason.K_ASKED)
    return None


def measured_lately(s: Situation) -> Choice | None:
    """This worker's recent figures at the load, where it measured both paths (greedy: the own engine's sampled
    steps are not measured)."""
    here = None if s.asked.sampled or s.live is None else live_k(s.live.rates)
    if here is None:
        return None
    k, figures = here
    facts = {"load": s.streams, **figures}
    if k is None:
        return _alone(Reason.LIVE_NEITHER_FASTER, facts)
    if k == 0:
        return _alone(Reason.LIVE_MAIN_ALONE_FASTER, facts, measured_here=True)
    return _drafting(k, Reason.LIVE_K_FASTEST, facts, measured_here=True)


def exploring(s: Situation) -> Choice | None:
    """The path this worker has no figure for at the load, tried as if it were clearly faster: requests
    joining go to it, and once the other path's answers have ended its steps run alone and count."""
    live = s.live
    if live is None or not live.exploring or not live.rates or s.asked.sampled:
        return None
    if 0 not in live.rates:
        return _alone(Reason.EXPLORING_MAIN_ALONE, {"load": s.streams}, measured_here=True)
    best = measured_k(pair=s.pair, sampled=False, load=s.streams)
    k = (best[0] if best and best[0] else None) or highest_load_k(s.pair) or DEFAULT_K
    return _drafting(k, Reason.EXPLORING_SPECULATION, {"load": s.streams}, measured_here=True)


def _calibrated_k(s: Situation) -> int | None:
    """A lone greedy answer's K as the host's calibration measured it on the pair's own engine."""
    if s.host is None or not s.own_pair or s.asked.sampled:
        return None
    return s.host.k_at(s.streams)


def calibrated_long_context(s: Situation) -> Choice | None:
    """After a long prompt where the host's calibration found the draft not paying, the answer speculates from its
    conversation alone: a lookup that misses costs nothing (its step is the main alone's), one that hits copies a run
    of the pasted file in one step (engines/own/proposers/chain.py)."""
    k = _calibrated_k(s)
    if k and s.long_prompt and s.host is not None and s.host.long_context_k == 0:
        return _drafting(k, Reason.CALIBRATED_LONG_CONTEXT_LOOKUP, {"tokens": s.host.long_context_from},
                         lookup_only=True)
    return None


def calibrated(s: Situation) -> Choice | None:
    k = _calibrated_k(s)
    if k is None or s.host is None:
        return None
    if k == 0:
        return _alone(Reason.CALIBRATED_MAIN_ALONE_FASTER)
    stop = s.host.draft_stop_below
    if stop is not None:
        return _drafting(k, Reason.CALIBRATED_BEST_K_STOPPED, {"k": k, "stop": stop}, draft_stop_below=stop)
    return _drafting(k, Reason.CALIBRATED_BEST_K, {"k": k})


def profiled(s: Situation) -> Choice | None:
    best = measured_k(pair=s.pair, sampled=s.asked.sampled, load=s.streams)
    if best is None:
        return None
    k, streams = best
    facts = {"streams": streams, "load": s.streams}
    return _alone(Reason.PROFILE_MAIN_ALONE_FASTER, facts) if k == 0 else _drafting(k, Reason.PROFILE_BEST_K, facts)


def pair_default(s: Situation) -> Choice:
    pair = s.pair
    if pair.num_assistant_tokens is None and pair.assistant_confidence_threshold is not None and not s.exact:
        return Choice(threshold=pair.assistant_confidence_threshold, why=(Why(Reason.PAIR_DEFAULT_THRESHOLD),))
    invalid = profile_errors(pair.speculation_profile)
    return _drafting(pair_k(pair), Reason.PAIR_DEFAULT_K_INVALID_PROFILE if invalid else Reason.PAIR_DEFAULT_K)


CHOICES: tuple[Callable[[Situation], Choice | None], ...] = (
    asked_off, no_draft, in_own_batch, under_grammar, prompt_lookup, named, measured_lately, exploring,
    calibrated_long_context, calibrated, profiled, pair_default,
)


def choose(s: Situation) -> Choice:
    """The first of CHOICES that answers, then the batch running here (`_joining`), and its K once more answers come
    (`_in_batch`)."""
    for rule in CHOICES:
        choice = rule(s)
        if choice is not None:
            return _in_batch(s, _joining(s, choice))
    raise AssertionError("pair_default always answers")


def _in_batch(s: Situation, choice: Choice) -> Choice:
    """A speculating answer's K should it run in the own engine's batch: the K the request named holds there too,
    else the host's K for the batch, where its calibration measured one; none: the main alone there."""
    if choice.alone or choice.batch_k is not None:
        return choice
    if s.asked.k is not None:
        return replace(choice, batch_k=s.asked.k)
    if s.calibrated and s.host is not None and s.host.batch_k:
        return replace(choice, batch_k=s.host.batch_k)
    return choice


def _joining(s: Situation, choice: Choice) -> Choice:
    """A pair's speculative pipeline and its main alone are two step processes on the same cores: run together they
    contend, slower than either alone (docs/benchmark-log.md, "Under load"). So a greedy request left to the pair
    joins whichever of the two is running, when only one is: the main alone's batch, or the speculative one at the
    profile's highest-load K. A choice from this worker's own recent figures stands, and so does the own engine's
    batch (one step process)."""
    if not s.asked.left_to_the_pair or choice.measured_here or not s.pair.draft_dir or s.beyond_own_streams:
        return choice
    speculative, alone = s.load.running_speculative, s.load.running_alone
    if choice.alone and speculative and not alone and (k := highest_load_k(s.pair)):
        return Choice(k=k, why=(*choice.why, Why(Reason.JOINS_SPECULATIVE_BATCH, {"k": k})))
    if not choice.alone and alone and not speculative:
        return Choice(alone=True, why=(*choice.why, Why(Reason.JOINS_MAIN_ALONE_BATCH)))
    return choice
