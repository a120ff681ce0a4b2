"""Chat completions: from a validated request to engine tokens to OpenAI responses.

`ChatService.prepare` renders the messages into prompt IDs and checks limits
(every client mistake becomes a 400 before the engine sees anything);
`complete` and `stream` then run the same token loop (`_pieces`): tokens are
detokenised incrementally, stop strings cut the text (and, by closing the
engine's generator, stop decoding), and tool calls are parsed from the text.

A thinking model's answer is split on its token IDs into reasoning and content
(clawrl/chat/reasoning.py: `AnswerText`), the same way for every engine: the reasoning streams
first, as `reasoning` and `reasoning_content` deltas, then the content; tool calls and stop strings
are the content's only. The turn records the sampled IDs as they were, think block included, the
content as `response_text` (what the client holds and echoes back, so the next request still pairs
with it) and the reasoning beside it (`Turn.reasoning`). A request decoded under a grammar is all
content: the grammar shapes the answer from its first token.

Forced tool calls and `response_format` are decoded under a grammar (`clawrl/chat/grammar.py`)
when the engine applies them (`engine.constrained_decoding`): the grammar goes to the engine in
`SamplingParams.grammar` and is recorded on the turn, so the trainer scores it under the same
mask. Otherwise a forced call only gets its first characters appended to the prompt.

With memory on (`memory.enabled`), `begin` adds the user's experiences to a main turn's system
prompt once its session is known (`_remember`, clawrl/memory/block.py): the prompt is rendered
again with the block, and the block is dropped (recorded as dropped, and counted) when the prompt
with it and the answer's `max_tokens` would pass the window. The turn records the client's
messages as they came and the block beside them (`Turn.memory`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import TypeVar

from transformers import PreTrainedTokenizerBase

from clawrl.api.errors import BadRequest, ModelUnavailable, NotFound, error_body
from clawrl.api.responses import (
    Completion,
    TokenText,
    chunk_json,
    completion_json,
    reasoning_delta,
    tool_call_json,
)
from clawrl.api.schemas import ChatCompletionRequest
from clawrl.chat.grammar import GrammarError, grammar_for
from clawrl.chat.reasoning import AnswerText, opens_thinking, think_tokens, thinks
from clawrl.chat.template import ChatRenderer, ChatRenderError, RenderedPrompt
from clawrl.chat.tools import ContentDelta, ToolCallStream, parse_tool_calls
from clawrl.collect.collector import Collector
from clawrl.collect.memory import MemoryBook
from clawrl.engine.base import Engine, EngineError, SamplingParams, TokenEvent, sampling_record
from clawrl.memory import Recalled, with_memory
from clawrl.sessions.tracker import Hints, Resolution
from clawrl.types import Message, Turn

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Prepared:
    request: ChatCompletionRequest
    messages: list[Message]
    tools: list[dict] | None
    prompt: RenderedPrompt
    params: SamplingParams
    completion: Completion
    created_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    resolution: Resolution | None = None
    recorded: bool = False
    memory: dict | None = None  # what `Turn.memory` records: the block added, or why it was dropped


@dataclass
class _Piece:
    text: str  # content
    reasoning: str
    tokens: list[TokenEvent]
    finish_reason: str | None


@dataclass
class _Reasoning:
    """A reasoning delta of the stream."""

    text: str


class ChatService:
    def __init__(
        self,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        served_model_name: str,
        default_max_tokens: int,
        collector: Collector | None = None,
        memory: MemoryBook | None = None,
        template_kwargs: dict | None = None,
    ) -> None:
        self.engine = engine
        self.collector = collector
        self.memory = memory  # None: memory is off (memory.enabled) or nothing is recorded
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer, template_kwargs=template_kwargs)
        self.think = think_tokens(tokenizer)  # None: no split, every token is content
        self.thinks = thinks(tokenizer, template_kwargs)  # the model card's `reasoning`
        self.model_name = served_model_name
        self.default_max_tokens = default_max_tokens
        self.token_text = TokenText(tokenizer)

    def prepare(self, req: ChatCompletionRequest) -> Prepared:
        if req.model is not None and req.model != self.model_name:
            raise NotFound(
                f"the model {req.model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        status = self.engine.stats().status
        if status != "ok":  # the vLLM server died and is being restarted: say so at once, do not queue
            raise ModelUnavailable(f"the model server is {status}; try again shortly")
        if req.unknown_fields():
            log.info("ignoring unknown request fields: %s", shown_names(req.unknown_fields()))
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        constrained = self.engine.constrained_decoding
        prompt = self._render(req, messages, tools, force_prefix=not constrained)
        grammar = self._grammar(req, tools) if constrained else None
        defaults = self.engine.sampling_defaults  # for what the request leaves unset
        if grammar is not None:  # JSON repeats its quotes and keys: no default penalty under a grammar
            defaults = replace(defaults, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
        params = SamplingParams(
            max_tokens=self._max_tokens(req, len(prompt.prompt_ids)),
            temperature=named(req.temperature, defaults.temperature),
            top_p=named(req.top_p, defaults.top_p),
            top_k=named(req.top_k, defaults.top_k),
            repetition_penalty=named(req.repetition_penalty, defaults.repetition_penalty),
            frequency_penalty=named(req.frequency_penalty, defaults.frequency_penalty),
            presence_penalty=named(req.presence_penalty, defaults.presence_penalty),
            seed=req.seed,
            top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0,
            stop_token_ids=self.engine.stop_token_ids,
            ignore_eos=req.ignore_eos,
            grammar=grammar,
        )
        completion = Completion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.model_name,
            prompt_ids=prompt.prompt_ids,
        )
        return Prepared(
            request=req, messages=messages, tools=tools, prompt=prompt, params=params, completion=completion
        )

    async def begin(self, prep: Prepared, hints: Hints, memory: bool | None = None) -> None:
        """Resolve the session (and record the previous turn's next state) before decoding; then add
        the memory block to a main turn's prompt, unless the request opted out (`memory` False), or
        to any turn's where it asked for it (`memory` True: a side turn is never judged, so its block
        teaches nothing; `clawrl eval` measures with and without memory so). The request is decoded
        with its user's adapter where the engine keeps one per user (docs/users.md), and names its
        session to an engine that keeps sessions on replicas (clawrl/engine/replicas)."""
        prep.params = replace(prep.params, adapter=hints.user)
        if self.collector is not None:
            prep.resolution = await self.collector.begin(prep.messages, hints)
        r = prep.resolution
        if r is not None:  # several replicas keep a session on one, its prompt's prefix cached there
            prep.params = replace(prep.params, affinity=r.session_id)
        wanted = memory if memory is not None else r is not None and r.turn_type == "main"
        if wanted and self.memory is not None and r is not None:
            recalled = await self.memory.recall(prep.messages, r.session_id, r.user)
            if recalled is not None:
                self._remember(prep, recalled)

    def _remember(self, prep: Prepared, recalled: Recalled) -> None:
        """Render the prompt again with the block, unless that would pass the window (then drop it)."""
        messages = with_memory(prep.messages, recalled.block)
        try:
            prompt = self._render(prep.request, messages, prep.tools, not self.engine.constrained_decoding)
        except BadRequest as exc:  # the request rendered without the block: serve it so
            prep.memory = {"ids": [], "dropped": f"render: {exc.message}", "picked": recalled.ids}
            return
        if len(prompt.prompt_ids) + prep.params.max_tokens > self.engine.max_context:
            prep.memory = {"ids": [], "dropped": "window", "picked": recalled.ids}
            return
        prep.prompt, prep.completion.prompt_ids = prompt, prompt.prompt_ids
        prep.memory = recalled.record()

    def _render(
        self,
        req: ChatCompletionRequest,
        messages: list[Message],
        tools: list[dict] | None,
        force_prefix: bool,
    ) -> RenderedPrompt:
        try:
            kwargs = self.renderer.kwargs(req.template_kwargs())
        except ChatRenderError as exc:
            raise BadRequest(str(exc), param="chat_template_kwargs") from exc
        try:
            return self.renderer.render(
                messages, tools, _tool_choice(req), force_prefix=force_prefix, template_kwargs=kwargs
            )
        except ChatRenderError as exc:
            raise BadRequest(str(exc), param="messages") from exc

    def _grammar(self, req: ChatCompletionRequest, tools: list[dict] | None) -> dict | None:
        """The grammar the answer is decoded under (the tool choice was checked by `_render`)."""
        response_format = req.response_format.spec() if req.response_format is not None else None
        choice = _tool_choice(req)
        try:
            return grammar_for(tools, choice, response_format)
        except GrammarError as exc:
            param = "tools" if choice == "required" or isinstance(choice, dict) else "response_format"
            raise BadRequest(f"cannot constrain the answer: {exc}", param=param) from exc

    def _max_tokens(self, req: ChatCompletionRequest, prompt_len: int) -> int:
        context = self.engine.max_context
        room = context - prompt_len
        if room <= 0:
            raise BadRequest(
                f"this model's maximum context length is {context} tokens, but the messages "
                f"have {prompt_len} tokens; shorten them",
                param="messages",
                code="context_length_exceeded",
            )
        asked = req.completion_limit()
        if asked is not None and asked > room:
            raise BadRequest(
                f"this model's maximum context length is {context} tokens; the messages have "
                f"{prompt_len} and you asked for {asked} more (at most {room})",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return asked if asked is not None else min(room, self.default_max_tokens)

    async def complete(self, prep: Prepared) -> dict:
        c = prep.completion
        async with self._recording(prep):
            async for _ in self._pieces(prep):
                pass
        tool_names = prep.prompt.tool_names
        if tool_names:
            c.text, c.tool_calls = parse_tool_calls(prep.prompt.forced_prefix + c.text, tool_names)
            if c.tool_calls:
                c.finish_reason = "tool_calls"
        await self._record(prep)
        return completion_json(c, self._logprobs(prep, c.tokens))

    async def stream(self, prep: Prepared) -> AsyncIterator[str]:
        c, req = prep.completion, prep.request
        tools = ToolCallStream(prep.prompt.tool_names, prefix=prep.prompt.forced_prefix)
        shown: list[str] = []  # the content the client receives (tool-call markup parsed out)
        yield chunk_json(c, {"role": "assistant", "content": ""})
        try:
            async with self._recording(prep):
                async for piece in self._pieces(prep):
                    events: list = [_Reasoning(piece.reasoning)] if piece.reasoning else []
                    if prep.prompt.tool_names:
                        events += tools.feed(piece.text)
                        if piece.finish_reason is not None:
                            events += tools.finish()
                    elif piece.text or not piece.reasoning:
                        events.append(ContentDelta(piece.text))
                    for i, event in enumerate(events):
                        lp = self._logprobs(prep, piece.tokens) if i == 0 else None
                        if isinstance(event, ContentDelta):
                            shown.append(event.text)
                        yield self._delta_chunk(c, event, lp)
                    if not events and req.logprobs:
                        yield chunk_json(c, {}, logprobs=self._logprobs(prep, piece.tokens))
        except ModelUnavailable as exc:  # headers are sent: report it in the stream
            yield f"data: {json.dumps(error_body(exc.message, exc.type))}\n\n"
            return
        if prep.prompt.tool_names:  # record what the client saw, so its echo continues the session
            c.text = "".join(shown)
        if c.tool_calls:
            c.finish_reason = "tool_calls"
        await self._record(prep)
        yield chunk_json(c, {}, finish_reason=c.finish_reason)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield chunk_json(c, None, usage=True)
        yield "data: [DONE]\n\n"

    def _delta_chunk(self, c: Completion, event: object, logprobs: dict | None) -> str:
        if isinstance(event, _Reasoning):
            return chunk_json(c, reasoning_delta(event.text), logprobs=logprobs)
        if isinstance(event, ContentDelta):
            return chunk_json(c, {"content": event.text}, logprobs=logprobs)
        c.tool_calls.append(event.call)  # a ToolCallDelta
        return chunk_json(c, {"tool_calls": [tool_call_json(event.call, event.index)]}, logprobs=logprobs)

    def _logprobs(self, prep: Prepared, tokens: list[TokenEvent]) -> dict | None:
        if not prep.request.logprobs:
            return None
        return self.token_text.logprobs(tokens, prep.params.top_logprobs)

    async def _pieces(self, prep: Prepared) -> AsyncIterator[_Piece]:
        """Run the engine; yield text as it becomes final, with the tokens behind it."""
        c = prep.completion
        free = prep.params.grammar is None and not prep.prompt.forced_prefix  # else all content
        inside = free and opens_thinking(c.prompt_ids, self.think)
        answer = AnswerText(self.tokenizer, self.think if free else None, inside, prep.request.stop_list())
        pending: list[TokenEvent] = []
        try:
            async with aclosing(self.engine.generate(c.prompt_ids, prep.params)) as tokens:
                async for event in tokens:
                    if prep.first_token_at is None:
                        prep.first_token_at = time.time()
                    c.add(event)
                    pending.append(event)
                    reasoning, text = answer.add(event.token_id)
                    c.reasoning_tokens = answer.reasoning_tokens
                    finish = "stop" if answer.stopped else event.finish_reason
                    if finish is not None and not answer.stopped:
                        more_reasoning, more_text = answer.finish()
                        reasoning, text = reasoning + more_reasoning, text + more_text
                    if text or reasoning or finish is not None:
                        c.text += text
                        c.reasoning += reasoning
                        c.finish_reason = finish
                        yield _Piece(text, reasoning, pending, finish)
                        pending = []
                    if finish is not None:
                        return  # leaving the `async with` cancels decoding (stop strings)
        except EngineError as exc:
            raise ModelUnavailable(f"the model failed: {exc}") from exc

    @asynccontextmanager
    async def _recording(self, prep: Prepared) -> AsyncIterator[None]:
        """Record a turn its client cut off; hand a failed one's session back untouched."""
        try:
            yield
        except ModelUnavailable:
            if self.collector is not None and prep.resolution is not None:
                self.collector.fail(prep.resolution)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            if self.collector is not None and prep.resolution is not None and not prep.recorded:
                prep.recorded = True
                self.collector.finish_later(prep.resolution, self._turn(prep, "abort"))
            raise

    async def _record(self, prep: Prepared) -> None:
        if self.collector is None or prep.resolution is None or prep.recorded:
            return
        prep.recorded = True
        await self.collector.finish(
            prep.resolution, self._turn(prep, prep.completion.finish_reason or "stop")
        )

    def _turn(self, prep: Prepared, finish_reason: str):
        assert prep.resolution is not None
        return build_turn(
            r=prep.resolution,
            c=prep.completion,
            messages=prep.messages,
            tools=prep.tools,
            temperature=prep.params.temperature,
            created_at=prep.created_at,
            first_token_at=prep.first_token_at,
            finish_reason=finish_reason,
            grammar=prep.params.grammar,
            sampling=sampling_record(
                prep.params,
                self.engine.processed_logprobs,
                prep.completion.cached_version,
                prep.completion.replicas,
            ),
            memory=prep.memory,
            template_kwargs=prep.prompt.template_kwargs,
        )


