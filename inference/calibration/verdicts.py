"""What a calibration's figures say (measure.py measures them): the K a lone answer gets, the K answers get in
the own engine's batch, and where the library's main alone serves rather than the own engine's."""

# The main alone leaves the own engine's batch for the library's pipeline (a second copy of its weights) only
# where the library's was this much faster (beyond a run's spread), and its first tokens came no later: at four
# streams the library prefills every prompt before it decodes, so a little more tokens/s can come with first tokens
# twice as late (docs/calibration.md#what-a-calibration-measures).
LIBRARY_MARGIN = 1.05


def best_k(results: dict) -> int:
    """The K a lone answer is fastest with, 0 when none beats the fastest main alone (as measured beside the Ks,
    and the own engine's main alone)."""
    alone = _lone_main_alone(results)
    drafted = {int(k): line["tokens_per_s"] for k, line in results.get("ks", {}).items()
               if line["identical"] == line["answers"]}
    k = max(drafted, key=drafted.__getitem__, default=0)
    return k if k and drafted[k] > alone else 0


def _lone_main_alone(results: dict) -> float:
    """The faster main alone for a lone answer, tokens/s: the fastest configuration's (as measured beside the Ks) or
    the own engine's."""
    return max(results.get("fastest_again", results["configs"][results["fastest"]])["tokens_per_s"],
               results.get("own_main_alone", {}).get("tokens_per_s", 0.0))


def best_batch_k(results: dict) -> int:
    """The K answers beyond the pair's speculating streams are fastest with in the own engine's batch, 0 where none
    beat the own engine's batched main alone, which serves them otherwise (the library's main alone computes another
    answer: it serves no answer of an own-engine pair), with every answer the batched main alone's."""
    own = results.get("own_main_alone")
    if not own:
        return 0
    alone = own["tokens_per_s_streams"]
    drafted = {int(k): line["tokens_per_s"] for k, line in results.get("batch_ks", {}).items()
               if line["identical"] == line["answers"] and line["tokens_per_s"] > alone}
    return max(drafted, key=drafted.__getitem__, default=0)


def library_alone(results: dict) -> dict[str, bool]:
    """{streams: whether the library's main alone, in the configuration it serves in, beat the own engine's: more
    tokens a second by the margin, its first tokens no later (where both were timed)}. Not at several streams where
    answers speculate in the own engine's batch: that K beat the library's main alone there."""
    own, fastest = results.get("own_main_alone"), results["configs"][results["fastest"]]
    if not own:
        return {}
    again = results.get("fastest_again", fastest)  # measured beside the own engine's lines

    def beats(suffix: str) -> bool:
        library_first, own_first = again.get(f"first_token_ms{suffix}"), own.get(f"first_token_ms{suffix}")
        return (again[f"tokens_per_s{suffix}"] > LIBRARY_MARGIN * own[f"tokens_per_s{suffix}"]
                and (library_first is None or own_first is None or library_first <= own_first))

    return {"1": beats(""), str(fastest["streams"]): beats("_streams") and not results.get("batch_k")}


def long_context_from(results: dict) -> int | None:
    """From how many prompt tokens a lone answer plans by the figures measured after the long prompt: where its gain
    over the fastest main alone falls to nothing, read as linear in the prompt's length between the short prompts'
    gain and the long one's (what grows with the context is the verify of K+1 and the rollback of rejected tokens,
    both about linearly: docs/benchmark.md#a-long-conversation). None where speculation still pays after the long
    prompt, or where the figures lack: the planner's default then (serving/planning/inputs.py, LONG_CONTEXT_FROM)."""
    long, k = results.get("long_context"), results.get("best_k", {}).get("1")
    short_tokens = results.get("prompt_tokens")
    if not long or not k or not short_tokens or long["k"]:
        return None
    alone = _lone_main_alone(results)
    short_gain = results["ks"][str(k)]["tokens_per_s"] / alone
    long_gain = long["drafted"]["tokens_per_s"] / max(long["own_main_alone"]["tokens_per_s"],
                                                       long["fastest"]["tokens_per_s"])
    if short_gain <= 1 or long_gain >= short_gain:
        return None
    share = (short_gain - 1) / (short_gain - long_gain)  # of the way from the short prompts to the long one
    return round(short_tokens + min(share, 1.0) * (long["tokens"] - short_tokens))
