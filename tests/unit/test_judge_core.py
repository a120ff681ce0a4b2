"""The judge's pure core: reply parsing, vote counting, hint selection, prompt rendering."""

from __future__ import annotations

from importlib.resources import files

import pytest

from clawrl.judge.parse import Unparseable, parse_hint, parse_prm
from clawrl.judge.prompts import MESSAGE_CHARS, judge_messages, next_role
from clawrl.judge.votes import hint_vote, judgment, majority, prm_vote, select_hint
from clawrl.types import Turn, Vote

# --- parse_prm -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("The user thanked the assistant and moved on.\n\\boxed{1}", 1),
        ("The user asked to redo it.\n\\boxed{-1}", -1),
        ("Unrelated follow-up, no signal.\n\\boxed{0}", 0),
        ("\\boxed{+1}", 1),
        ("\\boxed{ -1 }", -1),
        ("\\boxed{1.0}", 1),
        ("\\boxed{-1.0}", -1),
        ("\\boxed{\u22121}", -1),
        ("score: \\boxed {0}.", 0),
        # the last box counts: the judge quotes the format, then decides
        ("Options are \\boxed{1}, \\boxed{0} or \\boxed{-1}. The tool failed.\n\\boxed{-1}", -1),
        ("At first I thought \\boxed{-1}, but the user says thanks.\n\\boxed{1}", 1),
        ("<think>hmm</think>\nFinal answer: $\\boxed{1}$", 1),
    ],
)
def test_parse_prm_reads_the_last_box(text, score):
    assert parse_prm(text) == score


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no \\boxed"),
        ("The answer was good. Score: 1", "no \\boxed"),
        ("I cannot judge this.", "no \\boxed"),
        ("\\boxed{2}", "not one of"),
        ("\\boxed{good}", "not one of"),
        ("\\boxed{}", "not one of"),
        ("\\boxed{0.5}", "not one of"),
        ("\\boxed{1/1}", "not one of"),
        # a valid earlier box does not rescue a garbage last one
        ("\\boxed{1} ... on reflection \\boxed{positive}", "not one of"),
        ("The score is \\boxed{1", "no \\boxed"),
    ],
)
def test_parse_prm_rejects_replies_without_a_score(text, why):
    with pytest.raises(Unparseable, match=why.replace("\\", "\\\\")):
        parse_prm(text)


def test_unparseable_is_a_value_error():
    assert issubclass(Unparseable, ValueError)


# --- parse_hint ----------------------------------------------------------------------------------


def test_parse_hint_takes_the_decision_and_the_hint():
    reply = (
        "The user asked for no bullet points, so the answer's format was wrong.\n"
        "\\boxed{1}\n[HINT_START]\n  Answer in plain prose,\n   without bullet points.  \n[HINT_END]"
    )
    assert parse_hint(reply) == (1, "Answer in plain prose, without bullet points.")


def test_parse_hint_takes_the_last_hint_block():
    reply = (
        "I will write the hint between [HINT_START] and [HINT_END] markers.\n\\boxed{1}\n"
        "[HINT_START] Call read_file with an absolute path. [HINT_END]"
    )
    assert parse_hint(reply) == (1, "Call read_file with an absolute path.")


def test_parse_hint_accepts_the_block_before_the_decision():
    reply = "[HINT_START]Write the code in Python.[HINT_END]\n\\boxed{1}"
    assert parse_hint(reply) == (1, "Write the code in Python.")


def test_parse_hint_takes_the_rest_of_a_cut_off_hint():
    reply = (
        "The tool needed an absolute path.\n\\boxed{1}\n[HINT_START]\nPass /home/user/notes.txt, not notes"
    )
    assert parse_hint(reply) == (1, "Pass /home/user/notes.txt, not notes")


def test_parse_hint_stops_a_hint_without_end_marker_at_a_later_box():
    reply = "[HINT_START] State that the meeting is on Tuesday.\n\\boxed{1}"
    assert parse_hint(reply) == (1, "State that the meeting is on Tuesday.")


