"""The likelihood judge's pure parts: its prompts, calibration, votes, next-state hints, config."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from clawrl.config import JudgeConfig
from clawrl.judge.cases import CATEGORIES, REQUEST_CATEGORIES, load_cases, load_heldout
from clawrl.judge.cues import dissatisfaction
from clawrl.judge.likelihood import (
    REPLY_CHARS,
    TOOL_EXAMPLES,
    USER_EXAMPLES,
    content_free,
    cue_of,
    examples,
    next_state_hint,
    prompt,
    reading,
    reply_text,
)
from clawrl.judge.votes import judgment, state_hint_vote
from clawrl.testing import make_turn
from clawrl.types import Vote


def test_each_vote_has_its_own_prompt_with_four_examples_of_each_label():
    user = [examples(v, tool=False) for v in range(3)]
    for shots in user:
        assert sorted(label for _, label in shots) == [-1] * 4 + [1] * 4
        assert all(shot in USER_EXAMPLES for shot in shots)
    assert len({tuple(s) for s in user}) == 3  # the variants differ, so their votes can
    assert examples(1, tool=False) == examples(1, tool=False)  # and each is the same every time
    assert all(shot in TOOL_EXAMPLES for shot in examples(0, tool=True))


def test_the_prompt_ends_where_the_label_goes_and_tool_results_sit_beside_tool_results():
    text = prompt(0, "Nope,\n  it's 366.")
    assert text.endswith("Reply: Nope, it's 366.\nLabel:")
    assert "[tool " not in text
    tool = prompt(0, "[tool read_file] Error: no such file")
    assert tool.count("[tool ") == 1 + 8
    assert content_free("[tool x] y").startswith("[tool ") and content_free("hi") == "N/A"


def test_calibration_divides_out_what_the_prompt_says_of_a_content_free_reply():
    lp = {1: math.log(0.6), -1: math.log(0.4)}
    assert reading(0, lp, {1: math.log(0.5), -1: math.log(0.5)}).value == 1
    biased = {1: math.log(0.8), -1: math.log(0.2)}  # the prompt leans to "good" whatever the reply
    read = reading(2, lp, biased)
    assert read.value == -1 and math.isclose(sum(read.calibrated.values()), 1.0)
    assert "variant 2" in read.text() and "bad" in read.text()
    close = {1: math.log(0.52), -1: math.log(0.48)}
    assert reading(0, close, {1: math.log(0.5), -1: math.log(0.5)}).value == 0  # too close to call


@pytest.mark.parametrize(
    "reply",
    [
        "Too long. Just the number.",
        "can you get to the point",
        "the table formatting is all broken",
        "Not what I asked: I wanted the command.",
        "Way too formal for a text message.",
        "No, that's wrong.",
        "nope",
        "Never mind, I'll sort it out myself.",  # the eval personas' give-up
    ],
)
def test_complaints_about_form_and_corrections_carry_a_cue(reply):
    assert dissatisfaction(reply) is not None


@pytest.mark.parametrize(
    "reply",
    [
        "Thanks, short and clear.",
        "No problem, that works",
        "Write me a one-paragraph summary of Hamlet.",
        "Why is the sky blue?",
        "ok",
        "Perfect, thank you!",
    ],
)
def test_thanks_and_new_questions_carry_none(reply):
    assert dissatisfaction(reply) is None


def test_a_cue_leans_the_vote_to_bad_but_a_sure_good_reading_still_wins():
    even = {1: math.log(0.5), -1: math.log(0.5)}
    lean_good = {1: math.log(0.7), -1: math.log(0.3)}  # the likelihood alone says +1
    read = reading(0, lean_good, even, cue="length: too long")
    assert (read.plain, read.value) == (1, -1)
    assert "cue (length: too long)" in read.text() and read.calibrated[1] == pytest.approx(0.7)
    sure = {1: math.log(0.95), -1: math.log(0.05)}
    assert reading(0, sure, even, cue="length: too long").value == 1
    assert reading(0, lean_good, even).value == 1  # no cue, no lean
    assert cue_of("[tool sql] wrong syntax") is None and cue_of("wrong") is not None


def test_the_reply_names_tools_and_is_clipped():
    turn = make_turn(
        "t",
        "s",
        0,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}],
    )
    names = {"c1": "read_file"}
    state = [
        {"role": "tool", "tool_call_id": "c1", "content": "Error: no such file"},
        {"role": "user", "content": "hm"},
    ]
    assert reply_text(state, names) == "[tool read_file] Error: no such file hm"
    huge = reply_text([{"role": "user", "content": "x" * 100_000}], {})
    assert len(huge) < REPLY_CHARS + 100 and "characters cut" in huge
    assert reply_text([{"role": "user", "content": ""}], {}) == "(empty)"
    assert turn.tool_calls  # make_turn kept the call the tool result answers


def _prm(*values):
    return [Vote("prm", v, raw="r") for v in values]


def test_the_next_state_is_the_hint_when_the_votes_say_the_answer_failed():
    turn = make_turn("t", "s", 0, next_state=[{"role": "user", "content": "Wrong, it's 366. Fix it."}])
    vote = state_hint_vote(_prm(-1, -1, 0), turn)
    assert (
        vote.value == 1
        and vote.hint == "After a first answer to this, the user replied: Wrong, it's 366. Fix it."
    )
    j = judgment("t", "likelihood:base", [*_prm(-1, -1, 0), vote])
    assert j.score == -1 and j.hint == vote.hint
    assert state_hint_vote(_prm(1, 1, -1), turn).value == -1  # thanks teach no hint
    assert state_hint_vote([Vote("prm", None, error="x")] * 3, turn).hint is None
    assert next_state_hint([{"role": "tool", "content": "oops"}], {}).startswith("A first attempt")


def test_judge_modes_resolve_and_refuse_what_cannot_work():
    local = JudgeConfig()
    assert (local.judge_mode, local.hints_from, local.weights) == ("likelihood", "next_state", "base")
    remote = JudgeConfig(backend="openai", base_url="http://x/v1", model="m")
    assert (remote.judge_mode, remote.hints_from) == ("generate", "judge")
    with pytest.raises(ValidationError, match="likelihood"):
        JudgeConfig(backend="openai", base_url="http://x/v1", model="m", mode="likelihood")
    with pytest.raises(ValidationError, match="weights 'policy'"):
        JudgeConfig(mode="generate")
    assert JudgeConfig(mode="generate", weights="policy").hints_from == "judge"


def test_the_labelled_set_has_every_kind_of_next_state():
    cases = load_cases()
    assert len(cases) >= 120
    counts = {c: sum(case.category == c for case in cases) for c in CATEGORIES if c not in REQUEST_CATEGORIES}
    assert min(counts.values()) >= 5, counts
    assert {case.label for case in cases} == {-1, 0, 1}
    shown = {text for text, _ in USER_EXAMPLES + TOOL_EXAMPLES}
    assert not shown & {reply_text(c.next_state, {}) for c in cases}  # the prompt's examples are not graded


def test_the_held_out_set_is_apart_from_the_labelled_set_and_the_prompt():
    heldout = load_heldout()
    counts = {c: sum(case.category == c for case in heldout) for c in ("complaint", "correction", "thanks")}
    assert counts["complaint"] >= 20 and counts["correction"] >= 15 and counts["thanks"] >= 12
    replies = {reply_text(c.next_state, {}) for c in heldout}
    tuned = {reply_text(c.next_state, {}) for c in load_cases()} | {t for t, _ in USER_EXAMPLES}
    assert not replies & tuned
