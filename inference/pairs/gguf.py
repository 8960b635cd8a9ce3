"""GGUF files (llama.cpp, Ollama, LM Studio) turned into Hugging Face folders that the export takes.

transformers reads a GGUF file's tokenizer and dequantizes its weights (q4_k_m, q8_0, ...) to float32;
the folder it saves is exported to OpenVINO IR like any other (conversion.export). The IR is then a
re-quantization of the dequantized weights, not llama.cpp's numerics: exactness is about the main as
served, with and without its draft, which both run from the IR.

The header is read first (seconds, no torch) so that a file that is not GGUF, an architecture nobody
can convert, or a file whose bytes differ from the publisher's digest fails before minutes of work.
The conversion itself runs as `python -m inference.pairs.gguf FILE OUT` in a process of its own:
dequantizing the 1.5B main peaks near 9 GB, which goes back to the system when the process ends.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
FLOAT32_BYTES = 4


class GgufError(Exception):
    """A GGUF file that cannot be imported; the message says why."""


@dataclass(frozen=True)
class GgufHeader:
    architecture: str
    parameters: int  # elements over all tensors: the dequantized model holds this many floats
    name: str

    @property
    def dequantized_bytes(self) -> int:
        return self.parameters * FLOAT32_BYTES


def is_gguf(path: Path) -> bool:
    """A file whose first bytes are GGUF's magic (the extension alone proves nothing)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers converts, less its mapping's other keys and the encoder-decoders."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer", "t5", "umt5"})


def read_header(path: Path, *, role: str) -> GgufHeader:
    """The architecture and size of a GGUF file, refused unless transformers can convert it."""
    from gguf import GGUFReader

    if not is_gguf(path):
        raise GgufError(f"The {role} file {path.name} is not a GGUF file (its first bytes are not 'GGUF').")
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # a truncated or corrupt file raises anything from struct to numpy
        raise GgufError(f"The {role} file {path.name} cannot be read as GGUF ({type(exc).__name__}: {exc}); "
                        "is it complete?") from exc

    def field(key: str) -> str:
        entry = reader.fields.get(key)
        return bytes(entry.parts[entry.data[0]]).decode(errors="replace") if entry else ""

    architecture = field("general.architecture")
    if architecture not in supported_architectures():
        raise GgufError(f"The {role} file {path.name} holds a '{architecture or 'unnamed'}' model, which cannot be "
                        f"converted; supported GGUF architectures: {', '.join(supported_architectures())}.")
    parameters = sum(int(tensor.n_elements) for tensor in reader.tensors)
    return GgufHeader(architecture=architecture, parameters=parameters, name=field("general.name"))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_digest(path: Path, *, expected: str, role: str) -> None:
    """Refuse a file whose bytes are not the ones the publisher's digest names."""
    actual = sha256_of(path)
    if actual != expected.strip().lower():
        raise GgufError(f"The {role} file {path.name} has sha256 {actual}, not the expected {expected}: "
                        "refusing it (a damaged or different file).")


def to_hf_folder(source: Path, target: Path) -> None:
    """Dequantize `source` into a Hugging Face model folder (config, float32 weights, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"reading the tokenizer of {source.name}", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    print(f"dequantizing the weights of {source.name}", flush=True)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # The weights are plain floats now: a kept quantization_config would make the export expect a quantizer.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    print(f"saving {type(model).__name__} to {target}", flush=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


if __name__ == "__main__":
    to_hf_folder(Path(sys.argv[1]), Path(sys.argv[2]))
