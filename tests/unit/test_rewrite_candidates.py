"""Best of k hint rewrites (clawrl/judge/rewriter.py): the answer the hint explains most is kept.

On the embedded model through the real local engine: an answer that does what the hint says is
likelier with the hint than without it, one that ignores it is not; and of several sampled answers
the rewriter keeps the one with the largest gain, as `hint_gain` measures it.
"""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.engine.local.engine import LocalEngine
from clawrl.judge.rewriter import engine_rewriter, hint_gain
from clawrl.testing import make_turn

HINT = "\n\n[Hindsight hint] End the reply with the line 'Hope that helps!'."


@pytest.fixture(scope="module")
def smol(embedded_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir).eval()
    return model, tokenizer


def _prompt(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _run(model, tokenizer, body):
    async def main():
        eos = frozenset({tokenizer.convert_tokens_to_ids("<|im_end|>")})
        engine = LocalEngine(model, model_name="t", max_context=2048, stop_token_ids=eos)
        await engine.start()
        try:
            return await body(engine)
        finally:
            await engine.stop()

    return asyncio.run(main())


def test_an_answer_that_follows_the_hint_gains_from_it_and_one_that_ignores_it_does_not(smol):
    model, tokenizer = smol
    question = "What is 6 times 7?"
    bare, hinted = _prompt(tokenizer, question), _prompt(tokenizer, question + HINT)
    follows = tokenizer.encode("6 times 7 is 42.\nHope that helps!")
    ignores = tokenizer.encode("6 times 7 is 42.")

    async def body(engine):
        return await hint_gain(engine, hinted, bare, follows), await hint_gain(engine, hinted, bare, ignores)

    gain_follows, gain_ignores = _run(model, tokenizer, body)
    assert gain_follows > gain_ignores + 2.0, (gain_follows, gain_ignores)


class Recording:
    """The real engine, with every answer it generates written down."""

    def __init__(self, engine):
        self.engine, self.answers = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, params):
        ids = []
        self.answers.append(ids)
        async for event in self.engine.generate(prompt_ids, params):
            ids.append(event.token_id)
            yield event


def test_of_several_answers_the_rewriter_keeps_the_one_the_hint_explains_most(smol):
    model, tokenizer = smol
    question = "What is 12 plus 30?"
    bare, hinted = _prompt(tokenizer, question), _prompt(tokenizer, question + HINT)
    turn = make_turn(prompt_ids=bare, response_ids=tokenizer.encode("42"), versions=["v0"], temperature=1.0)

    async def body(engine):
        recording = Recording(engine)
        ids, version = await engine_rewriter(recording, 64, candidates=4)(hinted, turn)
        gains = [await hint_gain(engine, hinted, bare, answer) for answer in recording.answers]
        return ids, version, recording.answers, gains

    ids, version, answers, gains = _run(model, tokenizer, body)
    assert len(answers) == 4 and version == "v0"
    assert ids == answers[max(range(4), key=gains.__getitem__)], gains
