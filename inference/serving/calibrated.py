"""What a worker serves a pair with on its host: the pair's calibration there (inference/calibration/ measures
it), read as the figures the planner and the engines' specs follow, and the calibration started where there is
none — from the admin, or by a worker that loads a pair on a host with no calibration of it (the pair is served
with safe defaults meanwhile, and its answers say so)."""

from __future__ import annotations

from celery import current_app
from django.conf import settings
from django.db import transaction

from inference import selectors
from inference.models import HostCalibration, JobStatus, ModelPair
from inference.serving.host import Host
from inference.serving.planning import LONG_CONTEXT_FROM, HostFigures


def start_calibration(*, pair: ModelPair) -> HostCalibration:
    """Queue a calibration for a worker of the pair's queue: the worker that runs it measures its own host."""
    calibration = HostCalibration.objects.create(pair=pair)
    transaction.on_commit(lambda: current_app.send_task("inference.calibrate", args=[calibration.id],
                                                        queue=pair.queue))
    return calibration


def calibrate_if_missing(*, pair: ModelPair, host: Host) -> HostCalibration | None:
    """A calibration of the pair queued for this host, unless it has one (finished, queued, running or failed:
    a failed one is started again from the admin) or calibrating on load is off."""
    if not settings.CALIBRATE_ON_LOAD or HostCalibration.objects.filter(pair=pair, host=host.signature).exists():
        return None
    with transaction.atomic():
        calibration = start_calibration(pair=pair)
        HostCalibration.objects.filter(id=calibration.id).update(host=host.signature, host_facts=host.facts)
    return calibration


def host_figures(*, pair: ModelPair, host: Host) -> HostFigures:
    """Its latest finished calibration of the pair on this host, or figures that say there is none yet."""
    calibration = selectors.finished_calibration(pair=pair, host=host.signature)
    if calibration is None:
        return HostFigures(host=host.described)
    results = calibration.results
    long_context = results.get("long_context", {})
    return HostFigures(host=host.described, main_alone_config=results["fastest"],
                       own_config=results.get("own_config") or results["fastest"],
                       best_k={int(streams): int(k) for streams, k in results.get("best_k", {}).items()},
                       draft_stop_below=results.get("ks", {}).get(str(results.get("best_k", {}).get("1")), {}).get(
                           "draft_stop_below"),  # the lone answer's K, measured with the draft stopping where unsure
                       draft_alternative=results.get("draft") == "alternative", step_costs=step_costs(results),
                       long_step_costs=step_costs(results, long=True),
                       batch_k=int(results.get("batch_k", 0)),
                       long_context_k=long_context.get("k"),
                       long_context_from=long_context.get("from_tokens") or LONG_CONTEXT_FROM)


def step_costs(results: dict, *, long: bool = False) -> tuple[float, ...]:
    """A draft token (in the weight format the own engine loads) and the verify of 2, 3, ... tokens, each as a share
    of one main token, as the calibration timed them after its short prompts (`long`: after its long one, where the
    draft it loads was timed alone); () where it timed no draft token there (calibrated before it did)."""
    timed = results.get("long_context", {}) if long else results
    drafted = timed.get("draft_ms", {}).get("draft" if long else results.get("draft", "draft"))
    verify = timed.get("verify_cost", {})
    if not drafted or not timed.get("verify_ms") or "2" not in verify:
        return ()
    return (round(drafted / timed["verify_ms"], 3),
            *(verify[str(n)] for n in range(2, len(verify) + 1) if str(n) in verify))


