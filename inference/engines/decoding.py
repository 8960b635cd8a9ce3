"""A request's decoding settings: how tokens are chosen (Sampling) and the rest of what an engine needs
(DecodingParams). Plain values: the web side builds them, records them and checks them
(engines/library/config.py turns them into openvino-genai's terms)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from inference.engines.grammar.grammar import Grammar


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How tokens are chosen; temperature 0 is greedy (then the output is exactly the main's)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0  # > 1 makes tokens already in the sequence less likely (engines/own/penalty.py)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False  # each token's log probability under the main's own (raw) distribution
    top_logprobs: int = 0  # and this many most likely alternatives at each position (the own engine only)
    grammar_kind: str = ""  # output held to a grammar (engines/grammar/grammar.py): one of its FIELDS, or none
    grammar_text: str = ""

    @property
    def grammar(self) -> Grammar | None:
        return Grammar(kind=self.grammar_kind, text=self.grammar_text) if self.grammar_kind else None

    def sampling(self) -> dict:
        """These fields alone, to build another Sampling from this one."""
        return {f.name: getattr(self, f.name) for f in fields(Sampling)}


@dataclass(frozen=True, kw_only=True)
class Speculation:
    """How an answer speculates: the one value its plan hands an engine (serving/planning/rules.py). An answer with
    none runs the main alone."""

    k: int | None = None  # the most tokens proposed a step; None: the library's confidence threshold sets each step's
    threshold: float | None = None  # the library's dynamic K (OVMS's assistant_confidence_threshold)
    # The own engine's draft proposes up to K but holds back a token it gives a probability below this (the planner
    # sets it where the host's calibration measured the Ks so; engines/own/proposers/draft_model.py).
    draft_stop_below: float | None = None
    # The host's calibrated costs, a draft token and then the verify of 2, 3, ... tokens, each as a share of one main
    # token: with them the own engine's draft proposes, up to K, what this answer's acceptance pays for best
    # (engines/own/step_length.py; the planner sets them where the request left K to the pair).
    step_costs: tuple[float, ...] = ()
    # Beyond the pair's speculating streams the own engine's answers run in one batch: there this answer speculates
    # at this K, or with None goes on as the main alone (engines/own/engine.py; the planner sets it where the host's
    # calibration measured speculating in the batch faster than the main alone's batch, or the request named a K).
    batch_k: int | None = None
    # The own engine proposes from the conversation alone, no draft inference (engines/own/proposers/chain.py): after
    # a long prompt where the host's calibration measured the draft not paying (the planner sets it).
    lookup_only: bool = False

    def __post_init__(self) -> None:
        if (self.k is None) == (self.threshold is None):
            raise ValueError(f"speculation takes a K or a confidence threshold, one of them: {self}")


@dataclass(frozen=True, kw_only=True)
class DecodingParams(Sampling):
    """One request's resolved pipeline settings."""

    max_new_tokens: int
    speculation: Speculation | None = None  # None: the main alone
    max_ngram_size: int = 3
    # Whose cached blocks the own engine may give this answer (engines/own/block_pool.py): "" shares with every request
    # that says "" (SPECCHAT_PREFIX_CACHE_SCOPE=server). The web side sets it: serving/web.py, cache_scope.
    cache_scope: str = ""
