"""Tests for clawrl.algo: judged turns to training samples, and the teacher's enhanced prompt."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from clawrl.algo import METHODS, get_method
from clawrl.algo.teacher import HINT_INTRO, HINT_PREFIX, enhanced_messages, teacher_prompt
from clawrl.chat.template import ChatRenderer
from clawrl.types import Judgment, Message, Sample, Turn, Vote

HINT = "Check the unit: the user asked for Fahrenheit."
GENERATION_PROMPT = "<|im_start|>assistant\n"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
HISTORY: list[Message] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "18C and sunny."},
    {"role": "user", "content": "And in Rome, in Fahrenheit?"},
]


@pytest.fixture(scope="module")
def renderer(smol_tokenizer: Any) -> ChatRenderer:
    return ChatRenderer(smol_tokenizer)


@pytest.fixture(scope="module")
def teacher(renderer: ChatRenderer):
    return teacher_prompt(renderer)


@pytest.fixture(scope="module")
def make_turn(smol_tokenizer: Any, renderer: ChatRenderer):
    def make(
        index: int = 0,
        messages: list[Message] | None = None,
        response: str = "Rome is 75F.",
        tools: list[dict[str, Any]] | None = None,
        **fields: Any,
    ) -> Turn:
        messages = HISTORY if messages is None else messages
        response_ids = smol_tokenizer.encode(response, add_special_tokens=False) if response else []
        values: dict[str, Any] = {
            "id": f"chatcmpl-{index}",
            "session_id": "s1",
            "index": index,
            "turn_type": "main",
            "messages": messages,
            "tools": tools,
            "prompt_ids": renderer.render(messages, tools).prompt_ids,
            "response_ids": response_ids,
            "logprobs": [-0.5 - i for i in range(len(response_ids))],
            "response_text": response,
            "tool_calls": [],
            "finish_reason": "stop",
            "versions": ["v3", "v4"],
            "temperature": 0.7,
            "created_at": 1.0,
            "finished_at": 2.0,
        }
        return Turn(**{**values, **fields})

    return make


def judged(turn: Turn, score: int | None = None, hint: str | None = None, id: int = 7) -> Judgment:
    votes = [Vote(kind="prm", value=score)] if score is not None else []
    return Judgment(turn_id=turn.id, judge="openai:test", votes=votes, score=score, hint=hint, id=id)


def kinds(samples: list[Sample]) -> list[str]:
    return [sample.kind for sample in samples]


def assert_copied(sample: Sample, turn: Turn, judgment: Judgment) -> None:
    assert sample.turn_id == turn.id
    assert sample.judgment_id == judgment.id
    assert sample.prompt_ids == turn.prompt_ids
    assert sample.response_ids == turn.response_ids
    assert sample.logprobs == turn.logprobs
    assert sample.version == "v3"  # the version that started the turn
    assert sample.temperature == 0.7
    assert sample.loss_mask is None and sample.status == "ready"


# ---- rl ----


@pytest.mark.parametrize("score", [1, -1])
def test_rl_trains_on_nonzero_scores_with_the_score_as_reward(make_turn, teacher, score):
    turn = make_turn()
    judgment = judged(turn, score=score, hint=HINT)
    [sample] = get_method("rl").samples(turn, judgment, teacher)
    assert sample.kind == "rl" and sample.reward == float(score)
    assert sample.hint is None and sample.teacher_prompt_ids is None
    assert_copied(sample, turn, judgment)


@pytest.mark.parametrize("score", [0, None])
def test_rl_skips_zero_and_unscored_turns(make_turn, teacher, score):
    turn = make_turn()
    assert get_method("rl").samples(turn, judged(turn, score=score, hint=HINT), teacher) == []


def test_samples_copy_the_turns_lists(make_turn, teacher):
    turn = make_turn()
    [sample] = get_method("rl").samples(turn, judged(turn, score=1), teacher)
    sample.response_ids.append(0)
    sample.logprobs.append(0.0)
    assert len(turn.response_ids) == len(turn.logprobs) == len(sample.response_ids) - 1


# ---- opd ----


def test_opd_trains_on_hinted_turns_with_the_enhanced_prompt(make_turn, teacher):
    turn = make_turn()
    judgment = judged(turn, score=0, hint=HINT)
    [sample] = get_method("opd").samples(turn, judgment, teacher)
    assert sample.kind == "opd" and sample.reward == 0.0 and sample.hint == HINT
    assert sample.teacher_prompt_ids == teacher(turn, HINT)
    assert_copied(sample, turn, judgment)


@pytest.mark.parametrize("hint", [None, ""])
def test_opd_skips_turns_without_an_accepted_hint(make_turn, teacher, hint):
    turn = make_turn()
    assert get_method("opd").samples(turn, judged(turn, score=1, hint=hint), teacher) == []


# ---- combine ----


@pytest.mark.parametrize(
    ("score", "hint", "expected"),
    [
        (1, HINT, [("opd", 1.0)]),
        (-1, HINT, [("opd", -1.0)]),
        (-1, None, [("rl", -1.0)]),
        (0, HINT, [("opd", 0.0)]),
        (None, HINT, [("opd", 0.0)]),
        (0, None, []),
    ],
)
def test_combine_gives_one_sample_per_turn_carrying_the_reward(make_turn, teacher, score, hint, expected):
    """A hinted turn: one opd sample with the PRM's reward (A = w_rl r + w_opd clip(gap)); else rl, r != 0."""
    turn = make_turn()
    samples = get_method("combine").samples(turn, judged(turn, score=score, hint=hint), teacher)
    assert [(s.kind, s.reward) for s in samples] == expected
    assert all((s.teacher_prompt_ids is not None) == (s.kind == "opd") for s in samples)


