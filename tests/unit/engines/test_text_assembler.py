"""Text assembled from token ids as they stream, with no service running."""

from pathlib import Path

import openvino_genai as og
import pytest

from inference.engines.text_assembler import TextAssembler

MAIN = Path(__file__).resolve().parents[3] / "inference" / "models" / "demo-code" / "main"


@pytest.fixture(scope="module")
def tokenizer():
    return og.Tokenizer(str(MAIN))


def test_text_assembly_never_cuts_a_multibyte_character(tokenizer):
    text = "naïve café → 日本語 ✓ done"
    ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=False).input_ids.data[0]]
    assert len(ids) > len(text.split())  # byte-level pieces: characters are split across tokens
    for step in (1, 2, 3):
        assembler = TextAssembler(tokenizer)
        pieces = []
        for start in range(0, len(ids), step):
            pieces += list(assembler.add(ids[start:start + step]))
        pieces.append(assembler.finish())
        assert all("\ufffd" not in piece for piece in pieces)
        assert "".join(pieces) == tokenizer.decode(ids) == text