@pytest.mark.parametrize(
    "reply",
    [
        "The user just said thanks.\n\\boxed{-1}",
        "\\boxed{-1}\n[HINT_START]Something anyway.[HINT_END]",
        "[HINT_START]Maybe answer shorter.[HINT_END] On reflection, no real signal.\n\\boxed{ -1 }",
    ],
)
def test_parse_hint_minus_one_means_no_hint_whatever_else(reply):
    assert parse_hint(reply) == (-1, None)


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("There is hindsight here.\n\\boxed{1}", "without a hint"),
        ("\\boxed{1}\n[HINT_START]   \n[HINT_END]", "without a hint"),
        ("\\boxed{1}\n[HINT_START][HINT_END]", "without a hint"),
        ("[HINT_START]Answer in French.[HINT_END]", "no \\boxed"),
        ("I'm not sure.", "no \\boxed"),
        ("\\boxed{0}\n[HINT_START]Answer in French.[HINT_END]", "not one of"),
        ("\\boxed{yes}\n[HINT_START]Answer in French.[HINT_END]", "not one of"),
    ],
)
def test_parse_hint_rejects_replies_without_a_usable_decision(reply, why):
    with pytest.raises(Unparseable, match=why.replace("\\", "\\\\")):
        parse_hint(reply)


# --- votes ---------------------------------------------------------------------------------------


def prm(value):
    return Vote("prm", value, error=None if value is not None else "timeout")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1, 1, -1], 1),
        ([-1, -1, 1], -1),
        ([1, -1, None], 0),
        ([1, 0], 0),
        ([0, 0, 1], 0),
        ([None, None], 0),
        ([], 0),
        ([-1], -1),
        ([1, None, None], 1),
        ([1, 1, -1, -1, 0], 0),
        ([1, 1, -1, 0, 0], 0),
        ([-1, -1, 1, 0, None], -1),
    ],
)
def test_majority(values, expected):
    assert majority([prm(v) for v in values]) == expected


def test_majority_ignores_hint_votes():
    assert majority([prm(-1), Vote("hint", 1, hint="Answer in French please."), Vote("hint", 1)]) == -1


def hint(text, value=1):
    return Vote("hint", value, hint=text)


def test_select_hint_takes_the_longest_positive_hint():
    votes = [hint("Answer in French."), hint("Answer in French, in two sentences."), hint("Be brief now.")]
    assert select_hint(votes) == "Answer in French, in two sentences."


def test_select_hint_ignores_negative_failed_and_prm_votes():
    votes = [
        hint("A very long hint that a negative vote carried anyway.", value=-1),
        Vote("hint", None, hint="A long hint from a vote marked failed.", error="timeout"),
        Vote("prm", 1, hint="A long hint on a prm vote, which has none."),
        hint("Use an absolute path."),
    ]
    assert select_hint(votes) == "Use an absolute path."


def test_select_hint_needs_more_than_ten_characters_after_stripping():
    assert select_hint([hint("0123456789"), hint("   short.   "), hint(None)]) is None
    assert select_hint([hint("  0123456789a  ")]) == "0123456789a"


def test_select_hint_ties_go_to_the_first():
    assert select_hint([hint("Answer in French."), hint("Answer in German.")]) == "Answer in French."


def test_prm_vote_from_a_reply():
    vote = prm_vote("The user said thanks.\n\\boxed{1}", 0.5, None)
    assert vote == Vote("prm", 1, raw="The user said thanks.\n\\boxed{1}", latency_s=0.5)


def test_prm_vote_from_an_unparseable_reply_is_failed_and_keeps_the_text():
    vote = prm_vote("I think it was fine.", 0.25, None)
    assert vote.value is None and vote.raw == "I think it was fine." and vote.latency_s == 0.25
    assert vote.error.startswith("unparseable: ") and "boxed" in vote.error


def test_prm_vote_from_a_failed_call():
    vote = prm_vote(None, 30.0, "timeout after 30s")
    assert vote == Vote("prm", None, raw=None, latency_s=30.0, error="timeout after 30s")


