"""One inference of one model on the PagedAttention op (engines/own/paged_model.py), for every sequence a step holds:
the op's inputs filled as openvino-genai's `model_runner.hpp` fills them, and the rows of logits each sequence reads.

The cache tensors are made once, sized by the model's block pool (engines/own/block_pool.py), and set on the one
infer request; the op writes each new token's keys and values into the block its sequence's table names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov

from inference.engines.own.block_pool import BlockPool
from inference.engines.own.paged_model import LOGITS_INDICES, cache_layout


@dataclass
class Work:
    """One sequence's part of a step: `tokens` after the `past` it has in the blocks of `block_table`, and how many
    of the last fed tokens get a row of logits."""

    block_table: list[int]
    past: int
    tokens: list[int]
    rows: int = 1


class ModelRunner:
    """One compiled model, its cache tensors and its block pool; `run` is called by one thread at a time (the
    model's scheduler, engines/own/scheduler.py)."""

    def __init__(self, compiled: ov.CompiledModel, *, pool_bytes: int):
        self.compiled = compiled
        self.layout = cache_layout(compiled)
        blocks = max(pool_bytes // self.layout.block_bytes, 1)
        self.pool = BlockPool(blocks=blocks, block_tokens=self.layout.block_tokens,
                              block_bytes=self.layout.block_bytes)
        self.request = compiled.create_infer_request()
        self.cache = self.layout.tensors(blocks)
        for name, tensor in self.cache.items():
            self.request.set_tensor(name, tensor)

    @property
    def block_tokens(self) -> int:
        return self.layout.block_tokens

    def run(self, works: list[Work]) -> list[np.ndarray]:
        """Each work's rows of logits [rows, vocabulary], from one inference."""
        size = self.block_tokens
        lengths = [len(work.tokens) for work in works]
        begins = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tables = [work.block_table[: -(-(work.past + n) // size)] for work, n in zip(works, lengths, strict=True)]
        table_begins = np.concatenate([[0], np.cumsum([len(table) for table in tables])]).astype(np.int32)
        rows = np.concatenate([np.arange(end - work.rows, end) for work, end in zip(works, begins[1:], strict=True)])
        inputs = {
            "input_ids": np.concatenate([np.asarray(work.tokens, dtype=np.int64) for work in works]),
            "position_ids": np.concatenate([np.arange(work.past, work.past + n, dtype=np.int64)
                                            for work, n in zip(works, lengths, strict=True)]),
            "past_lens": np.array([work.past for work in works], dtype=np.int32),
            "subsequence_begins": begins,
            "block_indices": np.concatenate([np.asarray(table, dtype=np.int32) for table in tables]),
            "block_indices_begins": table_begins,
            "max_context_len": np.array(max(work.past + n for work, n in zip(works, lengths, strict=True)),
                                        dtype=np.int32),
            LOGITS_INDICES: rows.astype(np.int64),
        }
        self.request.infer(inputs)
        logits = self.request.get_output_tensor(0).data  # [rows, 1, vocabulary]
        answers, first = [], 0
        for work in works:
            answers.append(logits[first:first + work.rows, 0].copy())
            first += work.rows
        return answers
