"""One episode: an environment instance, a task row, and the model answering through `/v1`.

    env = Env()                                   the class, called with no arguments (TRL)
    observation = env.reset(**row)                every column of the row, `prompt` included (TRL)
    messages = row's prompt (+ observation appended to its last message's content)
    loop, turn t = 0, 1, ...:
        answer = chat(messages, tools, tool_choice = schedule.at(t))
        no tool call             -> ends "answered"
        tool calls               -> each run (bounded by the tool timeout), its result a `tool` message
        env.done set to True     -> ends "done"
        tokens >= max_tokens     -> ends "token_limit" (also: an answer cut at the budget, a context
                                    the server says is full)
        t + 1 == max_turns       -> ends "turn_limit"
    reward = env.get_reward() (+ the --reward function's value), for "answered" and "done";
             0 for "turn_limit" and "token_limit"

The episode is dropped (reward None, `reason` says why) when the environment cannot be
built, the row does not fit `reset` (a TypeError: wrong columns), `reset` or the reward
raises or hangs, the reward is not a finite number, or the server refuses a request.
Nothing here posts: the group runner posts the result (clawrl/envs/groups.py).

The reward function gets TRL's `reward_funcs` arguments for a batch of one:
`prompts=[prompt messages]`, `completions=[the messages after the prompt]`,
`environments=[env]`, and each other column of the row as a one-item list; it returns a
list of one number. (TRL also passes `completion_ids`, `trainer_state`, `log_extra` and
`log_metric`; clawrl does not, so a reward function should take `**kwargs`, as TRL asks.)
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from clawrl.envs.schedule import Schedule
from clawrl.envs.tools import ToolSchemaError, ToolSet, find_tools, run_bounded

ANSWERED, DONE, TURN_LIMIT, TOKEN_LIMIT = "answered", "done", "turn_limit", "token_limit"


class ContextFull(Exception):
    """The server refused the request: the conversation no longer fits the model's context."""


class Refused(Exception):
    """The server refused the request (a 4xx other than a full context); the message says why."""


@dataclass
class Reply:
    """One answer as the runner needs it."""

    message: dict[str, Any]  # the assistant message, to send back as it came
    finish_reason: str
    completion_tokens: int
    version: str  # the policy version that answered ("" if the server does not say)


class Chat(Protocol):
    """What the episode needs of the server (clawrl/envs/client.py; a scripted one in the tests)."""

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_choice: str | dict[str, Any] | None,
        *,
        session_id: str,
        max_tokens: int,
        temperature: float | None,
    ) -> Reply: ...


@dataclass(frozen=True)
class EpisodeSettings:
    """The limits of one episode."""

    schedule: Schedule = field(default_factory=Schedule)
    max_turns: int = 8
    max_tokens: int = 512  # generated tokens, summed over the episode's answers
    tool_timeout_s: float = 30.0  # also bounds reset() and the reward
    temperature: float | None = None  # None: the model's own sampling defaults


@dataclass
class EpisodeResult:
    session_id: str
    task: str
    reward: float | None
    reason: str
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tokens: int = 0
    versions: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def dropped(self) -> bool:
        return self.reward is None

    @property
    def version(self) -> str | None:
        """The version that made the first answer (None when no answer came)."""
        return self.versions[0] if self.versions else None

    def info(self) -> dict[str, Any]:
        """What the runner reports beside the reward (POST /v1/episodes `info`)."""
        return {
            "tool_errors": self.tool_errors,
            "tokens": self.tokens,
            "versions": self.versions,
            "seconds": round(self.seconds, 3),
        }


class Dropped(Exception):
    """The episode cannot count; the message is the reason recorded with it."""


def prompt_messages(prompt: Any) -> list[dict[str, Any]]:
    """A row's `prompt` as chat messages: a string is one user message (TRL's standard format)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "role" in m for m in prompt):
        return [dict(m) for m in prompt]
    raise Dropped("the row's prompt is neither a string nor a list of messages")


def with_observation(messages: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """`reset`'s string appended to the last message's content, as TRL does (no separator added)."""
    if observation is None:
        return messages
    if not isinstance(observation, str):
        raise Dropped(f"reset() returned {type(observation).__name__}; TRL's contract is a string or None")
    last = messages[-1]
    return [*messages[:-1], {**last, "content": (last.get("content") or "") + observation}]


def finite_reward(value: Any, source: str) -> float:
    """`value` as a float; Dropped naming `source` when it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Dropped(f"{source} is not a finite number: {value!r}")
    return float(value)


async def run_episode(
    chat: Chat,
    factory: Callable[[], Any],
    row: dict[str, Any],
    task: str,
    session_id: str,
    settings: EpisodeSettings,
    reward_fn: Callable[..., Any] | None = None,
) -> EpisodeResult:
    """Run one episode to its end; never raises for what the environment or the row does wrong."""
    result = EpisodeResult(session_id, task, None, "")
    started = time.monotonic()
    try:
        env, prompt, tools = await _start(factory, row, settings)
        result.messages = list(prompt)
        result.reason = await _turns(chat=chat, env=env, tools=tools, result=result, settings=settings)
        if result.reason in (ANSWERED, DONE):
            result.reward = await episode_reward(
                env=env,
                reward_fn=reward_fn,
                prompt=prompt,
                result=result,
                row=row,
                timeout=settings.tool_timeout_s,
            )
        else:
            result.reward = 0.0
    except Dropped as exc:
        result.reward, result.reason = None, str(exc)
    result.seconds = time.monotonic() - started
    return result