# ---- turns that never train ----


@pytest.mark.parametrize(
    "fields",
    [{"turn_type": "side"}, {"finish_reason": "abort"}, {"response": ""}],
    ids=["side", "aborted", "empty"],
)
@pytest.mark.parametrize("name", ["rl", "opd", "combine"])
def test_ineligible_turns_give_no_samples(make_turn, teacher, fields, name):
    turn = make_turn(**fields)
    judgment = judged(turn, score=1, hint=HINT)
    method = get_method(name)
    assert method.samples(turn, judgment, teacher) == []
    assert method.session_end([(turn, judged(turn, score=0))], emitted_rl=0) == []


# ---- the at-least-one guarantee ----


@pytest.mark.parametrize("name", ["rl", "combine"])
def test_an_all_zero_session_contributes_its_first_scored_turn(make_turn, name):
    side = make_turn(0, turn_type="side")
    unscored = make_turn(1)
    first = make_turn(2)
    later = make_turn(3)
    first_judgment = judged(first, score=0, id=12)
    scored = [
        (later, judged(later, score=0)),
        (side, judged(side, score=0)),
        (unscored, judged(unscored, hint=HINT)),
        (first, first_judgment),
    ]
    [sample] = get_method(name).session_end(scored, emitted_rl=0)
    assert sample.kind == "rl" and sample.reward == 0.0
    assert_copied(sample, first, first_judgment)


@pytest.mark.parametrize("name", ["rl", "combine"])
def test_a_session_with_an_rl_sample_or_no_scored_turn_adds_nothing(make_turn, name):
    turns = [make_turn(i) for i in range(3)]
    method = get_method(name)
    assert method.session_end([(t, judged(t, score=0)) for t in turns], emitted_rl=1) == []
    assert method.session_end([(t, judged(t, hint=HINT)) for t in turns], emitted_rl=0) == []
    assert method.session_end([], emitted_rl=0) == []


def test_opd_has_no_session_rule(make_turn):
    turn = make_turn()
    assert get_method("opd").session_end([(turn, judged(turn, score=0))], emitted_rl=0) == []


# ---- the enhanced prompt ----


def test_teacher_prompt_has_the_hint_at_the_end_of_the_last_user_message(smol_tokenizer, make_turn, teacher):
    turn = make_turn()
    (opd,) = get_method("combine").samples(turn, judged(turn, score=1, hint=HINT), teacher)
    assert opd.teacher_prompt_ids is not None and opd.teacher_prompt_ids != opd.prompt_ids
    student = smol_tokenizer.decode(opd.prompt_ids)
    text = smol_tokenizer.decode(opd.teacher_prompt_ids)
    last_user = f"<|im_start|>user\nAnd in Rome, in Fahrenheit?\n\n{HINT_PREFIX}{HINT}<|im_end|>\n"
    assert text.endswith(last_user + GENERATION_PROMPT)
    assert text.count(HINT) == 1 and HINT not in student
    # Everything before the last user message is unchanged.
    assert text.removesuffix(last_user + GENERATION_PROMPT) == student.rsplit("<|im_start|>user\n", 1)[0]
    # The teacher scores the very response the student produced.
    assert opd.response_ids == turn.response_ids
    assert opd.prompt_ids == turn.prompt_ids


def test_teacher_prompt_keeps_the_turns_tools(smol_tokenizer, make_turn, teacher):
    turn = make_turn(tools=[WEATHER_TOOL])
    text = smol_tokenizer.decode(teacher(turn, HINT))
    assert '"name": "get_weather"' in smol_tokenizer.decode(turn.prompt_ids)
    assert '"name": "get_weather"' in text and text.endswith(f"{HINT}<|im_end|>\n{GENERATION_PROMPT}")


