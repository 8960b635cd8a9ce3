"""Output held to a grammar: a JSON schema, a regular expression or an EBNF grammar, applied by
openvino-genai's structured output (xgrammar inside) to every token the main model chooses on the
library's pipelines, and by llguidance to the main's and the draft's tokens on the own engine
(engines/grammar/constraint.py). A grammar is accepted only when both compile it (engines/grammar/compilers.py);
the web side runs that in checker processes, with a time budget (engines/grammar/checks.py).

This module holds the plain values only, so the web side can name a grammar without loading either compiler.
"""

from __future__ import annotations

from dataclasses import dataclass

# The library's StructuredOutputConfig field for each kind; "tool_call" is one call in the Hermes format
# Qwen's chat templates ask for: the call object (its JSON schema is the text) between these tags.
FIELDS = {"json_schema": "json_schema", "regex": "regex", "ebnf": "grammar"}
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"


@dataclass(frozen=True, kw_only=True)
class Grammar:
    kind: str  # a key of FIELDS, or "tool_call"
    text: str  # the schema as JSON text, the regular expression or the EBNF grammar


class GrammarError(ValueError):
    """The grammar is refused; the message is a sentence saying why."""
