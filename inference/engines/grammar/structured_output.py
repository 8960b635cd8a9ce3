"""A grammar in openvino-genai's terms: the StructuredOutputConfig the library's pipeline takes, for a request
(engines/library/config.py) and for the library's compile of a grammar (engines/grammar/compilers.py)."""

from __future__ import annotations

import openvino_genai as og

from inference.engines.grammar.grammar import FIELDS, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, Grammar


def structured_output_config(grammar: Grammar) -> og.StructuredOutputConfig:
    if grammar.kind == "tool_call":
        parts = og.StructuredOutputConfig
        call = parts.Concat(parts.ConstString(TOOL_CALL_OPEN), parts.JSONSchema(grammar.text),
                            parts.ConstString(TOOL_CALL_CLOSE))
        return og.StructuredOutputConfig(compound_grammar=call)
    return og.StructuredOutputConfig(**{FIELDS[grammar.kind]: grammar.text})
