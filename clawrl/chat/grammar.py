"""Grammars for constrained decoding: what a forced tool call or a `response_format` must look like.

`grammar_for(tools, tool_choice, response_format)` turns a request's constraint into a small
JSON-able dict, or None when nothing is constrained:

    {"kind": "tool_call" | "json_object" | "json_schema", "lark": "<llguidance Lark grammar>"}

The dict is what the engine decodes under (the local engine with an llguidance matcher per
row, `clawrl/model/constrain.py`; vLLM through its own structured outputs), what the turn
records (`Turn.grammar`), and what the trainer replays to score the turn's tokens under the
same mask. The grammar text is the whole contract: nothing else is needed to rebuild the mask.

Forced tool calls (tool_choice "required" or naming a function). The answer is exactly one
block in the generic tool prompt's format (`clawrl/chat/template.py: format_tool_call`), then
end of sequence::

    <tool_call>
    {"name": "NAME", "arguments": ARGS}
    </tool_call>

where NAME is the named function, or for "required" any offered one (an alternation, each
name followed by its own arguments), and ARGS is JSON matching that function's `parameters`
schema (an object: a schema naming another type is refused; none means any object). This is
what `clawrl/chat/tools.py` parses as a call, so a forced call always comes back as a
`tool_calls` entry, unless `max_tokens` (or a stop string) cuts it first. The block is the
grammar's, not the prompt's: with a grammar, no forced prefix is appended to the prompt
(`ChatRenderer.render(force_prefix=False)`), so the model writes `<tool_call>` itself, with
its own tokenisation of it.

JSON is written the way the generic tool prompt shows it (`json.dumps` defaults): ", " and
": " separators, no other whitespace (a grammar that allows any whitespace lets a model pad
forever). Schemas are compiled leniently: keywords llguidance does not implement are ignored
rather than refused (an agent's tool schema should not fail a request); a schema that is not
valid (an unknown type, a malformed pattern, an unsatisfiable one, a dangling $ref) is a
`GrammarError`, which the API answers with a 400.

`response_format` {"type": "json_object"} constrains the content to a JSON object;
{"type": "json_schema", "json_schema": {"schema": ...}} to JSON matching the schema (any JSON
when the schema is missing or empty). A forced tool call takes precedence over it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance

from clawrl.chat.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}
_LISTING = re.compile(r"^\s*\d+ \|")  # llguidance quotes the grammar after its message: "   1 | start: ..."
_POSITION = re.compile(r"^at \d+\(\d+\): ")


class GrammarError(ValueError):
    """The constraint cannot be compiled (a bad JSON schema): a client error."""


def grammar_for(
    tools: list[dict[str, Any]] | None, tool_choice: Any, response_format: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The grammar the request's answer must follow, or None; raises GrammarError on a bad schema.

    `tool_choice` is taken as the chat renderer checked it: "required" needs tools, a named
    function must be one of them.
    """
    functions = [tool.get("function") or {} for tool in tools or []]
    if tool_choice == "required":
        return tool_call_grammar(functions)
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        return tool_call_grammar([f for f in functions if f.get("name") == name])
    return response_grammar(response_format)


def tool_call_grammar(functions: list[dict[str, Any]]) -> dict[str, Any]:
    """One `<tool_call>` block calling any of `functions` with arguments matching its schema."""
    if not functions:
        raise GrammarError("a forced tool call needs at least one function")
    rules = [f"call: {' | '.join(f'call_{i}' for i in range(len(functions)))}"]
    for i, function in enumerate(functions):
        head = json.dumps(function["name"], ensure_ascii=False) + ', "arguments": '
        schema = _arguments_schema(function)
        rules.append(f"call_{i}: {_literal(head)} args_{i}")
        rules.append(f"args_{i}: %json {_schema_text(schema)}")
    opening, closing = _literal(TOOL_CALL_OPEN + '\n{"name": '), _literal("}\n" + TOOL_CALL_CLOSE)
    start = f"start: {opening} call {closing}"
    return _checked("tool_call", "\n".join([start, *rules]))


def response_grammar(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The grammar of a `response_format`, or None for {"type": "text"} (or none at all)."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return _checked("json_object", f"start: %json {_schema_text({'type': 'object'})}")
    if kind == "json_schema":
        spec = response_format.get("json_schema") if response_format else None
        schema = (spec or {}).get("schema") or {}
        if not isinstance(schema, dict):
            raise GrammarError("response_format.json_schema.schema must be a JSON Schema object")
        return _checked("json_schema", f"start: %json {_schema_text(schema)}")
    raise GrammarError(f"unsupported response_format type {kind!r}: use text, json_object or json_schema")


def _arguments_schema(function: dict[str, Any]) -> dict[str, Any]:
    """The function's `parameters`, which must describe an object (the parser wants one)."""
    schema = function.get("parameters")
    name = function.get("name")
    if schema is None or schema == {}:
        return {"type": "object"}
    if not isinstance(schema, dict):
        raise GrammarError(f"the parameters of function {name!r} must be a JSON Schema object")
    kind = schema.get("type")
    if kind is None:
        return {**schema, "type": "object"}
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise GrammarError(f"the parameters of function {name!r} must have type 'object', not {kind!r}")
    return {**schema, "type": "object"}


def _schema_text(schema: dict[str, Any]) -> str:
    """The schema as `%json` takes it, with clawrl's JSON style (over any `x-guidance` it names)."""
    style = schema.get("x-guidance")
    merged = {**(style if isinstance(style, dict) else {}), **JSON_STYLE}
    return json.dumps({**schema, "x-guidance": merged}, ensure_ascii=False)


def _literal(text: str) -> str:
    """A Lark string literal matching `text` exactly (JSON's escapes are Lark's)."""
    return json.dumps(text)


def _checked(kind: str, lark: str) -> dict[str, Any]:
    error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(lark))
    if error:
        raise GrammarError(_message(error))
    return {"kind": kind, "lark": lark}


def _message(error: str) -> str:
    """llguidance's message on one line, without its position and the grammar listing it appends."""
    lines = []
    for line in error.strip().splitlines():
        if _LISTING.match(line):
            break
        lines.append(line.strip())
    text = " ".join(part for part in lines if part) or "invalid grammar"
    return _POSITION.sub("", text)
