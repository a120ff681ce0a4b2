"""Request models of the OpenAI chat completions API, as clawrl accepts them.

Unknown fields are accepted and logged, never rejected, so newer SDKs keep
working. Fields clawrl reads for its own purpose: `session_id`, `turn_type`,
`session_done`, `prompt_cache_key` (sessions and turn typing), `memory` (false: no memory block,
docs/memory.md), vLLM's `ignore_eos` and `chat_template_kwargs` (the chat template's extra variables,
e.g. `{"enable_thinking": false}`), and an assistant message's reasoning, as `reasoning` (vLLM's) or
`reasoning_content` (DeepSeek's) (clawrl/chat/reasoning.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from clawrl.chat.template import check_template_kwargs

SESSION_ID_PATTERN = r"^[A-Za-z0-9._:@/+=-]{1,128}$"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    # The schema says what is served, text parts; validation lets others through to a 400 that names them.
    model_config = ConfigDict(extra="allow", json_schema_extra={"required": ["type", "text"]})

    type: str = Field(json_schema_extra={"const": "text"})
    text: str | None = Field(None, json_schema_extra={"type": "string"})


class FunctionCall(_Open):
    name: str
    arguments: str = "{}"


class ToolCallIn(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


# The rule `_needs_content` checks, stated in the OpenAPI schema too, so that clients and the schema
# fuzzer (tests/service/test_fuzz.py) know it: content, or an assistant message with tool calls.
_CONTENT_OR_TOOL_CALLS = {
    "anyOf": [
        {"required": ["content"], "properties": {"content": {"type": ["string", "array"]}}},
        {
            "required": ["role", "tool_calls"],
            "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}},
        },
    ]
}


class ChatMessage(_Open):
    model_config = ConfigDict(extra="allow", json_schema_extra=_CONTENT_OR_TOOL_CALLS)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None  # an assistant message's reasoning, vLLM's name
    reasoning_content: str | None = None  # the same, DeepSeek's name (read first)

    @model_validator(mode="after")
    def _needs_content(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(
                f"a message with role {self.role!r} needs content (or, from the assistant, tool_calls)"
            )
        return self


class FunctionDef(_Open):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedToolChoice(_Open):
    type: Literal["function"] = "function"
    function: dict[str, str]


class JsonSchemaFormat(_Open):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # `schema` would shadow BaseModel's
    strict: bool | None = None


class ResponseFormat(_Open):
    """The shape of the answer's content: free text, a JSON object, or JSON matching a schema
    (decoded under a grammar: clawrl/chat/grammar.py)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type 'json_schema' needs a 'json_schema' object")
        return self

    def spec(self) -> dict[str, Any]:
        """As clawrl/chat/grammar.py takes it."""
        schema = self.json_schema.schema_ if self.json_schema is not None else None
        return {"type": self.type, "json_schema": {"schema": schema}}


class ChatTemplateKwargs(_Open):
    """vLLM's `chat_template_kwargs`: extra variables for the chat template, over the server's
    `model.chat_template_kwargs`. Any name the template reads; `enable_thinking` is a boolean."""

    enable_thinking: StrictBool | None = None

    @model_validator(mode="after")
    def _allowed(self) -> ChatTemplateKwargs:
        check_template_kwargs(self.given())
        return self

    def given(self) -> dict[str, Any]:
        """The variables the request set."""
        return self.model_dump(exclude_unset=True)


class StreamOptions(_Open):
    include_usage: bool = False


class ChatCompletionRequest(_Open):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # Unset: the model's own sampling defaults (its generation config; GET /v1/models shows them).
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, description="vLLM's: sample among the k most likely; 0 or -1: off")
    # vLLM's repetition penalty (unset: the model's default, GET /v1/models) and OpenAI's penalties.
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0, description="vLLM's: 1: off")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    n: int = Field(1, json_schema_extra={"const": 1})
    stop: str | list[str] | None = Field(
        None,
        json_schema_extra={
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                {"type": "null"},
            ]
        },
    )
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    ignore_eos: bool = False
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN)
    turn_type: Literal["main", "side"] | None = None
    session_done: bool | None = None
    prompt_cache_key: str | None = None  # OpenAI's cache routing key; a session affinity key here
    memory: bool | None = None  # false: no memory block; true: one even on a side turn (docs/memory.md)
    chat_template_kwargs: ChatTemplateKwargs | None = None

    def template_kwargs(self) -> dict[str, Any] | None:
        return self.chat_template_kwargs.given() if self.chat_template_kwargs is not None else None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stops if s]

    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def unknown_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


# `_one_target` in the OpenAPI schema: a response_id or a session_id, not both.
_ONE_TARGET = {
    "oneOf": [
        {"required": [given], "properties": {given: {"type": "string"}, other: {"type": "null"}}}
        for given, other in (("response_id", "session_id"), ("session_id", "response_id"))
    ]
}


class FeedbackRequest(BaseModel):
    """POST /v1/feedback: rate one answer (by its completion id) or a session's latest answer."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_ONE_TARGET)

    response_id: str | None = Field(None, min_length=1, max_length=200)
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN)
    rating: Literal[1, -1]
    comment: str | None = Field(None, max_length=8000)

    @model_validator(mode="after")
    def _one_target(self) -> FeedbackRequest:
        if (self.response_id is None) == (self.session_id is None):
            raise ValueError("give exactly one of response_id or session_id")
        return self
