"""The draft's output head cut to a sub-vocabulary when the own engine loads it: a cheaper draft, still exact.

Per token a draft reads its whole output head, on a large vocabulary a good share of what it reads
(docs/benchmark.md#the-drafts-head). The answers it drafts use a small part of the vocabulary
(pairs/head_vocabulary.py chooses which); a head over those rows alone reads a fraction of that. Exactness does not
rest on the draft: a token outside the rows gets q = 0 and is never proposed, greedy verification keeps the main's
own tokens, and the sampling rule (engines/own/acceptance.py) is exact for any q.

The cut is made on the model read from the IR, before compiling: the logits MatMul's weight subgraph (int8 Constant
-> Convert -> [Subtract zero point] -> Multiply scale, or f16 Constant -> Convert) is rebuilt from the kept rows of
its constants, so the plugin compiles an ordinary, smaller compressed head. An embedding table tied to the head keeps
all its rows. No second IR: the library's pipeline reads the same files, whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from inference.engines.own.paged_model import UnsupportedHead, logits_matmul, read_paged

# What stands between the head's weight constants and its MatMul, rebuilt from new inputs.
DECOMPRESSION = {
    "Convert": lambda node, inputs: ops.convert(inputs[0], node.get_output_element_type(0)),
    "Subtract": lambda node, inputs: ops.subtract(*inputs),
    "Multiply": lambda node, inputs: ops.multiply(*inputs),
}


@dataclass(frozen=True)
class DraftHead:
    """The rows a cut head kept: row i of its logits is full-vocabulary token ids[i] (ascending)."""

    ids: np.ndarray
    width: int  # the full head's rows

    def widen(self, row: np.ndarray) -> np.ndarray:
        """A cut head's row of logits as the full head's, -inf at the rows cut: softmax gives them 0."""
        full = np.full(self.width, -np.inf, dtype=row.dtype)
        full[self.ids] = row
        return full


def compile_draft(core: ov.Core, *, draft_dir: str, head_ids: str, device: str, properties: dict
                  ) -> tuple[ov.CompiledModel, DraftHead | None]:
    """The draft compiled as the own engine runs it (engines/own/paged_model.py), its head cut to the ids in the file
    `head_ids` (whole when "")."""
    model = read_paged(core, draft_dir)
    head = cut_head(model, load_head_ids(head_ids)) if head_ids else None
    return core.compile_model(model, device, properties), head


def load_head_ids(path: str | Path) -> np.ndarray:
    ids = np.load(path, allow_pickle=False)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or np.any(np.diff(ids) <= 0):
        raise ValueError(f"{path}: not an ascending list of token ids")
    return ids.astype(np.int64)


def cut_head(model: ov.Model, ids: np.ndarray) -> DraftHead:
    """Keep the head's rows at `ids` only: the model's logits become those rows, in that order."""
    matmul = logits_matmul(model)
    width = matmul.get_output_partial_shape(0)[-1]
    if width.is_dynamic:
        raise UnsupportedHead("the head's width is not static")
    vocab = width.get_length()
    if ids.size == 0 or ids[0] < 0 or ids[-1] >= vocab:
        raise ValueError(f"token ids must lie in 0..{vocab - 1}")
    axis = -2 if matmul.get_attributes()["transpose_b"] else -1
    matmul.input(1).replace_source_output(_kept_rows(matmul.input_value(1), ids, vocab=vocab, axis=axis))
    model.validate_nodes_and_infer_types()
    return DraftHead(ids=ids, width=vocab)


def _kept_rows(output: ov.Output, ids: np.ndarray, *, vocab: int, axis: int) -> ov.Output:
    """`output` (the head's weights or a step of their decompression) computed from the kept rows alone: constants
    cut along the vocabulary axis, the steps after them cloned (a tied embedding's own path keeps the originals)."""
    node = output.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        if node.get_element_type().bitwidth < 8:
            raise UnsupportedHead("sub-byte weights (int4) are packed: their rows cannot be cut here")
        data = node.get_data()
        if data.ndim < -axis or data.shape[axis] == 1:
            return output  # one value for every row (a per-tensor scale or zero point)
        if data.shape[axis] != vocab:
            raise UnsupportedHead(f"a head constant of shape {data.shape} is not per row (group-wise?)")
        return ov.op.Constant(np.ascontiguousarray(np.take(data, ids, axis=axis))).output(0)
    if kind not in DECOMPRESSION:
        raise UnsupportedHead(f"a {kind} in the head's weights")
    clone = DECOMPRESSION[kind](node, [_kept_rows(value, ids, vocab=vocab, axis=axis) for value in node.input_values()])
    clone.set_friendly_name(f"{node.get_friendly_name()}/kept_rows")
    for key, value in node.get_rt_info().items():  # a "decompression" mark keeps the plugin from folding it to f32
        clone.set_rt_info(value, key)
    return clone.output(0)
