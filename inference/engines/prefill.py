"""The prompts a model prefilled lately, kept: a request whose prompt is one of them (an answer asked again,
many samples of one prompt) starts from a copy of that cache instead of prefilling it again.

On a CPU the prefill is most of a short answer's time (docs/configuration.md, SPECCHAT_PROMPT_CACHE_TOKENS).
The copy is bitwise what the prefill computes (the same model, inputs and kernels), so answers do not change.
Only whole prompts match: a prompt that merely starts like a kept one is prefilled in full (a prefill in two parts
runs other kernels, which move the last bits).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import openvino as ov

from inference.engines.spec import KEPT_TOKENS
from inference.engines.stepped_model import step_inputs


class PrefillCache:
    """One compiled model's recent prompts: their KV state and the last token's logits, least recent first."""

    def __init__(self, *, kept_tokens: int = KEPT_TOKENS):
        self.kept_tokens = kept_tokens
        self._kept: OrderedDict[tuple[int, ...], tuple[dict[str, np.ndarray], np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def prefill(self, request: ov.InferRequest, prompt_ids: list[int]) -> np.ndarray:
        """The last prompt token's logits [1, vocabulary], `request` (fresh or reset) then holding the prompt."""
        key = tuple(prompt_ids)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                self.hits += 1
        if kept is not None:
            states, logits = kept
            for state in request.query_state():
                state.state = ov.Tensor(states[state.name])
            return logits
        n = len(prompt_ids)
        request.infer(step_inputs(np.array([prompt_ids], dtype=np.int64), positions=np.arange(n, dtype=np.int64)[None],
                                  attention_mask=np.ones((1, n), dtype=np.int64), rows=1))
        logits = request.get_output_tensor(0).data[0].copy()
        if n <= self.kept_tokens:
            states = {state.name: np.array(state.state.data) for state in request.query_state()}
            with self._lock:
                self._kept[key] = (states, logits)
                while sum(map(len, self._kept)) > self.kept_tokens:
                    self._kept.popitem(last=False)
        return logits
