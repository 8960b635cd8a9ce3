"""Output held to a grammar: a JSON schema, a regular expression or an EBNF grammar, applied by
openvino-genai's structured output (xgrammar inside) to every token the main model chooses on the
library's pipelines, and by llguidance to the main's and the draft's tokens on our exact engine
(engines/constraint.py). A grammar is accepted only when both compile it.

A grammar the library cannot compile does not fail its own request only: the pipeline step it first
runs in raises, and every request in the batch fails with it. So a grammar is compiled before it is
accepted (`check`): one token generated under it by the repository's own tiny draft model, which
compiles the same grammar in milliseconds. Whether a grammar compiles does not depend on the vocabulary.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import llguidance as llg
import openvino_genai as og

# The library's StructuredOutputConfig field for each kind; "tool_call" is one call in the Hermes format
# Qwen's chat templates ask for: the call object (its JSON schema is the text) between these tags.
FIELDS = {"json_schema": "json_schema", "regex": "regex", "ebnf": "grammar"}
LLGUIDANCE_FORMATS: dict[str, llg.GrammarFormat] = {"json_schema": "json_schema", "regex": "regex", "ebnf": "ebnf"}
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
CHECKER_MODEL = Path(__file__).resolve().parents[1] / "models" / "demo-code" / "draft"


@dataclass(frozen=True, kw_only=True)
class Grammar:
    kind: str  # a key of FIELDS, or "tool_call"
    text: str  # the schema as JSON text, the regular expression or the EBNF grammar

    def config(self) -> og.StructuredOutputConfig:
        if self.kind == "tool_call":
            parts = og.StructuredOutputConfig
            call = parts.Concat(parts.ConstString(TOOL_CALL_OPEN), parts.JSONSchema(self.text),
                                parts.ConstString(TOOL_CALL_CLOSE))
            return og.StructuredOutputConfig(compound_grammar=call)
        return og.StructuredOutputConfig(**{FIELDS[self.kind]: self.text})


class GrammarError(ValueError):
    """The library cannot compile the grammar; the message is its own sentence."""


_check_lock = threading.Lock()


@cache
def _checker() -> og.LLMPipeline:
    return og.LLMPipeline(str(CHECKER_MODEL), "CPU")


def check(grammar: Grammar) -> None:
    """Raise GrammarError unless the library and llguidance both compile `grammar`."""
    if reason := _compile_error(grammar):
        raise GrammarError(reason)
    if reason := _llguidance_error(grammar):
        raise GrammarError(f"the exact engine's parser refused it: {reason}")


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


@lru_cache(maxsize=256)  # a script sends the same schema with every request: compile it once
def _compile_error(grammar: Grammar) -> str | None:
    config = og.GenerationConfig()
    config.max_new_tokens = 1
    config.structured_output_config = grammar.config()
    with _check_lock:  # one pipeline, one generation at a time
        try:
            _checker().generate("{", config)
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
