"""The engine side of hint rewrites (clawrl/algo/rewrite.py): the served policy answers the hinted prompt.

`engine_rewriter(engine, max_tokens)` gives the judge loop a `Rewriter`: given the teacher prompt's
IDs and the turn, it samples one answer from the serving engine with the turn's adapter and the
sampling the turn was served with (its temperature, top_p, top_k and penalties), and returns the
sampled IDs and the version that wrote them. It is an ordinary request, one more stream in the
batch, not a background one: the local engine decodes background rows only while no served
request is active, and under steady traffic (four users chatting) a rewrite waited there for good,
holding up the judging of every turn behind it. Engine failures propagate as `EngineError`; the
loop logs them and goes on.

With `candidates` > 1 (`train.hint_rewrite_candidates`) it samples that many answers to the hinted
prompt at once and keeps the one the hint explains most: the largest

    sum_t [ log p(a_t | s + hint) - log p(a_t | s) ]

(the pointwise mutual information of the answer with the hint, under the served weights at
temperature 1). An answer that does what the hint asks is likely with the hint and unlikely
without it; one that ignores the hint scores about 0. On the embedded model, best of 4 met issue
53's preferences in 2/8, 3/8 and 2/8 tasks (bold, numbered, signoff) against 1.25, 3.0 and 0.75
for one answer (docs/evaluation.md). Where the engine cannot score (a full version on the local
engine: `EngineFailed`), the first candidate is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from clawrl.algo.rewrite import turn_user
from clawrl.engine.base import Engine, EngineFailed, SamplingParams
from clawrl.types import Turn

REWRITE_MAX_TOKENS = 512  # a rewrite is about its answer's length (twice it, 128 at least), never past this
Rewriter = Callable[[list[int], Turn], Awaitable[tuple[list[int], str]]]
"""(teacher prompt IDs, turn) -> (the rewrite's token IDs, the version that wrote them)."""


def engine_rewriter(engine: Engine, max_tokens: int, candidates: int = 1) -> Rewriter:
    async def one(prompt_ids: list[int], turn: Turn, limit: int) -> tuple[list[int], str]:
        ids: list[int] = []
        version = turn.policy_version
        async for event in engine.generate(prompt_ids, _params(turn, limit, engine)):
            ids.append(event.token_id)
            version = event.version
        return ids, version

    async def rewrite(prompt_ids: list[int], turn: Turn) -> tuple[list[int], str]:
        room = engine.max_context - len(prompt_ids) - 1
        if room < 1:
            return [], turn.policy_version
        limit = min(max_tokens, room, max(128, 2 * len(turn.response_ids)))  # about the answer's length
        drafts = await asyncio.gather(*(one(prompt_ids, turn, limit) for _ in range(candidates)))
        drafts = [d for d in drafts if d[0]]
        if len(drafts) < 2:
            return drafts[0] if drafts else ([], turn.policy_version)
        try:
            gains = [await hint_gain(engine, prompt_ids, list(turn.prompt_ids), ids) for ids, _ in drafts]
        except EngineFailed:
            return drafts[0]
        return drafts[max(range(len(drafts)), key=gains.__getitem__)]

    return rewrite


async def hint_gain(engine: Engine, hinted: list[int], bare: list[int], answer: list[int]) -> float:
    """sum_t log p(answer_t | hinted) - log p(answer_t | bare): how much the hint explains the answer."""
    with_hint = await engine.score(hinted, answer, 1.0)
    without = await engine.score(bare, answer, 1.0)
    return sum(with_hint) - sum(without)


def _params(turn: Turn, max_tokens: int, engine: Engine) -> SamplingParams:
    s = turn.sampling or {}
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=turn.temperature,
        top_p=float(s.get("top_p", 1.0)),
        top_k=int(s.get("top_k", 0)),
        repetition_penalty=float(s.get("repetition_penalty", 1.0)),
        frequency_penalty=float(s.get("frequency_penalty", 0.0)),
        presence_penalty=float(s.get("presence_penalty", 0.0)),
        stop_token_ids=engine.stop_token_ids,
        adapter=turn_user(turn),
    )
