"""The pair's OpenVINO tokenizer, safe to use from many threads at once, and a request's prompt tokens.

openvino's bindings set up their numpy API on the first tensor turned into numpy, and threads doing that
at once deadlock the whole process, its heartbeat included (docs/architecture.md, "Engines";
tests/test_engines_library.py). So it is done here once per process, at import: every engine module imports
this one, and the web side imports it with its first tokenizer, so the import is complete before any thread
of theirs can hold a tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as og


def _set_up_numpy_in_openvino() -> None:
    _ = ov.Tensor(np.zeros(1, dtype=np.int64)).data


_set_up_numpy_in_openvino()


def load_tokenizer(folder: str | Path) -> og.Tokenizer:
    """The folder's OpenVINO tokenizer, safe to use from many threads at once (see above)."""
    return og.Tokenizer(str(folder))


def prompt_token_ids(tokenizer, *, prompt: str, add_special_tokens: bool, prompt_ids: list[int] | None) -> list[int]:
    """What a request starts from: `prompt_ids` as they are (an answer handed over from another engine
    goes on from its prompt and its tokens so far), else the prompt encoded."""
    if prompt_ids is not None:
        return prompt_ids
    return [int(t) for t in tokenizer.encode(prompt, add_special_tokens=add_special_tokens).input_ids.data[0]]
