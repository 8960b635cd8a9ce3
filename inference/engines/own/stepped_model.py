"""The stateful IR as the own engine steps it: one step's inputs, stated once, and an output head computed for the
rows of logits the engine reads, not for every position fed.

The exported IR turns every fed position's hidden state into a row of logits over the whole vocabulary. The engine
reads all of them only when the main verifies a proposal (a row per proposed token); a prefill, a row of the
main alone's batch and every draft inference read the last row alone. So the model gets one more input,
`logits_rows`, and its head reads the last that many positions: a 1,000-token prompt's prefill no longer runs the
main's head 1,000 times nor writes 1,000 x 151,936 floats (580 MiB) to read one row of them. openvino-genai's
pipeline cuts its head the same way. A row kept is the one the whole head gives: to the bit where the CPU's kernels
compute a row alike alone and among others (AVX-512), within 1e-5 where they do not (AVX2; docs/exactness.md).
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops

LOGITS_ROWS = "logits_rows"


def read_stepped(core: ov.Core, model_dir: str) -> ov.Model:
    """The IR in `model_dir`, its head computing the last `logits_rows` positions only."""
    model = core.read_model(f"{model_dir}/openvino_model.xml")
    matmul = logits_matmul(model)
    rows = ops.parameter([1], ov.Type.i64, name=LOGITS_ROWS)
    rows.output(0).set_names({LOGITS_ROWS})
    last = ops.slice(matmul.input_value(0), ops.negative(rows), ops.constant([np.iinfo(np.int64).max]),
                     ops.constant([1]), ops.constant([1]))  # [batch, positions, hidden]: along the positions
    matmul.input(0).replace_source_output(last.output(0))
    model.add_parameters([rows])
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


def step_inputs(token_ids: np.ndarray, *, positions: np.ndarray, attention_mask: np.ndarray, rows: int) -> dict:
    """One inference's inputs: tokens and their positions [batch, n], the mask over every slot [batch, slots], and
    how many of the last positions get a row of logits."""
    return {"input_ids": token_ids, "attention_mask": attention_mask, "position_ids": positions,
            "beam_idx": np.arange(token_ids.shape[0], dtype=np.int32), LOGITS_ROWS: np.array([rows], dtype=np.int64)}
