"""The exact acceptance rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023), as the own
engine (engines/own/engine.py) applies it to one step's proposals. Nothing else lives here: proposing, the
caches, grammars and stop strings are the engine's.

The words used:
- draft tokens (proposals): the K tokens the draft proposes in a step, each drawn from q, the draft's
  distribution at its position (its argmax at temperature 0).
- target distribution p: the main's distribution at a position, from the logits of the one inference that
  scores all K+1 positions. `probabilities` shapes p and q as openvino-genai's sampler does for the main
  alone (softmax with temperature, then the nucleus, then the top k), so the answers follow the main alone's.
- accepted tokens: the proposals kept, in order until the first rejection. A draft token x is accepted with
  probability min(1, p(x) / q(x)); at temperature 0, while it is the main's own argmax.
- recovered token: at the first rejection, one token drawn from norm(max(0, p - q)) in its place (at
  temperature 0, the main's argmax there).
- bonus token: when every proposal is accepted, one more drawn from p at the position after them.
So a step delivers its accepted tokens and one recovered or bonus token: 1 to K+1 tokens, distributed as the
main alone's.
- fixed proposals: tokens proposed without drawing (prompt lookup, proposers/prompt_lookup.py): q is one-hot on each,
  and the rule reads as accept_fixed says.
"""

from __future__ import annotations

import numpy as np

from inference.engines.decoding import Sampling

NUCLEUS_CANDIDATES = 2048  # top_p is ranked among this many most likely tokens first


def probabilities(logits: np.ndarray, params: Sampling) -> np.ndarray:
    """The distribution a token is drawn from, as openvino-genai's sampler shapes it: softmax of
    logits / T, then the smallest set of most likely tokens whose mass exceeds top_p, then the top k of
    those; renormalised. Temperature 0: all mass on the argmax."""
    if params.temperature == 0:
        onehot = np.zeros(logits.shape[-1])
        onehot[int(np.argmax(logits))] = 1.0
        return onehot
    z = (logits.astype(np.float64) - logits.max()) / params.temperature
    probs = np.exp(z)
    probs /= probs.sum()
    keep = nucleus(probs, params.top_p) if params.top_p < 1.0 else None
    if 0 < params.top_k < (len(keep) if keep is not None else len(probs)):
        keep = keep[: params.top_k] if keep is not None else np.argpartition(-probs, params.top_k)[: params.top_k]
    if keep is None:
        return probs
    shaped = np.zeros_like(probs)
    shaped[keep] = probs[keep]
    return shaped / shaped.sum()


def nucleus(probs: np.ndarray, top_p: float, *, candidates: int = NUCLEUS_CANDIDATES) -> np.ndarray:
    """The smallest set of most likely tokens whose mass exceeds top_p, most likely first (ties by id, as a
    stable sort ranks them). Ranked among the `candidates` most likely tokens when they hold that mass,
    else among all: on a large vocabulary a full sort costs many times a softmax."""
    if len(probs) > candidates:
        floor = np.partition(probs, len(probs) - candidates)[len(probs) - candidates]
        ranked = np.flatnonzero(probs >= floor)  # with every tie at the floor: exactly the full ranking's head
    else:
        ranked = np.arange(len(probs))
    order = ranked[np.argsort(-probs[ranked], kind="stable")]
    mass = np.cumsum(probs[order])
    cut = int(np.searchsorted(mass, top_p, side="right")) + 1
    if cut > len(order) and len(order) < len(probs):  # the head holds too little mass: rank them all
        return nucleus(probs, top_p, candidates=len(probs))
    return order[:cut]


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    if probs.max() == 1.0:
        return int(np.argmax(probs))
    return int(rng.choice(len(probs), p=probs))


def greedy_accept(proposals: list[int], main_logits: np.ndarray) -> tuple[int, int]:
    """The rule at temperature 0: how many proposals are the main's own choices, and the main's token after
    them (the recovered token at the first mismatch, else the bonus token). `main_logits`: one row per
    position, K+1 rows."""
    choices = main_logits.argmax(axis=-1)
    accepted = next((i for i, x in enumerate(proposals) if x != choices[i]), len(proposals))
    return accepted, int(choices[accepted])


def accept(proposals: list[int], qs: list[np.ndarray], main_logits: np.ndarray, *, params: Sampling,
           rng: np.random.Generator) -> tuple[int, int]:
    """How many proposals the rule keeps, and the token the main adds: each proposal x is accepted with
    probability min(1, p(x)/q(x)); the first rejection draws the recovered token from norm(max(0, p - q)),
    else the bonus token is drawn from p. `qs`: the draft's distribution each proposal was drawn from."""
    for i, (x, q) in enumerate(zip(proposals, qs, strict=True)):
        p = probabilities(main_logits[i], params)
        if rng.random() < min(1.0, p[x] / q[x]):
            continue
        residual = np.maximum(p - q, 0.0)
        return i, draw(residual / residual.sum(), rng)
    return len(proposals), draw(probabilities(main_logits[len(proposals)], params), rng)


def accept_fixed(proposals: list[int], main_logits: np.ndarray, *, params: Sampling,
                 rng: np.random.Generator) -> tuple[int, int]:
    """`accept` for proposals whose q is one-hot (chosen, not drawn): draw y from p at each position and keep
    the proposal x while y == x; the first y != x is the recovered token, else y after them is the bonus.
    The same law: P(keep x) = p(x) = min(1, p(x)/q(x)), and a y != x is drawn from p without x, renormalised,
    which is norm(max(0, p - q)); no one-hot arrays, no residual."""
    for i, x in enumerate(proposals):
        token = draw(probabilities(main_logits[i], params), rng)
        if token != x:
            return i, token
    return len(proposals), draw(probabilities(main_logits[len(proposals)], params), rng)
