"""A grammar on the own engine: which tokens may come next, by llguidance (Rust, no torch).

The library applies a grammar to the main only (xgrammar inside, not reachable from Python), so a draft
beside it proposes tokens the constrained main must refuse. Here one matcher follows the answer and
gives the mask of allowed tokens at each position: the draft proposes under it (its q masked) and the
main verifies under it (its p masked), so the exact rule stays exact for the constrained main and the
draft no longer wastes proposals on refused tokens. After a step the matcher is rolled back over the
rejected proposals and takes the main's own token.

The vocabulary comes from the main's OpenVINO detokenizer (every pair has one; not every pair has a
Hugging Face tokenizer.json): its VocabDecoder's constants hold each token's bytes.
"""

from __future__ import annotations

from pathlib import Path

import llguidance as llg
import numpy as np
import openvino as ov
import openvino_tokenizers  # noqa: F401  (registers the tokenizer operations read_model needs)

from inference.engines.grammar.compilers import llguidance_grammar
from inference.engines.grammar.grammar import Grammar


def vocabulary(model_dir: str) -> tuple[list[bytes], list[int]]:
    """Each token id's bytes, and the ids of special tokens (those the detokenizer skips).

    Only the VocabDecoder node is held, and its constants are copied out: Python references to all the
    nodes of a tokenizer model, left after the model, crashed the process (openvino 2026.4)."""
    model = ov.Core().read_model(str(Path(model_dir, "openvino_detokenizer.xml")))
    decoder = next(op for op in model.get_ordered_ops() if op.get_type_name() == "VocabDecoder")
    begins, ends, chars, special = (decoder.input_value(i).get_node().get_data().copy() for i in (1, 2, 3, 4))
    del decoder, model
    text = bytes(chars)
    return [text[begin:end] for begin, end in zip(begins, ends, strict=True)], [int(i) for i in special]


class _Vocabulary:
    """What llguidance asks of a tokenizer (its TokenizerWrapper protocol)."""

    def __init__(self, model_dir: str, tokenizer, eos_ids: set[int]):
        self.tokens, self.special_token_ids = vocabulary(model_dir)
        self.eos_token_id = min(eos_ids)
        self.bos_token_id = None
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return [int(t) for t in self._tokenizer.encode(text, add_special_tokens=False).input_ids.data[0]]


def load_vocabulary(model_dir: str, tokenizer, eos_ids: set[int]) -> llg.LLTokenizer:
    """The main's vocabulary for llguidance (built once per engine: a second or so on 152k tokens)."""
    wrapper = _Vocabulary(model_dir, tokenizer, eos_ids)
    return llg.LLTokenizer(llg.TokenizerWrapper(wrapper), eos_token=sorted(eos_ids))


class TokenConstraint:
    """One answer's grammar state: the allowed next tokens, and the tokens taken so far."""

    def __init__(self, vocab: llg.LLTokenizer, grammar: Grammar):
        self.matcher = llg.LLMatcher(vocab, llguidance_grammar(grammar), log_level=0)
        self._check()

    def allowed(self) -> np.ndarray:
        """Which tokens the grammar allows next, by id (as wide as the vocabulary, rounded up to 32)."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little").astype(bool)

    @property
    def ended(self) -> bool:
        """The grammar is complete and allows nothing more, EOS included: nothing may be proposed."""
        return self.matcher.is_stopped()

    def take(self, token: int) -> None:
        self.matcher.consume_token(token)
        self._check()

    def rollback(self, n: int) -> None:
        if n:
            self.matcher.rollback(n)
            self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise ValueError(f"the grammar refused the answer: {self.matcher.get_error()}")


def masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """The logits with the tokens `allowed` refuses at -inf (`allowed`: a row per position when verifying).
    Ids past the tokenizer's vocabulary (a model's rows may be wider) are refused."""
    width = logits.shape[-1]
    fitted = allowed[..., :width]
    if fitted.shape[-1] < width:
        fitted = np.pad(fitted, [(0, 0)] * (fitted.ndim - 1) + [(0, width - fitted.shape[-1])])
    return np.where(fitted, logits, -np.inf)
