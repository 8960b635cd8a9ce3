"""The demo pair's main in the memory-bound regime, built from the committed main without torch.

Real LLMs on a CPU are memory-bound: each step streams every weight from RAM, so verifying K+1 tokens
costs little more than one, which is where speculation pays. The committed 62 M-parameter main is
compute-bound here (4 new tokens cost ~1.85 single-token steps). This builder grows it the Net2Net way,
function-preserving: every MLP hidden unit is repeated GROWTH times (gate and up rows tiled, the down
projection's columns tiled and divided by GROWTH), so the grown main computes what the committed one
computes (to float16 rounding), at the cost of a ~230 M-parameter model with float16 MLP weights. The
IR is written next to the committed one (gitignored) and checked by its sha256.

    python -m inference.demo.main_model          # build if missing or changed; print the checksum
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
from openvino import opset13 as ops

GROWTH = 4
PAIR_DIR = Path(__file__).resolve().parents[1] / "models" / "demo-code"
SOURCE = PAIR_DIR / "main"
TARGET = PAIR_DIR / "main-large"
MANIFEST = "grown.json"
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _decompression(matmul: ov.Node) -> tuple[ov.Node, ov.Node, ov.Node]:
    """The (weight, zero point, scale) constants of a compressed MatMul weight:
    Constant(u8) -> Convert -> Subtract(zero point) -> Multiply(scale) -> Convert -> MatMul."""
    multiply = matmul.input_value(1).get_node().input_value(0).get_node()
    subtract = multiply.input_value(0).get_node()
    weight = subtract.input_value(0).get_node().input_value(0).get_node()
    zero_point = _constant(subtract.input_value(1).get_node())
    scale = _constant(multiply.input_value(1).get_node())
    if not (multiply.get_type_name() == "Multiply" and subtract.get_type_name() == "Subtract"
            and weight.get_type_name() == "Constant"):
        raise ValueError(f"unexpected weight decompression at {matmul.get_friendly_name()}")
    return weight, zero_point, scale


def _constant(node: ov.Node) -> ov.Node:
    while node.get_type_name() != "Constant":  # a Convert (u8 -> f16) before the constant
        node = node.input_value(0).get_node()
    return node


def grow(model: ov.Model, growth: int) -> int:
    """Widen every MLP `growth` times in place, its weights as float16; returns how many projections
    were grown. float16, not the committed int8: on this AVX2 CPU the int8 kernels decompress per
    token, so 4 tokens cost 1.6 single-token steps (compute-bound again); float16 weights stream
    twice the bytes and keep verification cheap (the regime of real LLMs on a CPU)."""
    return _resize_mlps(model, lambda projection, w: np.tile(w, (1, growth)) / growth if projection == "down_proj"
                        else np.tile(w, (growth, 1)))


def shrink(model: ov.Model, growth: int) -> int:
    """Undo a Net2Net widening of `growth` in place (the committed main was widened 8x after training):
    the same function at the trained model's cost, for generating the draft's training data quickly."""
    def first_copy(projection: str, w: np.ndarray) -> np.ndarray:
        if projection == "down_proj":
            return w[:, : w.shape[1] // growth] * growth
        return w[: w.shape[0] // growth]
    return _resize_mlps(model, first_copy)


def _resize_mlps(model: ov.Model, resize) -> int:
    """Replace every MLP projection's compressed weight by `resize(projection, dequantized)` in float16.
    Hidden units are rows of gate/up and columns of down."""
    resized = 0
    for op in model.get_ordered_ops():
        name = op.get_friendly_name()
        projection = next((p for p in PROJECTIONS if f".mlp.{p}/" in name), None)
        if op.get_type_name() != "MatMul" or projection is None:
            continue
        weight, zero_point, scale = _decompression(op)
        w, zp, s = (n.get_data().astype(np.float32) for n in (weight, zero_point, scale))
        to_f32 = op.input_value(1).get_node()  # Convert(f16 -> f32) of the decompressed weight
        as_f16 = ops.constant(resize(projection, (w - zp) * s).astype(np.float16), dtype=ov.Type.f16)
        to_f32.input(0).replace_source_output(as_f16.output(0))
        resized += 1
    model.validate_nodes_and_infer_types()
    return resized


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def expected_sha256() -> str | None:
    """The checksum pair.json records for the grown IR (None before the first build is recorded)."""
    info = json.loads((PAIR_DIR / "pair.json").read_text())
    return info.get("main", {}).get("grown", {}).get("sha256")


def is_built() -> bool:
    manifest = TARGET / MANIFEST
    if not (manifest.is_file() and (TARGET / "openvino_model.bin").is_file()):
        return False
    recorded = json.loads(manifest.read_text())
    return recorded.get("sha256") == (expected_sha256() or recorded.get("sha256")) and \
        (TARGET / "openvino_model.bin").stat().st_size == recorded.get("bytes")


def build(*, growth: int = GROWTH, out=print) -> dict:
    """Build the grown main unless a verified copy is there; returns its manifest."""
    if is_built():
        return json.loads((TARGET / MANIFEST).read_text())
    out(f"Building the demo main: the committed main's MLPs widened {growth}x (function-preserving) ...")
    model = ov.Core().read_model(SOURCE / "openvino_model.xml")
    grown = grow(model, growth)
    staging = TARGET.with_name(TARGET.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(SOURCE, staging, ignore=shutil.ignore_patterns("openvino_model.*"))
    ov.save_model(model, staging / "openvino_model.xml", compress_to_fp16=False)
    config = json.loads((staging / "config.json").read_text())
    config["intermediate_size"] = config["intermediate_size"] * growth
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    bin_path = staging / "openvino_model.bin"
    manifest: dict[str, Any] = {"growth": growth, "projections": grown, "sha256": sha256(bin_path),
                                "bytes": bin_path.stat().st_size, "params": _parameters(model)}
    expected = expected_sha256()
    if expected and manifest["sha256"] != expected:
        raise RuntimeError(f"the grown main's checksum {manifest['sha256']} is not pair.json's {expected}")
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(TARGET, ignore_errors=True)
    staging.rename(TARGET)
    out(f"Built {TARGET} ({manifest['params'] / 1e6:.0f} M parameters, sha256 {manifest['sha256'][:12]}...)")
    return manifest


def _parameters(model: ov.Model) -> int:
    return int(sum(np.prod(op.get_output_shape(0)) for op in model.get_ordered_ops()
                   if op.get_type_name() == "Constant" and len(op.get_output_shape(0)) == 2
                   and op.get_output_element_type(0) in (ov.Type.u8, ov.Type.i8, ov.Type.f16)
                   and min(op.get_output_shape(0)) > 1))


if __name__ == "__main__":
    print(json.dumps(build(out=lambda line: print(line, file=sys.stderr))))
