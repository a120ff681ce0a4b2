"""An environment's tools: which methods they are, their JSON schemas, and calling them safely.

The rule is TRL's (`GRPOTrainer(environment_factory=...)`): every public method of the
environment instance except `reset` and `get_reward` is a tool (`inspect.ismethod`, a name
not starting with "_"), named by its `__name__`, its schema built by
`transformers.utils.get_json_schema` from its type hints and the docstring's `Args:`.
Two additions, both invisible to an environment written for TRL:

- A tool whose function carries a `json_schema` attribute (an OpenAI function object:
  name, description, parameters) is offered with that schema as it is. The bfcl
  environment needs it: its parameters are nested JSON objects that type hints cannot say.
- A schema built from a function without `**kwargs` says `"additionalProperties": false`:
  the function refuses other names anyway, and a forced call's grammar then keeps the
  model to the real parameters.
- The tools are read after `reset()`, so an environment may give each task its own
  tools (bfcl binds the task's functions in `reset`). TRL reads them before `reset`; for
  an environment whose tools are fixed methods the two are the same.

Calling (`ToolSet.call`): the arguments are the model's JSON object; the result goes back
as the `tool` message's content: a string as it is, anything else as JSON (TRL sends
`str(result)`). A tool that raises, an unknown tool, or arguments that are not an object
give `{"error": "..."}` and the episode goes on. Each call is bounded by a timeout: an
async tool is cancelled; a sync tool runs in a thread of its own, which Python cannot
stop, so at the timeout the episode moves on with an error message and the thread is
left to finish in the background (a daemon thread, so it never holds up the exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

NOT_TOOLS = frozenset({"reset", "get_reward"})


class ToolSchemaError(ValueError):
    """A tool's JSON schema cannot be built (a missing docstring, an argument without a type hint)."""


@dataclass
class ToolResult:
    """One tool call's outcome: the `tool` message content, and whether it is an error message."""

    content: str
    error: bool = False


@dataclass
class ToolSet:
    """The tools of one environment instance: name -> callable, and the OpenAI `tools` list."""

    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    schemas: list[dict[str, Any]] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    async def call(self, name: str, arguments: str | dict[str, Any] | None, timeout_s: float) -> ToolResult:
        """Run tool `name` with the model's `arguments`; errors become `{"error": ...}` results."""
        fn = self.functions.get(name)
        if fn is None:
            return error_result(f"unknown tool {name!r}; the tools are: {', '.join(self.names)}")
        try:
            kwargs = parse_arguments(arguments)
        except ValueError as exc:
            return error_result(str(exc))
        try:
            value = await run_bounded(fn, kwargs, timeout_s)
        except TimeoutError:
            return error_result(f"the tool {name} did not return within {timeout_s:g} s")
        except Exception as exc:  # the environment's own error: reported to the model, the episode goes on
            return error_result(str(exc) or type(exc).__name__)
        return ToolResult(as_content(value))


def find_tools(env: Any) -> ToolSet:
    """The tools of environment instance `env` (module docstring); ToolSchemaError if one has no schema."""
    tools = ToolSet()
    for name, method in inspect.getmembers(env, predicate=inspect.ismethod):
        if name in NOT_TOOLS or name.startswith("_"):
            continue
        schema = tool_schema(method)
        tools.functions[schema["name"]] = method
        tools.schemas.append({"type": "function", "function": schema})
    return tools


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI function object of `fn`: its `json_schema` attribute, else one from hints and docstring."""
    schema = getattr(fn, "json_schema", None)
    if not isinstance(schema, dict):
        from transformers.utils import get_json_schema
        from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

        try:
            schema = get_json_schema(fn)
        except (DocstringParsingException, TypeHintParsingException) as exc:
            raise ToolSchemaError(f"tool {getattr(fn, '__name__', fn)!r}: {exc}") from exc
    # transformers 5 wraps it as a tool ({"type": "function", "function": {...}, "return": ...});
    # the model never writes the return value, so it is left out
    function = dict(schema.get("function", schema))
    function.pop("return", None)
    if not isinstance(function.get("name"), str):
        raise ToolSchemaError(f"tool {getattr(fn, '__name__', fn)!r}: its schema has no name")
    parameters = function.get("parameters")
    if isinstance(parameters, dict) and "additionalProperties" not in parameters and not _takes_kwargs(fn):
        # The Python function refuses other names anyway; saying so lets a forced call's grammar
        # keep the model to the real parameters.
        function["parameters"] = {**parameters, "additionalProperties": False}
    return function


def _takes_kwargs(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def parse_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """The model's arguments (a JSON object, or its text) as keyword arguments; ValueError otherwise."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise ValueError(f"the arguments are not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments must be a JSON object, got {type(arguments).__name__}")
    return arguments


def as_content(value: Any) -> str:
    """A tool's return value as a `tool` message's content: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def error_result(message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}, ensure_ascii=False), error=True)


async def run_bounded(fn: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float) -> Any:
    """`fn(**kwargs)` (sync or async) within `timeout_s`; TimeoutError after it, else its value or error."""
    if inspect.iscoroutinefunction(fn):
        return await asyncio.wait_for(fn(**kwargs), timeout_s)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def work() -> None:
        try:
            value, error = fn(**kwargs), None
        except BaseException as exc:  # handed to the waiting episode, which decides
            value, error = None, exc
        # RuntimeError: the loop closed while this thread ran past its timeout; nobody waits
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, future, value, error)

    # One thread per call, not a shared pool: a hung call must not starve the calls after it.
    threading.Thread(target=work, name=f"clawrl-tool-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    value = await asyncio.wait_for(future, timeout_s)
    if inspect.isawaitable(value):  # a sync function that returned a coroutine
        value = await asyncio.wait_for(value, timeout_s)
    return value


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # timed out and cancelled: the late result has nowhere to go
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