def test_hint_votes():
    ok = hint_vote("\\boxed{1}\n[HINT_START]Answer in French.[HINT_END]", 1.0, None)
    assert (ok.kind, ok.value, ok.hint, ok.error) == ("hint", 1, "Answer in French.", None)
    none = hint_vote("No hindsight.\n\\boxed{-1}", 1.0, None)
    assert (none.value, none.hint, none.error) == (-1, None, None)
    bad = hint_vote("\\boxed{1} but I forgot the hint", 1.0, None)
    assert bad.value is None and bad.hint is None and bad.error.startswith("unparseable: ")
    assert bad.raw == "\\boxed{1} but I forgot the hint"
    failed = hint_vote(None, 2.0, "http 500")
    assert (failed.value, failed.raw, failed.error) == (None, None, "http 500")


def test_judgment_scores_by_majority_and_takes_the_hint():
    votes = [prm(1), prm(1), prm(-1), hint("Answer in French."), hint(None, value=-1)]
    j = judgment("chatcmpl-1", "openai:judge", votes)
    assert (j.turn_id, j.judge, j.votes, j.score, j.hint) == (
        "chatcmpl-1",
        "openai:judge",
        votes,
        1,
        "Answer in French.",
    )


def test_judgment_with_failed_votes_scores_zero_not_none():
    assert judgment("t", "openai:judge", [prm(None), prm(None)]).score == 0


def test_judgment_without_prm_votes_is_unscored():
    j = judgment("t", "openai:judge", [hint("Answer in plain prose.")])
    assert j.score is None and j.hint == "Answer in plain prose."


def test_explicit_feedback_overrides_the_votes():
    votes = [prm(1), prm(1), prm(1)]
    assert judgment("t", "feedback", votes, feedback_rating=-1).score == -1
    assert judgment("t", "feedback", [], feedback_rating=1).score == 1


def test_the_feedback_comment_beats_the_judges_hints():
    votes = [prm(1), hint("Answer in French, citing the three sources you relied on.")]
    assert judgment("t", "feedback", votes, -1, " Keep it shorter. ").hint == "Keep it shorter."
    # A comment too short to teach anything leaves the judge's hint.
    assert judgment("t", "feedback", votes, -1, "meh").hint == votes[1].hint
    assert judgment("t", "feedback", votes, -1, None).hint == votes[1].hint
    assert judgment("t", "feedback", [], 1, None).hint is None


def test_judgment_rejects_a_rating_outside_minus_one_to_one():
    with pytest.raises(ValueError, match="rating"):
        judgment("t", "feedback", [], feedback_rating=5)


# --- prompts -------------------------------------------------------------------------------------


def make_turn(messages, text="Here is the summary:\n- point one\n- point two", tool_calls=(), finish="stop"):
    return Turn(
        id="chatcmpl-1",
        session_id="s1",
        index=0,
        turn_type="main",
        messages=messages,
        tools=None,
        prompt_ids=[1, 2],
        response_ids=[3],
        logprobs=[-0.1],
        response_text=text,
        tool_calls=list(tool_calls),
        finish_reason=finish,
        versions=["v0"],
        temperature=1.0,
        created_at=0.0,
        finished_at=1.0,
    )


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'},
}


def user_prompt(kind, turn, next_state):
    messages = judge_messages(kind, turn, next_state)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert all(isinstance(m["content"], str) and m["content"] for m in messages)
    return messages[1]["content"]


def test_prm_prompt_shows_context_answer_next_state_and_the_scoring_rule():
    turn = make_turn([{"role": "user", "content": "Summarise the meeting notes."}])
    text = user_prompt("prm", turn, [{"role": "user", "content": "No bullet points please."}])
    assert "Summarise the meeting notes." in text
    assert "- point one\n- point two" in text
    assert "[user] No bullet points please." in text
    assert '<next_state role="user">' in text
    for box in ("\\boxed{1}", "\\boxed{0}", "\\boxed{-1}"):
        assert box in text
    assert "$" not in text  # every placeholder was filled