def _tool_choice(req: ChatCompletionRequest) -> str | dict | None:
    choice = req.tool_choice
    return choice.model_dump() if choice is not None and not isinstance(choice, str) else choice


def shown_names(names: list[str], most: int = 10, width: int = 40) -> str:
    """Client-chosen names as a log shows them: quoted (a newline cannot forge a log line), cut short."""
    shown = ", ".join(repr(name[:width]) for name in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def build_turn(
    r: Resolution,
    c: Completion,
    messages: list[Message],
    tools: list[dict] | None,
    temperature: float,
    created_at: float,
    first_token_at: float | None,
    finish_reason: str,
    grammar: dict | None = None,
    sampling: dict | None = None,
    memory: dict | None = None,
    template_kwargs: dict | None = None,
) -> Turn:
    return Turn(
        id=c.id,
        session_id=r.session_id,
        index=r.turn_index,
        turn_type=r.turn_type,
        messages=messages,
        tools=tools,
        prompt_ids=c.prompt_ids,
        response_ids=[t.token_id for t in c.tokens],
        logprobs=[t.logprob for t in c.tokens],
        response_text=c.text,
        tool_calls=[tool_call_json(call) for call in c.tool_calls],
        finish_reason=finish_reason,
        versions=c.versions,
        temperature=temperature,
        created_at=created_at,
        first_token_at=first_token_at,
        finished_at=time.time(),
        rope_scaled=c.tokens[0].rope_scaled if c.tokens else None,
        grammar=grammar,
        sampling=sampling,
        memory=memory,
        reasoning=c.reasoning or None,
        chat_template_kwargs=template_kwargs or None,
    )


def named(value: T | None, default: T) -> T:
    """What the request named, else the model's default."""
    return default if value is None else value