def test_a_follow_up_teacher_prompt_is_the_conversation_as_it_went_on(smol_tokenizer, make_turn, renderer):
    """hint_placement 'follow_up': the served messages, the turn's answer, then the user's reply as
    the next user message (a next-state hint without its framing; any other hint as it is)."""
    turn = make_turn()
    follow_up = teacher_prompt(renderer, "follow_up")
    student = smol_tokenizer.decode(turn.prompt_ids)
    reply = "Could you give it in Celsius too?"
    text = smol_tokenizer.decode(follow_up(turn, HINT_INTRO["user"] + reply))
    answer = "<|im_start|>assistant\nRome is 75F.<|im_end|>\n"
    assert text == student.removesuffix(
        GENERATION_PROMPT
    ) + answer + f"<|im_start|>user\n{reply}<|im_end|>\n" + (GENERATION_PROMPT)
    assert HINT_PREFIX not in text and HINT_INTRO["user"] not in text
    assert smol_tokenizer.decode(follow_up(turn, HINT)).endswith(
        f"user\n{HINT}<|im_end|>\n{GENERATION_PROMPT}"
    )
    # The same turn's default teacher prompt keeps the hint inside the question.
    assert HINT_PREFIX + HINT in smol_tokenizer.decode(teacher_prompt(renderer)(turn, HINT))


def test_enhanced_messages_is_a_copy():
    before = copy.deepcopy(HISTORY)
    enhanced = enhanced_messages(HISTORY, HINT)
    assert before == HISTORY
    assert enhanced[:-1] == HISTORY[:-1]
    assert enhanced[-1] == {"role": "user", "content": f"And in Rome, in Fahrenheit?\n\n{HINT_PREFIX}{HINT}"}


def test_multi_part_content_gets_a_text_part_and_renders_like_a_string(renderer):
    parts = [{"type": "text", "text": "And in Rome,"}, {"type": "text", "text": "in Fahrenheit?"}]
    messages = [*HISTORY[:-1], {"role": "user", "content": parts}]
    enhanced = enhanced_messages(messages, HINT)
    assert enhanced[-1]["content"][:2] == parts and len(enhanced[-1]["content"]) == 3
    assert len(parts) == 2
    as_string = [*HISTORY[:-1], {"role": "user", "content": "And in Rome,\nin Fahrenheit?"}]
    assert (
        renderer.render(enhanced).prompt_ids == renderer.render(enhanced_messages(as_string, HINT)).prompt_ids
    )


def test_hint_goes_to_the_last_user_message_even_before_tool_results(smol_tokenizer, make_turn, teacher):
    messages: list[Message] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    ]
    text = smol_tokenizer.decode(teacher(make_turn(messages=messages, tools=[WEATHER_TOOL]), HINT))
    assert f"Weather in Paris?\n\n{HINT_PREFIX}{HINT}<|im_end|>" in text
    assert text.endswith(f"<tool_response>\n18C\n</tool_response><|im_end|>\n{GENERATION_PROMPT}")


def test_a_history_without_user_messages_gets_the_hint_as_a_new_user_message(
    smol_tokenizer, make_turn, teacher
):
    messages: list[Message] = [{"role": "system", "content": "Summarise the day."}]
    assert enhanced_messages(messages, HINT) == [*messages, {"role": "user", "content": HINT_PREFIX + HINT}]
    text = smol_tokenizer.decode(teacher(make_turn(messages=messages), HINT))
    assert text.endswith(f"<|im_start|>user\n{HINT_PREFIX}{HINT}<|im_end|>\n{GENERATION_PROMPT}")


def test_an_empty_user_message_gets_just_the_hint():
    enhanced = enhanced_messages([{"role": "user", "content": None}], HINT)
    assert enhanced == [{"role": "user", "content": HINT_PREFIX + HINT}]


# ---- the registry ----


def test_registry_names_and_needs():
    assert list(METHODS) == ["rl", "opd", "combine", "grpo"]
    assert all(get_method(name).name == name for name in METHODS)
    combine, rl, opd = get_method("combine"), get_method("rl"), get_method("opd")
    assert combine.wants_prm and combine.wants_hint
    assert rl.wants_prm and not rl.wants_hint
    assert opd.wants_hint and not opd.wants_prm
    grpo = get_method("grpo")
    assert not grpo.wants_prm and not grpo.wants_hint  # the judge is asked nothing by default


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(KeyError, match="ppo") as error:
        get_method("ppo")
    assert all(name in str(error.value) for name in ("rl", "opd", "combine", "grpo"))


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("score", [-1, 0, 1])
@pytest.mark.parametrize("hinted", [False, True])
def test_per_rating_counts_the_samples_a_judged_turn_gives(name, score, hinted, make_turn, teacher):
    """What a client pacing its ratings counts (clawrl/eval/pacing.py) is what the method makes."""
    method = get_method(name)
    turn = make_turn()
    made = method.samples(turn, judged(turn, score, HINT if hinted else None), teacher)
    assert len(made) == method.per_rating(score, hinted)
