"""The IR as the own engine runs it: OpenVINO's PagedAttention op in place of the stateful IR's attention, so the
engine owns the keys and values (engines/own/block_pool.py) and every sequence of a step is one row of a flat batch,
and an output head computed for the rows the engine reads.

`paged_attention_transformation` (the one openvino-genai's continuous-batching pipeline applies) gives the model the
op's inputs: the step's new tokens of every sequence concatenated, each sequence's tokens already cached, its block
table, and one cache tensor per layer for keys and one for values, which the op writes in place. Taking back tokens
is then a shorter sequence: nothing is copied (the stateful IR's CPU plugin copied the whole cache on every rollback).

The head: the exported IR turns every fed token's hidden state into a row of logits over the whole vocabulary; a
Gather before it (`logits_indices`, as openvino-genai's `sampled_tokens_indices`) keeps the rows the engine reads:
a prefill reads one row, a verify of K proposals K+1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino._offline_transformations import paged_attention_transformation

LOGITS_INDICES = "logits_indices"


def read_paged(core: ov.Core, model_dir: str) -> ov.Model:
    """The IR in `model_dir` on the PagedAttention op, its head computing the rows at `logits_indices` only."""
    model = core.read_model(f"{model_dir}/openvino_model.xml")
    paged_attention_transformation(model)
    matmul = logits_matmul(model)
    indices = ops.parameter([-1], ov.Type.i64, name=LOGITS_INDICES)
    indices.output(0).set_names({LOGITS_INDICES})
    # the hidden states are [tokens, 1, hidden]: one per fed token, along the first axis
    kept = ops.gather(matmul.input_value(0), indices, ops.constant(0))
    matmul.input(0).replace_source_output(kept.output(0))
    model.add_parameters([indices])
    model.validate_nodes_and_infer_types()
    return model


def logits_matmul(model: ov.Model) -> ov.Node:
    """The MatMul of the model's output head (a cast of its result aside)."""
    node = model.output("logits").get_node().input_value(0).get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    if node.get_type_name() != "MatMul":
        raise UnsupportedHead(f"the logits come from a {node.get_type_name()}, not the head's MatMul")
    return node


class UnsupportedHead(ValueError):
    """A head this engine cannot cut (group-wise int4 weights, a bias, a head that is not one MatMul)."""


@dataclass(frozen=True)
class CacheLayout:
    """What the compiled model wants of its cache: per layer a key and a value tensor of [blocks, *block_shape]."""

    names: tuple[str, ...]  # key_cache.0, value_cache.0, key_cache.1, ...
    block_shapes: tuple[tuple[int, ...], ...]  # each tensor's block: (kv heads, block tokens, head size) on the CPU
    element_type: ov.Type  # f32, or bf16 where the model infers in bf16

    @property
    def block_tokens(self) -> int:
        return self.block_shapes[0][1]

    @property
    def block_bytes(self) -> int:
        """One block of every layer's keys and values."""
        return sum(int(np.prod(shape)) for shape in self.block_shapes) * self.element_type.size

    def tensors(self, blocks: int) -> dict[str, ov.Tensor]:
        """The cache for `blocks` blocks, allocated by OpenVINO (aligned as its kernels want) and not cleared: the op
        reads a slot only once a step has written it. A large pool's pages count once a block on them is written."""
        return {name: ov.Tensor(self.element_type, ov.Shape([blocks, *shape]))
                for name, shape in zip(self.names, self.block_shapes, strict=True)}


def cache_layout(compiled: ov.CompiledModel) -> CacheLayout:
    names, shapes, element_type = [], [], None
    for port in compiled.inputs:
        name = port.get_any_name()
        if name.startswith(("key_cache.", "value_cache.")):
            names.append(name)
            shapes.append(tuple(dim.get_length() for dim in list(port.get_partial_shape())[1:]))
            element_type = port.get_element_type()
    if not names or element_type is None:
        raise ValueError("the model has no PagedAttention cache inputs")
    if any(shape[1] != shapes[0][1] for shape in shapes):
        raise ValueError(f"the layers' blocks differ in tokens: {shapes}")
    return CacheLayout(tuple(names), tuple(shapes), element_type)
