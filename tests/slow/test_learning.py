"""Training moves the embedded model's measured behaviour: the OPD signal raises the word a hint names.

The samples are what the server would record: the model's answers with
the behaviour logprobs the model gave them (recomputed each step, as fresh
turns from the newest version would carry). Half answer "Banana", half
"Apple"; the hindsight hint says the user wanted Banana. The teacher (the
live policy reading the hint) rates "Banana" higher than the student did, so
its tokens get a large positive advantage; "Apple" gains far less.

(No "without a hint nothing moves" control: the advantage is then ~1e-7 of
numerical noise, and AdamW normalises even that into full-size steps.)
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from clawrl.algo.teacher import enhanced_messages
from clawrl.config import TrainConfig
from clawrl.train.policy import build_policy
from clawrl.types import Sample

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name one fruit. Answer with one word."}]
HINT = "The user wanted the answer Banana."


def _render(tokenizer, messages) -> list[int]:
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )


@torch.no_grad()
def _behaviour(model, prompt: list[int], response: list[int]) -> list[float]:
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


@torch.no_grad()
def _first_token_prob(model, prompt: list[int], token: int) -> float:
    return torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1], -1)[token].item()


def _train(
    embedded_model_dir, teacher_messages, steps: int = 3, written=("Banana", "Apple"), opd_topk: int = 0
) -> tuple[tuple[float, float], ...]:
    """P(first answer token) of Banana and Apple, before and after `steps` OPD steps on the answers
    `written` (each twice a step)."""
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    prompt, teacher = _render(tokenizer, QUESTION), _render(tokenizer, teacher_messages)
    answers = [tokenizer.encode(text) + [tokenizer.eos_token_id] for text in ("Banana", "Apple")]
    cfg = TrainConfig(lr=5e-4, kl_coef=0.0, opd_topk=opd_topk, lora={"rank": 8, "alpha": 16})
    policy = build_policy(embedded_model_dir, cfg, "cpu")
    trained = [tokenizer.encode(text) + [tokenizer.eos_token_id] for text in written]
    before = tuple(_first_token_prob(policy.model, prompt, a[0]) for a in answers)
    for _ in range(steps):
        batch = [
            Sample(
                turn_id=f"t{i}",
                kind="opd",
                prompt_ids=prompt,
                response_ids=answer,
                logprobs=_behaviour(policy.model, prompt, answer),
                version="v0",
                temperature=1.0,
                hint=HINT,
                teacher_prompt_ids=teacher,
            )
            for i, answer in enumerate(trained * (4 // len(trained)))
        ]
        policy.trainer.step(batch)
    return before, tuple(_first_token_prob(policy.model, prompt, a[0]) for a in answers)


@pytest.fixture(autouse=True)
def one_thread():
    # This process may share the CPU with servers of other tests: an OpenMP team spinning on
    # every core then runs many times slower than one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_opd_raises_the_word_the_hint_names_over_the_others(embedded_model_dir):
    (banana_before, apple_before), (banana, apple) = _train(
        embedded_model_dir, enhanced_messages(QUESTION, HINT)
    )
    assert banana > 3 * banana_before, (banana_before, banana)
    # The hint makes any one-word fruit answer likelier, Apple too; Banana must gain far more.
    assert banana / apple > 3 * banana_before / apple_before, (banana_before, apple_before, banana, apple)


def test_opd_on_the_teachers_likeliest_tokens_raises_a_word_the_policy_never_wrote(embedded_model_dir):
    """Every answer is "Apple"; the hint names Banana. The sampled token's gap can only push "Apple"
    down (measured: Banana's first token 0.00045 -> 0.0001 in 8 steps); the teacher's 8 likeliest
    tokens at the first position include "Ban" (0.034 under the hint, 0.00045 without), and the
    forward KL towards them raises it (0.00045 -> 0.076 in 8 steps, train/topk.py)."""
    (banana_before, _), (banana, apple) = _train(
        embedded_model_dir, enhanced_messages(QUESTION, HINT), steps=8, written=("Apple",), opd_topk=8
    )
    assert banana > 20 * banana_before, (banana_before, banana)
    assert banana > apple, (banana, apple)  # now above the word every answer wrote