def summary(calibration: HostCalibration) -> dict:
    """A calibration as the admin and /v1/config show it: whose host, when, and what it decided, in figures
    and in a plain sentence."""
    done, _, total = calibration.progress.partition(":")[0].partition("/")
    shown = {"host": Host(calibration.host, calibration.host_facts).described if calibration.host else "",
             "host_signature": calibration.host, "status": calibration.status, "progress": calibration.progress,
             "steps": {"done": int(done or 0), "total": int(total or 0) or 1}, "error": calibration.error,
             "measured_at": calibration.finished_at.isoformat() if calibration.finished_at else None}
    results = calibration.results
    if calibration.status != JobStatus.FINISHED or not results.get("configs"):
        return shown
    configs = results["configs"]
    fastest = {**configs[results["fastest"]], **results.get("fastest_again", {})}  # as measured beside the Ks
    # The baseline every speed-up is weighed against, here, in the admin's list, /v1/config and the chat's line: the
    # fastest main alone as timed beside the Ks, or its answers lately where they wrote faster (a calibration timed
    # while the host was busy understates the main alone, and speculation would be said to pay more than it does).
    lately = selectors.median_rate_lately(pair=calibration.pair, main_alone=True)
    baseline = max(fastest["tokens_per_s"], lately)
    against = (f"the fastest main alone ({fastest['label']}, {fastest['tokens_per_s']:.1f} tok/s)"
               if baseline == fastest["tokens_per_s"] else
               f"the main alone's answers lately ({lately:.1f} tok/s; its calibration: {fastest['tokens_per_s']:.1f})")
    k = int(results.get("best_k", {}).get("1", 0))
    speculating = results.get("ks", {}).get(str(k), {}).get("tokens_per_s") if k else None
    stop = results.get("ks", {}).get(str(k), {}).get("draft_stop_below") if k else None
    stopping = f" (the draft stopping at a token it gives below {stop})" if stop is not None else ""
    if speculating:
        verdict = (f"K={k}{stopping} makes a lone answer {speculating / baseline:.2f}x as fast as {against}: "
                   "the pair speculates.")
    elif results.get("ks"):
        verdict = f"Speculation is slower than {against} on this host: lone answers run on the main alone."
    else:
        verdict = f"The main alone is fastest in {fastest['label']} ({fastest['tokens_per_s']:.1f} tok/s)" + (
            "; speculation was not measured in time, the pair's own K serves." if results.get("own_config") else ".")
    verdict += _under_load(results) + _after_a_long_prompt(results)
    if (timed := results.get("draft_ms")) and "alternative" in timed:
        verdict += (f" A draft token took {timed['draft']:.1f} ms as registered, {timed['alternative']:.1f} ms in its "
                    "other weight format: the own engine loads " + (
                        "the other format." if results.get("draft") == "alternative" else "it as registered."))
    return shown | {
        "main_alone": {name: {"tokens_per_s": line["tokens_per_s"], f"tokens_per_s_{line['streams']}_streams":
                              line["tokens_per_s_streams"]} for name, line in configs.items()},
        "fastest_config": results["fastest"], "own_engine_config": results.get("own_config") or None,
        "best_k": k, "draft_stop_below": stop, "speculation_tokens_per_s": speculating,
        "main_alone_tokens_per_s": baseline, "main_alone_calibrated_tokens_per_s": fastest["tokens_per_s"],
        "main_alone_lately_tokens_per_s": lately or None,
        # each K's lone answers (what the verdict chose from), against the baseline
        "ks": {int(each): {"tokens_per_s": line["tokens_per_s"], "speedup": line["tokens_per_s"] / baseline,
                           "identical": line.get("identical") == line.get("answers")}
               for each, line in sorted(results.get("ks", {}).items(), key=lambda item: int(item[0]))},
        "batch_k": results.get("batch_k", 0),
        "speedup": round(speculating / baseline, 2) if speculating else None,
        # the pair's speculative answers lately against the same baseline: what speculation buys in use
        "speedup_lately": round(rate / baseline, 2) if (rate := selectors.median_rate_lately(
            pair=calibration.pair, main_alone=False)) else None,
        "verify_cost": results.get("verify_cost"), "draft_token_ms": results.get("draft_ms"),
        "draft": results.get("draft", "draft") if results.get("draft_ms") else None,
        "seconds": results.get("seconds"), "verdict": verdict}


CALIBRATION_FAILED = "The calibration failed on this host; an admin can see why on the pair's page."


def public_summary(calibration: HostCalibration) -> dict:
    """summary() as API keys read it (/v1/config): a failure as a code and a sentence, not the exception's own
    text (paths, the library's words), which the admin shows."""
    return summary(calibration) | {"error": {"code": "calibration_failed", "message": CALIBRATION_FAILED}
                                   if calibration.error else None}


def _after_a_long_prompt(results: dict) -> str:
    """What the verdict says of a long conversation's answers, where the calibration measured one."""
    long = results.get("long_context")
    if not long:
        return ""
    alone = max(long["own_main_alone"]["tokens_per_s"], long["fastest"]["tokens_per_s"])
    lookup = long.get("lookup_only")  # measured since the calibration timed the lookup alone there
    said = (f" After a {long['tokens']:,}-token prompt K={results['best_k']['1']} made "
            f"{long['drafted']['tokens_per_s']:.1f} tok/s"
            + (f", the conversation's lookup alone {lookup['tokens_per_s']:.1f}" if lookup else "")
            + f", the main alone {alone:.1f}: ")
    if long["k"]:
        return said + "long answers speculate with the draft too."
    start = long.get("from_tokens") or LONG_CONTEXT_FROM
    return said + f"answers from {start:,} prompt tokens propose from the conversation alone, no draft."


def _under_load(results: dict) -> str:
    """What the verdict says of answers beyond the pair's speculating streams, where the batch's Ks were measured."""
    if not results.get("batch_ks"):
        return ""
    streams = results["configs"][results["fastest"]]["streams"]
    alone = max(results["own_main_alone"]["tokens_per_s_streams"], results["fastest_again"]["tokens_per_s_streams"])
    if not (k := results.get("batch_k")):
        return f" Under load ({streams} at once) no K in the own engine's batch beat the main alone: it serves there."
    rate = results["batch_ks"][str(k)]["tokens_per_s"]
    return (f" Under load answers speculate at K={k} in the own engine's batch: {rate:.1f} tok/s at {streams} at "
            f"once, {rate / alone:.2f}x the fastest main alone there.")