def test_hint_prompt_asks_for_a_hint_between_markers():
    turn = make_turn([{"role": "user", "content": "Summarise the meeting notes."}])
    text = user_prompt("hint", turn, [{"role": "user", "content": "No bullet points please."}])
    for marker in (
        "[HINT_START]",
        "[HINT_END]",
        "\\boxed{1}",
        "\\boxed{-1}",
        "[user] No bullet points please.",
    ):
        assert marker in text
    assert "$" not in text


def test_prompt_shows_tool_calls_and_tool_results_by_name():
    history = [
        {"role": "user", "content": "What do my notes say?"},
    ]
    turn = make_turn(history, text="", tool_calls=[CALL], finish="tool_calls")
    error = {"role": "tool", "tool_call_id": "call_1", "content": "Error: path must be absolute"}
    text = user_prompt("prm", turn, [error])
    assert 'read_file({"path": "notes.txt"})' in text
    assert "[tool: read_file] Error: path must be absolute" in text
    assert '<next_state role="tool">' in text


def test_next_role():
    assert next_role([{"role": "user", "content": "x"}]) == "user"
    assert next_role([{"role": "tool", "content": "x"}, {"role": "tool", "content": "y"}]) == "tool"
    assert next_role([{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}]) == "user and tool"


def test_prompt_truncates_long_messages_and_keeps_only_the_last_few():
    long = "A" * 5000 + "THE QUESTION AT THE END?"
    history = [{"role": "system", "content": "S" * 10_000}]
    history += [{"role": "user", "content": f"old message {i}"} for i in range(10)]
    history += [{"role": "user", "content": long}]
    turn = make_turn(history, text="B" * 20_000)
    text = user_prompt("prm", turn, [{"role": "user", "content": "C" * 9000}])
    assert "THE QUESTION AT THE END?" in text  # the tail of a clipped message survives
    assert "A" * (MESSAGE_CHARS + 1) not in text
    assert "C" * (MESSAGE_CHARS + 1) not in text
    assert "S" * 500 not in text  # system prompts are clipped harder
    assert "B" * 4001 not in text
    assert "characters cut" in text and "earlier messages omitted" in text
    assert "old message 0" not in text and "old message 9" in text
    assert len(text) < 15_000


def test_prompt_reads_content_as_string_parts_or_none():
    history = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}],
        },
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "file body"}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:..."}}]},
    ]
    turn = make_turn(history)
    text = user_prompt("hint", turn, [{"role": "user", "content": None}, {"role": "user", "content": "ok"}])
    assert "Part one.\nPart two." in text
    assert "[tool: read_file] file body" in text
    assert "[image_url]" in text
    assert "[user] ok" in text


def test_prompt_is_deterministic_and_does_not_touch_the_turn():
    history = [{"role": "user", "content": "hi"}]
    turn = make_turn(history, tool_calls=[CALL])
    next_state = [{"role": "user", "content": "thanks"}]
    assert judge_messages("prm", turn, next_state) == judge_messages("prm", turn, next_state)
    assert turn.messages == [{"role": "user", "content": "hi"}] and next_state == [
        {"role": "user", "content": "thanks"}
    ]


def test_prompt_needs_a_next_state_and_a_known_kind():
    turn = make_turn([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="next state"):
        judge_messages("prm", turn, [])
    with pytest.raises(ValueError, match="unknown judge kind"):
        judge_messages("reward", turn, [{"role": "user", "content": "x"}])


def test_templates_ship_inside_the_package():
    folder = files("clawrl.judge") / "prompts"
    for name in ("prm.txt", "hint.txt"):
        body = (folder / name).read_text(encoding="utf-8")
        for field in ("$context", "$answer", "$next_state", "$next_role"):
            assert field in body


def test_overlong_hint_is_unparseable():
    from clawrl.judge.parse import MAX_HINT_CHARS, Unparseable, parse_hint

    ok = "\\boxed{1}\n[HINT_START]" + "x" * MAX_HINT_CHARS + "[HINT_END]"
    assert parse_hint(ok)[0] == 1
    with pytest.raises(Unparseable, match="characters"):
        parse_hint("\\boxed{1}\n[HINT_START]" + "y " * MAX_HINT_CHARS)
