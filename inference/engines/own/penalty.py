"""The repetition penalty (Keskar et al. 2019, CTRL) as openvino-genai's sampler and Hugging Face apply it: every token
already in the sequence, prompt included, has its logit divided by the penalty where it is positive and multiplied
where it is negative, before the temperature. Publishers advise it for their chat models (Qwen: 1.05 for its coder
models), so that an answer does not run in circles.

Speculation stays exact under it: the main's row at a verified position is penalised for the sequence up to that
position, proposals before it included, as the main alone would see it had it written them; the draft's rows are
penalised alike, so that its q stays close to that p (engines/own/acceptance.py asks only that proposals be drawn from
the q given)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class RepetitionPenalty:
    """One answer's penalty: the tokens of its sequence so far, and the rows it shapes."""

    def __init__(self, penalty: float, tokens: Iterable[int]):
        self.penalty = penalty
        self.seen: set[int] = set(tokens)
        self._ids: np.ndarray | None = None

    def extend(self, tokens: Iterable[int]) -> None:
        """The answer's new tokens, part of the sequence from now on."""
        before = len(self.seen)
        self.seen.update(tokens)
        if len(self.seen) != before:
            self._ids = None

    def row(self, logits: np.ndarray, ahead: Sequence[int] = ()) -> np.ndarray:
        """A copy of one position's logits, penalised for the sequence and then the tokens `ahead` (proposals not
        yet kept, before this position)."""
        if self._ids is None:
            self._ids = np.fromiter(self.seen, dtype=np.int64, count=len(self.seen))
        ids = self._ids
        extra = [token for token in dict.fromkeys(ahead) if token not in self.seen]
        if extra:
            ids = np.concatenate([ids, np.asarray(extra, dtype=np.int64)])
        shaped = logits.copy()
        values = shaped[ids]
        shaped[ids] = np.where(values >= 0, values / self.penalty, values * self.penalty)
        return shaped

    def rows(self, logits: np.ndarray, proposals: Sequence[int]) -> np.ndarray:
        """The K+1 rows a step verifies, row i penalised for the sequence and the first i proposals."""
        return np.stack([self.row(logits[i], proposals[:i]) for i in range(len(logits))])
