"""Berkeley Function Calling Leaderboard rows: their schemas in JSON Schema, and checking a call.

Pure functions, used by the `bfcl` environment (clawrl/envs/shipped/bfcl.py).

Schemas. BFCL writes parameter types in its own words ("dict", "float", "tuple", "any");
`function_schema` turns a BFCL function into an OpenAI function object the way BFCL's
own OpenAI handler does: "." in the name becomes "_" (OpenAI's names allow neither
dots nor, in Python, attribute access), dict -> object, float -> number, tuple -> array,
any -> string, recursively through `properties` and `items`, and the non-standard
`optional` flag dropped.

Checking (`check_call`), the rules of BFCL's AST checker for Python (simple_function_checker),
written again here:

- the name must be the expected function's (after the "." -> "_" change);
- every required parameter must be given, and every given one must be a parameter of the
  function and appear in the possible answer;
- each value must be one of the possible answer's values: strings compared after
  removing spaces and `,./-_*^`, lowercased, ' as "; lists item by item the same way;
  dicts key by key; an integer counts for a float parameter;
- a parameter of the possible answer the call leaves out must be optional there (its
  list of values holds "").

A value of the wrong type is accepted only when it has the possible answers' own type and
equals one of them as it is (BFCL lets a "variable" through that way). The deviation: BFCL's
checker returns an error string per failure kind; this returns the first reason as text.
"""

from __future__ import annotations

import copy
import re
from typing import Any

TYPES = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "dict": "object",
    "object": "object",
    "any": "string",
}
_PUNCTUATION = re.compile(r"[ ,./\-_*^]")


def tool_name(name: str) -> str:
    """BFCL's function name as offered to the model: "math.factorial" -> "math_factorial"."""
    return name.replace(".", "_")


def function_schema(function: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI function object of a BFCL function."""
    parameters = copy.deepcopy(function.get("parameters") or {})
    out: dict[str, Any] = {
        "type": "object",
        "properties": {k: _schema(v) for k, v in (parameters.get("properties") or {}).items()},
        "additionalProperties": False,  # BFCL fails a call with a parameter the function lacks
    }
    if parameters.get("required"):
        out["required"] = list(parameters["required"])
    return {
        "name": tool_name(function["name"]),
        "description": function.get("description", ""),
        "parameters": out,
    }


def _schema(node: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in node.items() if k not in ("optional", "properties", "items")}
    out["type"] = TYPES.get(str(node.get("type")), "string")
    if isinstance(node.get("properties"), dict):
        out["properties"] = {k: _schema(v) for k, v in node["properties"].items()}
    if isinstance(node.get("items"), dict):
        out["items"] = _schema(node["items"])
    return out


def check_call(
    name: str, arguments: dict[str, Any], function: dict[str, Any], expected: dict[str, Any]
) -> str | None:
    """None when the call matches the possible answer `expected` ({bfcl name: {param: [values]}}),
    else the first reason it does not."""
    ((want_name, possible),) = expected.items()
    if name != tool_name(want_name):
        return f"called {name}, expected {tool_name(want_name)}"
    properties = (function.get("parameters") or {}).get("properties") or {}
    for param in (function.get("parameters") or {}).get("required") or []:
        if param not in arguments:
            return f"missing required parameter {param!r}"
    for param, value in arguments.items():
        if param not in properties or param not in possible:
            return f"unexpected parameter {param!r}"
        reason = check_value(param, value, properties[param], possible[param])
        if reason:
            return reason
    for param, values in possible.items():
        if param not in arguments and "" not in values:
            return f"parameter {param!r} left out, but it is not optional"
    return None


def check_value(param: str, value: Any, schema: dict[str, Any], possible: list[Any]) -> str | None:
    """None when `value` is one of `possible` under BFCL's comparison rules, else why not."""
    kind = str(schema.get("type"))
    kind = "string" if kind == "any" else kind  # BFCL checks "any" as a string
    if kind == "float" and type(value) is int:
        value = float(value)
    if not _type_ok(kind, value):
        given = [p for p in possible if p != ""]
        if given and type(value) is type(given[0]) and value in given:
            return None  # BFCL's "variable": a value of the possible answers' own type, given exactly
        return f"parameter {param!r}: expected {kind}, got {type(value).__name__} {value!r}"
    if kind == "dict":
        return (
            None if any(_dict_ok(value, p) for p in possible if isinstance(p, dict)) else _wrong(param, value)
        )
    if kind in ("array", "tuple"):
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            ok = any(_dicts_ok(value, p) for p in possible if isinstance(p, list))
        else:
            ok = standard(value) in [standard(p) for p in possible if isinstance(p, list)]
        return None if ok else _wrong(param, value)
    if kind == "string":
        return (
            None
            if standard(value) in [standard(p) for p in possible if isinstance(p, str)]
            else _wrong(param, value)
        )
    return None if value in possible else _wrong(param, value)


def _wrong(param: str, value: Any) -> str:
    return f"parameter {param!r}: {value!r} is not a possible answer"


def _type_ok(kind: str, value: Any) -> bool:
    expected = {
        "string": str,
        "integer": int,
        "float": float,
        "boolean": bool,
        "array": list,
        "tuple": list,
        "dict": dict,
    }.get(kind)
    if expected is None:  # "any", or a type BFCL's Python rows do not use: no type check
        return True
    return type(value) is expected


def standard(value: Any) -> Any:
    """BFCL's string standardisation (spaces and `,./-_*^` removed, lowercase, ' -> "), through lists."""
    if isinstance(value, str):
        return _PUNCTUATION.sub("", value).lower().replace("'", '"')
    if isinstance(value, list):
        return [standard(v) for v in value]
    return value


def _dict_ok(value: dict[str, Any], possible: dict[str, Any]) -> bool:
    for key, item in value.items():
        if key not in possible or standard(item) not in [standard(p) for p in possible[key]]:
            return False
    return all(key in value or "" in values for key, values in possible.items())


def _dicts_ok(value: list[dict[str, Any]], possible: list[Any]) -> bool:
    if len(value) != len(possible):
        return False
    return all(isinstance(p, dict) and _dict_ok(v, p) for v, p in zip(value, possible, strict=True))
