"""Render OpenAI chat messages (and tools) to prompt token IDs.

Messages are normalised first: `developer` becomes `system`, a list of
text parts becomes their texts joined by "\\n", and `None` content becomes "".
Image parts (`image_url`) are accepted in `tool` messages only, the results of
an agent's tools (a GUI agent's screenshot): the message is stored with the turn
as it came, and a text-only model reads `IMAGE_PLACEHOLDER` where each image was.
Any other part (an image from the user, audio) is rejected. The prompt is the
model's chat template rendered with `add_generation_prompt=True`, and the
prompt IDs are exactly `tokenizer.encode(text, add_special_tokens=False)` of
that text (plus the forced prefix, see below): the IDs the engine sees and
that training later uses.

Tools. If the chat template mentions `tools`, it is taken to support tools
natively: `tools` is passed to it, and assistant `tool_calls` and `tool`
messages are passed through (each call's JSON `arguments` string decoded to
an object, which is what such templates expect). Otherwise the generic tool
prompt is used:

* When tools are offered (and tool_choice is not "none"), this system text
  is appended to the first system message (after its text and a blank
  line), or added as a new first system message::

      # Tools

      You may call functions to help with the request. The available functions, as JSON Schema, are:
      <tools>
      {"name": "get_weather", "description": "...", "parameters": {...}}
      </tools>

      Either answer normally, or call functions: answer with one block per call, each in exactly this format:
      <tool_call>
      {"name": "<function name>", "arguments": {<arguments as a JSON object>}}
      </tool_call>
      Function results are given back inside <tool_response></tool_response>.

  with one line per function: its `function` object as JSON (", " and
  ": " separators, non-ASCII kept).
* An assistant message's `tool_calls` become `<tool_call>` blocks appended
  to its content (after a newline when there is content).
* A `tool` message becomes a `user` message with the content
  `<tool_response>\\n{content}\\n</tool_response>`; consecutive tool
  messages are merged into one user message (blocks joined by "\\n"), so
  that templates requiring alternating roles keep working.

Thinking. An assistant message in the history may carry its reasoning as `reasoning` (vLLM's name)
or `reasoning_content` (DeepSeek's); either is passed to the template as `reasoning_content`, the
name Qwen3's template reads (clawrl/chat/reasoning.py). `template_kwargs` are the chat template's
extra variables (vLLM's `chat_template_kwargs`, e.g. `{"enable_thinking": false}` for a hybrid
Qwen3): the renderer's defaults (`model.chat_template_kwargs`), overridden key by key by a
request's. `check_template_kwargs` refuses the names `apply_chat_template` itself takes (a request
must not turn the prompt into IDs or continue the last message) and a non-boolean
`enable_thinking`.

tool_choice: "none" hides the tools (no tool calls are parsed); "auto" or
None offers them; "required" appends `<tool_call>\\n{"name": "` to the
prompt; a named function appends
`<tool_call>\\n{"name": "NAME", "arguments": ` and only that name counts as a
tool call. The appended text is `RenderedPrompt.forced_prefix`: the tool-call
parser must treat it as already generated output. With `force_prefix=False`
nothing is appended: the engine then decodes the whole call under a grammar
(`clawrl/chat/grammar.py`), which forces it from its first character.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from clawrl.chat.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

ROLES = {"system", "developer", "user", "assistant", "tool"}
REQUIRED_PREFIX = TOOL_CALL_OPEN + '\n{"name": "'
_TOOLS_VARIABLE = re.compile(r"\btools\b")

GENERIC_TOOL_PROMPT = """# Tools

You may call functions to help with the request. The available functions, as JSON Schema, are:
<tools>
{tools}
</tools>

Either answer normally, or call functions: answer with one block per call, each in exactly this format:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>
Function results are given back inside <tool_response></tool_response>."""


# apply_chat_template's own parameters, and the template variables the renderer sets itself.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def check_template_kwargs(kwargs: dict[str, Any]) -> None:
    """ValueError naming what is wrong with a chat template's extra variables."""
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise ValueError(f"{', '.join(reserved)} cannot be set through chat_template_kwargs")
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise ValueError("enable_thinking must be a boolean")


class ChatRenderError(ValueError):
    """The request cannot be rendered to a prompt (a client error)."""


@dataclass
class RenderedPrompt:
    """Prompt token IDs plus what the output parser needs to know."""

    prompt_ids: list[int]
    tool_names: set[str]
    forced_prefix: str
    prompt_text: str = ""
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # the template's extra variables used


@dataclass
class _ToolPlan:
    functions: list[dict[str, Any]]
    tool_names: set[str]
    forced_prefix: str


def named_prefix(name: str) -> str:
    """The forced prefix for tool_choice naming function `name`."""
    return TOOL_CALL_OPEN + '\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '


