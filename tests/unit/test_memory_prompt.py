"""The gateway adds the memory block to a main turn's prompt (`ChatService.begin`): the prompt is the
one the block renders to, the client's messages stay as they came, a request may opt out, a side
turn gets none, and a block that would pass the window is dropped. The real tokenizer and chat
template; hand-written stand-ins for the engine, the collector and the memory book (no model)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from clawrl.api.completions import ChatService, Prepared
from clawrl.api.schemas import ChatCompletionRequest
from clawrl.chat.template import ChatRenderer
from clawrl.engine.base import EngineStats
from clawrl.memory import HEADER, Recalled, with_memory
from clawrl.model.sampling import SamplingDefaults
from clawrl.sessions.tracker import Hints, Resolution

MESSAGES = [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "What should I wear?"}]
BLOCK = f"{HEADER}\n- Keep answers short and to the point.\n- Answer in French."
MAX_TOKENS = 8


class Engine:
    """What `ChatService` reads of an engine before it generates."""

    constrained_decoding = False
    processed_logprobs = False
    sampling_defaults = SamplingDefaults()
    stop_token_ids = [2]
    version = "v0"

    def __init__(self, max_context: int) -> None:
        self.max_context = max_context

    def stats(self) -> EngineStats:
        return EngineStats()


class Sessions:
    """The collector's `begin`: every request is the first turn of the session its hints name."""

    async def begin(self, messages: list[dict], hints: Hints) -> Resolution:
        turn_type = hints.turn_type or "main"
        return Resolution(hints.session_id or "s", hints.source, True, turn_type, 0, None, None, False, "", 2)


class Memory:
    """`MemoryBook.recall`, scripted."""

    def __init__(self, recalled: Recalled | None) -> None:
        self.recalled, self.calls = recalled, 0

    async def recall(self, messages: list[dict], session_id: str, owner: str = "default") -> Recalled | None:
        self.calls += 1
        return self.recalled


def served(
    tokenizer: Any, recalled: Recalled | None, hints: Hints, wanted: bool | None = None, context: int = 4096
):
    memory = Memory(recalled)
    chat = ChatService(Engine(context), tokenizer, "clawrl", 16, Sessions(), memory)  # type: ignore[arg-type]
    prep: Prepared = chat.prepare(ChatCompletionRequest(messages=MESSAGES, max_tokens=MAX_TOKENS))
    plain = list(prep.prompt.prompt_ids)
    asyncio.run(chat.begin(prep, hints, wanted))
    return prep, plain, memory


@pytest.fixture(scope="module")
def renderer(smol_tokenizer: Any) -> ChatRenderer:
    return ChatRenderer(smol_tokenizer)


def test_a_main_turn_is_served_the_prompt_its_block_renders_to(smol_tokenizer, renderer):
    prep, plain, _ = served(smol_tokenizer, Recalled([3, 5], BLOCK), Hints("s2", "header"))
    expected = renderer.render(with_memory(MESSAGES, BLOCK), None).prompt_ids
    assert prep.prompt.prompt_ids == prep.completion.prompt_ids == expected != plain
    assert prep.messages == MESSAGES  # what the turn records, and sessions are matched on
    assert prep.memory == {"ids": [3, 5], "block": BLOCK}


@pytest.mark.parametrize(
    ("recalled", "hints", "wanted", "asked"),
    [
        (Recalled([3], BLOCK), Hints("s2", "header"), False, 0),  # opted out: memory is not even read
        (Recalled([3], BLOCK), Hints("s2", "header", turn_type="side"), None, 0),  # a side turn
        (None, Hints("s2", "header"), None, 1),  # nothing to add
    ],
)
def test_no_block_when_opted_out_for_a_side_turn_or_with_nothing_to_add(
    smol_tokenizer, recalled, hints, wanted, asked
):
    prep, plain, memory = served(smol_tokenizer, recalled, hints, wanted)
    assert prep.prompt.prompt_ids == plain and prep.memory is None and memory.calls == asked


def test_a_side_turn_that_asks_for_memory_gets_the_block(smol_tokenizer, renderer):
    """`X-Memory: on` on a side turn (clawrl eval's held-out answers with memory)."""
    hints = Hints("s2", "header", turn_type="side")
    prep, plain, memory = served(smol_tokenizer, Recalled([3], BLOCK), hints, True)
    assert prep.prompt.prompt_ids == renderer.render(with_memory(MESSAGES, BLOCK), None).prompt_ids != plain
    assert prep.memory == {"ids": [3], "block": BLOCK} and memory.calls == 1


def test_a_block_that_would_pass_the_window_is_dropped_and_the_request_served_without_it(smol_tokenizer):
    _, plain, _ = served(smol_tokenizer, None, Hints("s2", "header"))
    exact = len(plain) + MAX_TOKENS  # the prompt and the answer fill the window: no room for a block
    prep, again, _ = served(smol_tokenizer, Recalled([3], BLOCK), Hints("s2", "header"), context=exact)
    assert prep.prompt.prompt_ids == again == plain
    assert prep.memory == {"ids": [], "dropped": "window", "picked": [3]}
