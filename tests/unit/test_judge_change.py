"""A next message that asks to change the answer just given reads as a complaint, whatever words it
uses; a new question, a thank-you, or thanks with a new task do not (clawrl/judge/change.py).

The phrasings here are the tests' own: requests.jsonl, the set the reading is measured on, is
kept apart from them (and from the labelled sets it was never tuned on)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest

from clawrl.judge.cases import load_cases, load_heldout, load_requests
from clawrl.judge.change import change_request
from clawrl.judge.likelihood import USER_EXAMPLES, cue_of, prompt, reading, reply_text, unquoted


@pytest.mark.parametrize(
    "reply",
    [
        "Could you write the distance in kilometres?",
        "can you put a blank line between the paragraphs",
        "Would you mind starting with the result?",
        "Please write that in Portuguese.",
        "Next time skip the greeting.",
        "From now on, answer with a table.",
        "I'd prefer it without emoji.",
        "Make it sound less like a robot.",
        "Use a numbered list for this.",
        "Cheers, but can you make the summary a bit longer?",
        "Could you give me more detail on the second step?",
        "Can you finish with a short summary line?",
        "Next time, sign off with your name.",
    ],
)
def test_a_request_to_change_the_answer_reads_as_one(reply):
    assert change_request(reply) is not None


@pytest.mark.parametrize(
    "reply",
    [
        "Could you tell me who wrote Hamlet?",
        "Can you recommend a burger place nearby?",
        "Thanks! Can you also convert 5 miles to km?",
        "Great. Could you do the same for the June invoice?",
        "What about the 2019 figures?",
        "Perfect, thank you.",
        "Next question: how tall is Everest?",
        "Write a haiku about autumn.",
        "Can you tell me more about Lisbon?",
    ],
)
def test_a_new_question_or_thanks_does_not(reply):
    assert change_request(reply) is None


def test_a_change_request_leans_the_vote_to_bad_as_a_cue_does():
    lean_good, even = {1: -0.3, -1: -1.2}, {1: -0.69, -1: -0.69}  # q(good) about 0.7 on its own
    cue = cue_of("Could you put the final figure in bold?")
    assert cue is not None and cue.startswith("change: ")
    assert reading(0, lean_good, even).value == 1
    assert reading(0, lean_good, even, cue=cue).value == -1
    assert cue_of("[tool format] could you make it a bit shorter") is None  # a tool result is no user


def test_the_requests_set_is_apart_from_the_other_sets_and_the_prompt():
    requests = load_requests()
    kinds = {
        c: sum(case.category == c for case in requests) for c in ("change_request", "new_question", "thanks")
    }
    assert len(requests) >= 40 and kinds["change_request"] >= 20 and kinds["new_question"] >= 8, kinds
    replies = {reply_text(c.next_state, {}) for c in requests}
    others = {reply_text(c.next_state, {}) for c in load_cases() + load_heldout()}
    assert not replies & (others | {t for t, _ in USER_EXAMPLES})


def test_quoted_words_are_what_was_or_should_be_written_not_the_users_verdict():
    # issue 53's signoff: the request quotes a thankful phrase, which the likelihood read as thanks
    request = "Could you end with 'Hope that helps!' like a friendly sign-off?"
    assert unquoted(request) == "Could you end with '...' like a friendly sign-off?"
    assert "Hope that helps" not in prompt(0, request) and prompt(0, request).endswith(
        "Reply: Could you end with '...' like a friendly sign-off?\nLabel:"
    )
    assert cue_of(request) is not None
    assert unquoted('You wrote "great" and \u201cgreat\u201d again') == "You wrote '...' and '...' again"
    assert unquoted("That's fine, it's what I'd do") == "That's fine, it's what I'd do"  # apostrophes
    # a cue inside a quotation is not the user's: a quoted complaint, a quoted request
    assert cue_of("How do I say 'the heater is broken' in Spanish?") is None
    assert cue_of('Great, "could you send someone" is exactly the right tone. Thanks!') is None
    assert cue_of("You wrote 'it is easy' twice, that's repetitive and too long.") is not None


def test_the_quoted_set_is_apart_from_the_other_sets_and_the_prompt():
    quoted = load_cases(Path(str(files("clawrl.judge") / "quoted.jsonl")))
    assert len(quoted) >= 18 and all(
        unquoted(reply_text(c.next_state, {})) != reply_text(c.next_state, {}) for c in quoted
    )
    replies = {reply_text(c.next_state, {}) for c in quoted}
    others = {reply_text(c.next_state, {}) for c in load_cases() + load_heldout() + load_requests()}
    assert not replies & (others | {t for t, _ in USER_EXAMPLES})