def format_tool_call(name: str, arguments: Any) -> str:
    """One `<tool_call>` block as the generic prompt asks the model to write it."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


class ChatRenderer:
    """Render OpenAI-shaped chat requests with a tokenizer's chat template."""

    def __init__(
        self, tokenizer: Any, chat_template: str | None = None, template_kwargs: dict[str, Any] | None = None
    ) -> None:
        self._tokenizer = tokenizer
        self._chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})  # every render's defaults

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template mentions `tools` (native tool support)."""
        template = self._chat_template or getattr(self._tokenizer, "chat_template", None)
        if isinstance(template, dict):
            template = "\n".join(template.values())
        return bool(template and _TOOLS_VARIABLE.search(template))

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        force_prefix: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RenderedPrompt:
        """Render messages to prompt IDs; raise ChatRenderError on bad input.

        `force_prefix=False`: a forced tool call appends nothing to the prompt (a grammar forces it).
        `template_kwargs`: the template's extra variables, over the renderer's defaults.
        """
        if not messages:
            raise ChatRenderError("messages must not be empty")
        plan = _plan_tools(tools, tool_choice)
        if not force_prefix:
            plan.forced_prefix = ""
        normal = [_normalise(message) for message in messages]
        if self.supports_tools:
            chat = [_native(message) for message in normal]
            shown = list(tools) if tools and plan.functions else None
        else:
            chat = _with_tool_prompt(_generic_history(normal), plan.functions)
            shown = None
        kwargs = self.kwargs(template_kwargs)
        text = self._apply(chat, shown, kwargs) + plan.forced_prefix
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return RenderedPrompt(
            prompt_ids=list(ids),
            tool_names=plan.tool_names,
            forced_prefix=plan.forced_prefix,
            prompt_text=text,
            template_kwargs=kwargs,
        )

    def kwargs(self, template_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """The template's extra variables for a render: the defaults, then the request's."""
        kwargs = {**self.template_kwargs, **(template_kwargs or {})}
        try:
            check_template_kwargs(kwargs)
        except ValueError as error:
            raise ChatRenderError(str(error)) from error
        return kwargs

    def _apply(
        self, chat: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]
    ) -> str:
        try:
            text = self._tokenizer.apply_chat_template(
                chat,
                tools=tools,
                chat_template=self._chat_template,
                add_generation_prompt=True,
                tokenize=False,
                **kwargs,
            )
        except (TemplateError, ValueError, TypeError) as error:
            raise ChatRenderError(f"chat template error: {error}") from error
        if not isinstance(text, str):
            raise ChatRenderError("chat template did not render to a string")
        return text


def _plan_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> _ToolPlan:
    functions = [_function(tool) for tool in tools or []]
    names = {function["name"] for function in functions}
    if tool_choice is None or tool_choice == "auto":
        return _ToolPlan(functions, names, "")
    if tool_choice == "none":
        return _ToolPlan([], set(), "")
    if tool_choice == "required":
        if not functions:
            raise ChatRenderError('tool_choice "required" needs a non-empty tools list')
        return _ToolPlan(functions, names, REQUIRED_PREFIX)
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if name not in names:
            raise ChatRenderError(f"tool_choice names function {name!r}, which is not in tools")
        return _ToolPlan(functions, {name}, named_prefix(name))
    raise ChatRenderError(f"unsupported tool_choice: {tool_choice!r}")


def _function(tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ChatRenderError("each tool must be {'type': 'function', 'function': {'name': ...}}")
    return function


def _normalise(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if role not in ROLES:
        raise ChatRenderError(f"unsupported message role: {role!r}")
    normal = dict(message)
    normal["role"] = "system" if role == "developer" else role
    normal["content"] = _text_content(message.get("content"), role)
    reasoning = _reasoning(message) if role == "assistant" else None
    normal.pop("reasoning", None)
    if reasoning:
        normal["reasoning_content"] = reasoning
    else:
        normal.pop("reasoning_content", None)
    return normal


def _reasoning(message: dict[str, Any]) -> str | None:
    """An assistant message's reasoning, under vLLM's name or DeepSeek's (the latter first)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise ChatRenderError(f"an assistant message's {key} must be a string")
        if value:
            return value
    return None


IMAGE_PLACEHOLDER = "[image]"  # what a text-only model reads for an image in a tool result


def _text_content(content: Any, role: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatRenderError(f"{role} message content must be a string or a list of parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and not isinstance(part.get("text"), str):
            raise ChatRenderError(f"a text part in a message with role {role!r} needs a 'text' string")
        if kind == "image_url" and role == "tool":
            image = part.get("image_url")
            if not isinstance(image, dict) or not isinstance(image.get("url"), str):
                raise ChatRenderError("an image_url part needs {'image_url': {'url': '...'}}")
            texts.append(IMAGE_PLACEHOLDER)
            continue
        if kind != "text":
            allowed = "text, and image_url in tool results" if role == "tool" else "only text is supported"
            raise ChatRenderError(f"unsupported content part {kind!r} in a {role!r} message: {allowed}")
        texts.append(part["text"])
    return "\n".join(texts)


def _decoded_arguments(arguments: Any) -> Any:
    """A call's JSON arguments string as an object (kept as is if not JSON)."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _native(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    decoded = []
    for call in calls:
        function = dict(call.get("function") or {})
        function["arguments"] = _decoded_arguments(function.get("arguments"))
        decoded.append({**call, "function": function})
    return {**message, "tool_calls": decoded}


def _generic_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    chat: list[dict[str, Any]] = []
    previous = None
    for message in messages:
        role = message["role"]
        if role == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if previous == "tool":
                chat[-1]["content"] += "\n" + block
            else:
                chat.append({"role": "user", "content": block})
        elif role == "assistant":
            chat.append({"role": role, "content": _assistant_text(message)})
        else:
            chat.append({"role": role, "content": message["content"]})
        previous = role
    return chat


def _assistant_text(message: dict[str, Any]) -> str:
    blocks = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = _decoded_arguments(function.get("arguments")) or {}
        blocks.append(format_tool_call(function.get("name", ""), arguments))
    return "\n".join(part for part in [message["content"], *blocks] if part)


def _with_tool_prompt(chat: list[dict[str, Any]], functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not functions:
        return chat
    listing = "\n".join(json.dumps(function, ensure_ascii=False) for function in functions)
    prompt = GENERIC_TOOL_PROMPT.format(tools=listing)
    if chat[0]["role"] == "system":
        existing = chat[0]["content"]
        merged = existing + "\n\n" + prompt if existing else prompt
        return [{"role": "system", "content": merged}, *chat[1:]]
    return [{"role": "system", "content": prompt}, *chat]
