"""The two compilers a grammar (engines/grammar/grammar.py) must pass: the library's and llguidance.

A grammar the library cannot compile does not fail its own request only: the pipeline step it first
runs in raises, and every request in the batch fails with it. So a grammar is compiled before it is
accepted (`refusal`): one token generated under it by the repository's own tiny draft model, which
compiles the same grammar in milliseconds. Whether a grammar compiles does not depend on the vocabulary.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import llguidance as llg
import openvino_genai as og

from inference.engines.grammar.grammar import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, Grammar
from inference.engines.grammar.structured_output import structured_output_config

LLGUIDANCE_FORMATS: dict[str, llg.GrammarFormat] = {"json_schema": "json_schema", "regex": "regex", "ebnf": "ebnf"}
CHECKER_MODEL = Path(__file__).resolve().parents[2] / "models" / "demo-code" / "draft"


def checker_pipeline() -> og.LLMPipeline:
    return og.LLMPipeline(str(CHECKER_MODEL), "CPU")


def refusal(grammar: Grammar, *, pipeline: og.LLMPipeline) -> str | None:
    """Why the library or llguidance cannot compile `grammar`, or None when both do. `pipeline` (a
    checker_pipeline) runs one generation at a time: the library does not share a pipeline between threads."""
    if reason := _compile_error(grammar, pipeline=pipeline):
        return reason
    if reason := _llguidance_error(grammar):
        return f"the own engine's parser refused it: {reason}"
    return None


@lru_cache(maxsize=256)  # a script sends the same schema with every request: translate it once
def llguidance_grammar(grammar: Grammar) -> str:
    """The grammar in llguidance's terms (ValueError when it cannot be put in them)."""
    if grammar.kind == "tool_call":
        call = json.dumps(json.loads(grammar.text))  # on one line: %json takes it inline
        lark = f"start: {json.dumps(TOOL_CALL_OPEN)} call {json.dumps(TOOL_CALL_CLOSE)}\ncall: %json {call}\n"
        return llg.grammar_from("lark", lark)
    return llg.grammar_from(LLGUIDANCE_FORMATS[grammar.kind], grammar.text)


def _llguidance_error(grammar: Grammar) -> str | None:
    try:
        return llg.LLMatcher.validate_grammar(llguidance_grammar(grammar)) or None
    except ValueError as exc:
        return str(exc)


def _compile_error(grammar: Grammar, *, pipeline: og.LLMPipeline) -> str | None:
    config = og.GenerationConfig()
    config.max_new_tokens = 1
    config.structured_output_config = structured_output_config(grammar)
    try:
        pipeline.generate("{", config)
    except UnicodeDecodeError:  # the library's message cut a character of the grammar in two
        return "the library's parser refused it (its message could not be read)"
    except RuntimeError as exc:
        return _reason(str(exc))
    return None


def _reason(message: str) -> str:
    """The library's sentence without its time, source path and C++ check: '[00:19:40] /…/regex_converter.cc:75:
    Regex parsing error at position 5: Unclosed '['' -> 'Regex parsing error at position 5: Unclosed '['';
    'Check failed: (schema_obj.at("type").is<std::string>()) is false: Type should be a string' -> 'Type should
    be a string'."""
    last = (message.strip().splitlines() or [""])[-1]
    return re.sub(r"^(\[[^\]]*\] \S+:\d+: )?(Check failed: .*? is false: )?", "", last).strip()