async def _start(
    factory: Callable[[], Any], row: dict[str, Any], settings: EpisodeSettings
) -> tuple[Any, list[dict[str, Any]], ToolSet]:
    """Build the environment, reset it with the row, read its tools."""
    timeout = settings.tool_timeout_s
    try:
        env = await run_bounded(factory, {}, timeout)
    except TimeoutError:
        raise Dropped(f"constructing the environment took over {timeout:g} s") from None
    except Exception as exc:
        raise Dropped(f"constructing the environment failed: {_error(exc)}") from exc
    prompt = prompt_messages(row.get("prompt"))
    if not callable(getattr(env, "reset", None)):
        raise Dropped("the environment has no reset method")
    _check_fits(env.reset, row)
    try:
        observation = await run_bounded(env.reset, dict(row), timeout)
    except TimeoutError:
        raise Dropped(f"reset() took over {timeout:g} s") from None
    except Exception as exc:
        raise Dropped(f"reset() failed: {_error(exc)}") from exc
    try:
        tools = find_tools(env)
    except ToolSchemaError as exc:
        raise Dropped(str(exc)) from exc
    missing = settings.schedule.unknown(tools.names)
    if missing:
        raise Dropped(f"--tool-choice names {', '.join(missing)}, which this task does not offer")
    return env, with_observation(prompt, observation), tools


def _check_fits(reset: Callable[..., Any], row: dict[str, Any]) -> None:
    """Dropped when reset(**row) cannot even be called: the row's columns do not fit its parameters."""
    try:
        signature = inspect.signature(reset)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call itself will tell
        return
    try:
        signature.bind(**row)
    except TypeError as exc:
        raise Dropped(f"the task row does not fit reset(): {exc}") from None


async def _turns(
    chat: Chat, env: Any, tools: ToolSet, result: EpisodeResult, settings: EpisodeSettings
) -> str:
    """Answer, run the tools, repeat; the reason the episode ended."""
    for turn in range(settings.max_turns):
        if not tools.schemas and settings.schedule.at(turn) == "required":
            raise Dropped("--tool-choice required, but the environment offers no tools")
        choice = settings.schedule.tool_choice(turn) if tools.schemas else None
        try:
            reply = await chat.complete(
                result.messages,
                tools.schemas or None,
                choice,
                session_id=result.session_id,
                max_tokens=settings.max_tokens - result.tokens,
                temperature=settings.temperature,
            )
        except ContextFull:
            return TOKEN_LIMIT
        except Refused as exc:
            raise Dropped(f"the server refused an answer: {exc}") from exc
        result.turns += 1
        result.tokens += reply.completion_tokens
        result.versions.append(reply.version)
        result.messages.append(reply.message)
        calls = reply.message.get("tool_calls") or []
        if not calls:
            return TOKEN_LIMIT if reply.finish_reason == "length" else ANSWERED
        await _run_calls(tools, calls, result, settings.tool_timeout_s)
        if _done(env):
            return DONE
        if result.tokens >= settings.max_tokens:
            return TOKEN_LIMIT
    return TURN_LIMIT


async def _run_calls(
    tools: ToolSet, calls: list[dict[str, Any]], result: EpisodeResult, timeout: float
) -> None:
    """Run each call in order; its result becomes a `tool` message answering it."""
    for call in calls:
        function = call.get("function") or {}
        name = str(function.get("name", ""))
        outcome = await tools.call(name, function.get("arguments"), timeout)
        result.tool_calls += 1
        result.tool_errors += outcome.error
        message = {
            "role": "tool",
            "tool_call_id": call.get("id", ""),
            "name": name,
            "content": outcome.content,
        }
        result.messages.append(message)


def _done(env: Any) -> bool:
    """clawrl's `done` addition: the environment set `self.done = True` (a method named done is a tool)."""
    done = getattr(env, "done", False)
    return not callable(done) and bool(done)


async def episode_reward(
    env: Any,
    reward_fn: Callable[..., Any] | None,
    prompt: list[dict[str, Any]],
    result: EpisodeResult,
    row: dict[str, Any],
    timeout: float,
) -> float:
    """get_reward() plus the reward function's value (TRL sums its reward sources, weight 1 each)."""
    total = 0.0
    if callable(getattr(env, "get_reward", None)):
        total += finite_reward(await _bounded("get_reward()", env.get_reward, {}, timeout), "get_reward()")
    if reward_fn is not None:
        columns = {key: [value] for key, value in row.items() if key != "prompt"}
        kwargs = {**columns, "prompts": [prompt], "completions": [result.messages[len(prompt) :]]}
        values = await _bounded("the reward function", reward_fn, {**kwargs, "environments": [env]}, timeout)
        if not isinstance(values, list | tuple) or len(values) != 1:
            raise Dropped(f"the reward function returned {values!r}; expected a list of one number")
        total += finite_reward(values[0], "the reward function's value")
    return total


async def _bounded(what: str, fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float) -> Any:
    try:
        return await run_bounded(fn, kwargs, timeout)
    except TimeoutError:
        raise Dropped(f"{what} took over {timeout:g} s") from None
    except Exception as exc:
        raise Dropped(f"{what} failed: {_error(exc)}") from exc


def _error(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
