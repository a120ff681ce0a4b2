"""The judge loop on a real store: who is asked, and what a turn's judgment is made of."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from clawrl.algo import get_method
from clawrl.algo.teacher import teacher_prompt
from clawrl.chat.template import ChatRenderer
from clawrl.config import JudgeConfig
from clawrl.engine.base import EngineFailed, SamplingParams, TokenEvent
from clawrl.judge.rewriter import engine_rewriter
from clawrl.judge.worker import JudgeLoop
from clawrl.store.db import Store
from clawrl.store.writer import StoreWriter
from clawrl.testing import make_turn
from clawrl.types import Feedback, Version

HINT = "Answer with the number alone, on one line."
NEXT_STATE = [{"role": "user", "content": "No, redo it: just the number."}]


class CountingJudge:
    """A judge backend that says -1 with a hint to every call, and counts the calls."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def complete(self, messages: list[dict[str, Any]], temperature: float, max_tokens: int) -> str:
        self.calls += 1
        if "[HINT_START]" in str(messages):
            return f"The user wanted the bare number.\n\\boxed{{1}}\n[HINT_START]{HINT}[HINT_END]"
        return "The user asks to redo it.\n\\boxed{-1}"


class RewritingEngine:
    """An engine whose every answer is `ANSWER`, recording what it was asked (or failing, if told to)."""

    max_context = 512
    stop_token_ids = frozenset({2})
    ANSWER = [41, 42, 43]

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[tuple[list[int], SamplingParams]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams):
        self.asked.append((list(prompt_ids), params))
        if self.fail:
            raise EngineFailed("the engine is gone")
        for token in self.ANSWER:
            yield TokenEvent(token, -0.1, "v7")


def _judge(
    db: Path,
    tokenizer: Any,
    turn_id: str,
    rating: int | None,
    comment: str | None = None,
    engine: RewritingEngine | None = None,
):
    """Judge `turn_id` (its next state already recorded, and `rating` if given) once, as the server does;
    with `engine`, hinted turns that failed are also rewritten (train.hint_rewrite)."""

    async def run():
        backend = CountingJudge()
        with Store.open(db) as store:
            if rating is not None:
                store.add_feedback(Feedback(turn_id, rating, comment))
            writer = StoreWriter(retry_every_s=1.0, max_pending=100)
            writer.start()
            teacher = teacher_prompt(ChatRenderer(tokenizer))
            loop = JudgeLoop(
                store,
                writer,
                backend,
                get_method("combine"),
                teacher,
                JudgeConfig(votes=3, mode="generate", weights="policy"),
                rewrite=engine_rewriter(engine, 512) if engine is not None else None,
            )
            try:
                j = await loop.judge(turn_id)
            finally:
                await writer.stop()
            return j, backend.calls, [s for s in store.ready_samples() if s.turn_id == turn_id]

    return asyncio.run(run())


def _store(db: Path, smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode("Four.", add_special_tokens=False)
    with Store.open(db) as store:
        store.upsert_session("s1", "header", 1.0)
        for i in range(3):
            plain = dict(tools=[], tool_calls=[], finish_reason="stop", logprobs=[-0.5] * len(ids))
            store.insert_turn(make_turn(f"t{i}", "s1", i, response_ids=ids, **plain))
            store.set_next_state(f"t{i}", NEXT_STATE, 2.0)


def test_an_unrated_turn_is_voted_on(tmp_path, smol_tokenizer):
    _store(tmp_path / "c.db", smol_tokenizer)
    j, calls, samples = _judge(tmp_path / "c.db", smol_tokenizer, "t0", rating=None)
    assert calls == 6 and len(j.votes) == 6  # m PRM votes and m hint votes
    assert j.score == -1 and j.hint == HINT
    assert [(s.kind, s.reward) for s in samples] == [("opd", -1.0)]  # combine: one sample carrying r


def test_a_turn_rated_before_it_is_judged_asks_no_judge(tmp_path, smol_tokenizer):
    """Its next state is there too, but the person's rating and comment are the whole judgment."""
    _store(tmp_path / "c.db", smol_tokenizer)
    j, calls, samples = _judge(tmp_path / "c.db", smol_tokenizer, "t1", 1)
    assert calls == 0 and j.votes == [] and j.score == 1 and j.hint is None
    assert [(s.kind, s.reward) for s in samples] == [("rl", 1.0)]
    comment = "Give the number first, then one short reason."
    j, calls, samples = _judge(tmp_path / "c.db", smol_tokenizer, "t2", -1, comment)
    assert calls == 0 and j.votes == [] and j.score == -1 and j.hint == comment
    assert [(s.kind, s.reward) for s in samples] == [("opd", -1.0)]  # combine: one sample carrying r


def test_a_failed_hinted_turn_is_rewritten_with_the_hint_and_distilled_into_the_bare_prompt(
    tmp_path, smol_tokenizer
):
    _store(tmp_path / "c.db", smol_tokenizer)
    engine = RewritingEngine()
    j, _, samples = _judge(tmp_path / "c.db", smol_tokenizer, "t0", rating=None, engine=engine)
    assert j.score == -1 and j.hint == HINT
    own, rewrite = sorted(samples, key=lambda s: s.reward)
    assert (own.kind, own.reward) == ("opd", -1.0)
    assert own.response_ids == smol_tokenizer.encode("Four.", add_special_tokens=False)
    ((asked, params),) = engine.asked
    assert asked == rewrite.teacher_prompt_ids == own.teacher_prompt_ids  # the hinted prompt
    assert not params.background  # decoded beside served requests: a background row can wait for good
    assert params.adapter == "default" and params.stop_token_ids == {2}
    assert (rewrite.kind, rewrite.reward, rewrite.hint) == ("opd", 0.0, HINT)
    assert rewrite.prompt_ids == own.prompt_ids and rewrite.response_ids == RewritingEngine.ANSWER
    assert rewrite.logprobs == [] and rewrite.version == "v7"  # weighed 1 by the trainer
    assert rewrite.rewrite and not own.rewrite


def test_a_rewrite_trains_beside_its_turns_own_sample(tmp_path, smol_tokenizer):
    """Training the turn's opd sample does not skip its rewrite as a second sample of that kind."""
    _store(tmp_path / "c.db", smol_tokenizer)
    _, _, samples = _judge(tmp_path / "c.db", smol_tokenizer, "t0", rating=None, engine=RewritingEngine())
    own, rewrite = sorted(samples, key=lambda s: s.reward)
    with Store.open(tmp_path / "c.db") as store:
        store.claim_samples([own.id])
        store.publish_version(Version(name="v1", step=1, path=str(tmp_path)), trained=[own.id])
        assert store.sample_status(rewrite.id) == ("ready", None)


def test_a_good_turn_is_not_rewritten_and_a_failed_rewrite_costs_nothing_but_itself(tmp_path, smol_tokenizer):
    _store(tmp_path / "c.db", smol_tokenizer)
    engine = RewritingEngine()
    j, _, samples = _judge(tmp_path / "c.db", smol_tokenizer, "t1", 1, engine=engine)
    assert j.score == 1 and not engine.asked and [s.kind for s in samples] == ["rl"]
    broken = RewritingEngine(fail=True)
    j, _, samples = _judge(tmp_path / "c.db", smol_tokenizer, "t2", None, engine=broken)
    assert j.score == -1 and len(broken.asked) == 1
    assert [(s.kind, s.reward) for s in samples] == [("opd", -1.0)]  # judging went on without it
