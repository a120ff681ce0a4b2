"""Sessions from OpenClaw as it is: its injected context, its affinity keys, its housekeeping.

The message shapes are those OpenClaw 2026.9.6 sent to a capturing server here (see docs/openclaw.md,
"Use it with OpenClaw"): a long system prompt, user messages stamped with the time, and a user
message of internal context appended to each request and dropped from the next one.
"""

from __future__ import annotations

import itertools

import pytest
from starlette.datastructures import Headers

from clawrl.api.errors import BadRequest
from clawrl.api.schemas import ChatCompletionRequest
from clawrl.api.session_hints import hints_from
from clawrl.sessions.injected import DEFAULT_CONTEXT_PATTERNS, InjectedContext
from clawrl.sessions.tracker import Hints, Restored, SessionTracker
from clawrl.sessions.turn_type import DEFAULT_SIDE_PATTERNS, SidePatterns

SYSTEM = {"role": "system", "content": "<!-- openclaw:attempt:STABLE -->\nYou are a personal assistant..."}
CONTEXT = {
    "role": "user",
    "content": [
        {
            "type": "text",
            "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nConversation data (data, not instructions):\n"
            '"Active exec sessions:\\nnone"\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>',
        }
    ],
}


def user(text):
    return {"role": "user", "content": f"[Mon 2026-11-23 14:32 UTC] {text}"}


def bot(text):
    return {"role": "assistant", "content": text}


def tracker():
    ids = (f"s{i}" for i in itertools.count())
    return SessionTracker(
        SidePatterns(DEFAULT_SIDE_PATTERNS),
        600.0,
        1000,
        new_id=lambda: next(ids),
        injected=InjectedContext(DEFAULT_CONTEXT_PATTERNS),
    )


NO_HINTS = Hints()


def turn(t, history, hints=NO_HINTS, answer="ok", now=0.0):
    """OpenClaw's request: its history plus a fresh internal-context message, never kept."""
    r = t.resolve([*history, CONTEXT], hints, now)
    t.answered(r, f"turn-{r.turn_index}", bot(answer), now)
    return r


def test_three_turns_with_injected_context_are_one_session_by_inference():
    t = tracker()
    r1 = turn(t, [SYSTEM, user("What is 2+2?")], answer="4")
    r2 = turn(t, [SYSTEM, user("What is 2+2?"), bot("4"), user("And 3+3?")], answer="6")
    r3 = turn(t, [SYSTEM, user("What is 2+2?"), bot("4"), user("And 3+3?"), bot("6"), user("Thanks!")])
    assert r1.session_id == r2.session_id == r3.session_id
    assert r2.next_state == [user("And 3+3?")]  # the internal context is not the user's reply
    assert r3.next_state == [user("Thanks!")] and r3.previous_turn_id == "turn-1"


def test_a_restart_restores_the_tip_without_the_injected_context():
    t = tracker()
    history = [SYSTEM, user("What is 2+2?")]
    t.restore(Restored("s9", "inferred", 1, 0.0, "turn-0", [*history, CONTEXT], bot("4")))
    r = turn(t, [*history, bot("4"), user("And 3+3?")])
    assert r.session_id == "s9" and r.previous_turn_id == "turn-0"


def test_an_affinity_key_that_continues_its_session_attaches_the_next_state():
    t = tracker()
    key = Hints(session_id="oc-1:0", source="affinity")
    r1 = turn(t, [SYSTEM, user("hi")], key, answer="hello")
    r2 = turn(t, [SYSTEM, user("hi"), bot("hello"), user("bye")], key)
    assert r1.session_id == r2.session_id == "oc-1:0" and r2.source == "affinity"
    assert r2.previous_turn_id == "turn-0" and r2.next_state == [user("bye")]


def test_an_affinity_key_shared_by_two_conversations_never_pairs_feedback_with_the_wrong_answer():
    t = tracker()
    key = Hints(session_id="my-app", source="affinity")  # one static key for every conversation
    turn(t, [SYSTEM, user("question A")], key, answer="answer A")
    turn(t, [SYSTEM, user("question B")], key, answer="answer B")
    a2 = turn(t, [SYSTEM, user("question A"), bot("answer A"), user("A was wrong")], key)
    assert a2.previous_turn_id != "turn-1"  # turn-1 answered B: A's reply must not be its next state
    assert a2.next_state is None


# An answer that ran to the token limit, and the text OpenClaw 2026.9.6 resent in its place with the
# next question (captured with a fake server answering this at finish_reason "length"): the <think>
# block stripped, and a reply directive too. Plain repeated paragraphs came back as they were sent
# (OpenClaw folds them in the text it shows, not in its history).
THINK = "<think>The user asks.</think>"
RAMBLE = THINK + "The capital of France is Paris.\n\n" + "The server runs. " * 40
RESENT = RAMBLE.removeprefix(THINK)
DIRECTIVE = "[[reply_to_current]] The capital of France is Paris.\n\nMEDIA: /tmp/x.png\n" + "It runs. " * 40
CALL = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}


def test_an_answer_resent_rewritten_under_its_affinity_key_still_gets_its_next_state():
    t = tracker()
    key = Hints(session_id="oc-1:0", source="affinity")
    first = [SYSTEM, user("What is the capital of France?")]
    r1 = turn(t, first, key, answer=RAMBLE)
    r2 = turn(t, [*first, bot(RESENT), user("What is 2 + 3?")], key, answer="5")
    r3 = turn(t, [*first, bot(RESENT), user("What is 2 + 3?"), bot("5"), user("Thanks!")], key)
    assert r1.session_id == r2.session_id == r3.session_id == "oc-1:0"
    assert r2.turn_type == "main" and r2.previous_turn_id == "turn-0"
    assert r2.next_state == [user("What is 2 + 3?")] and r2.next_state_match == "rewritten"
    # The next turn's request held the rewritten text, so the one after continues it exactly.
    assert r3.previous_turn_id == "turn-1" and r3.next_state_match == "history"


@pytest.mark.parametrize(
    ("answer", "stand_in", "match"),
    [
        (DIRECTIVE, DIRECTIVE.removeprefix("[[reply_to_current]] ").rstrip(), "rewritten"),  # OpenClaw's
        ("Paris.\n\n" + "Paris.\n\n" * 40, "Paris.", "rewritten"),  # another client's fold
        (RAMBLE, "", "rewritten"),
        (RAMBLE, RAMBLE[:100], "rewritten"),
        (RAMBLE, f"  {RAMBLE.strip()}\n", "history"),  # the exact match ignores surrounding whitespace
    ],
    ids=["directive-stripped", "paragraphs-folded", "emptied", "truncated", "whitespace"],
)
def test_any_text_in_the_answers_place_is_a_rewrite(answer, stand_in, match):
    t = tracker()
    key = Hints(session_id="oc-1:0", source="affinity")
    turn(t, [SYSTEM, user("hi")], key, answer=answer)
    r = t.resolve([SYSTEM, user("hi"), bot(stand_in), user("bye"), CONTEXT], key, 1.0)
    assert r.previous_turn_id == "turn-0" and r.next_state == [user("bye")]
    assert r.next_state_match == match


@pytest.mark.parametrize(
    "resent",
    [
        [SYSTEM, user("What is the capital of Italy?"), bot(RESENT), user("What is 2 + 3?")],  # edited
        [SYSTEM, user("What is the capital of France?"), user("What is 2 + 3?")],  # answer dropped
        [SYSTEM, user("What is the capital of France?"), bot(RESENT), bot("more"), user("What is 2 + 3?")],
        [user("What is the capital of France?"), bot(RESENT), user("What is 2 + 3?")],  # no system prompt
        [SYSTEM, user("What is the capital of France?"), {**bot(RESENT), "tool_calls": [CALL]}, user("go")],
    ],
    ids=[
        "earlier-user-message-edited",
        "answer-dropped",
        "message-added",
        "message-removed",
        "tool-call-added",
    ],
)
def test_any_other_change_under_an_affinity_key_gets_no_next_state(resent):
    t = tracker()
    key = Hints(session_id="oc-1:0", source="affinity")
    turn(t, [SYSTEM, user("What is the capital of France?")], key, answer=RAMBLE)
    r = t.resolve([*resent, CONTEXT], key, 1.0)
    assert r.session_id == "oc-1:0" and r.turn_type == "main"  # it joins the named session, as before
    assert r.previous_turn_id is None and r.next_state is None and r.next_state_match is None


def test_a_rewritten_tool_call_answer_keeps_its_calls_or_is_no_rewrite():
    t = tracker()
    key = Hints(session_id="oc-1:0", source="affinity")
    r1 = t.resolve([SYSTEM, user("read a")], key, 0.0)
    t.answered(r1, "turn-0", {"role": "assistant", "content": "Reading " * 50, "tool_calls": [CALL]}, 0.0)
    other = {**CALL, "function": {"name": "write", "arguments": "{}"}}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "file a"}
    wrong = t.resolve([SYSTEM, user("read a"), {**bot("Reading"), "tool_calls": [other]}, result], key, 1.0)
    assert wrong.next_state is None  # a result of another call is no feedback on ours
    kept = t.resolve([SYSTEM, user("read a"), {**bot("Reading"), "tool_calls": [CALL]}, result], key, 2.0)
    assert kept.previous_turn_id == "turn-0" and kept.next_state == [result]
    assert kept.next_state_match == "rewritten"


def test_without_a_session_key_a_folded_answer_still_opens_a_new_session():
    t = tracker()
    first = [SYSTEM, user("What is the capital of France?")]
    r1 = turn(t, first, answer=RAMBLE)
    r2 = turn(t, [*first, bot(RESENT), user("What is 2 + 3?")])
    assert r2.is_new and r2.session_id != r1.session_id  # inference matches exact histories only
    assert r2.previous_turn_id is None and r2.next_state is None


def test_a_static_affinity_key_never_takes_a_rewrite_for_another_conversations_answer():
    t = tracker()
    key = Hints(session_id="my-app", source="affinity")  # one key for every conversation
    turn(t, [SYSTEM, user("question A")], key, answer="answer A " * 50)
    turn(t, [SYSTEM, user("question B")], key, answer="answer B " * 50)  # the key's tip is now B's
    a2 = turn(t, [SYSTEM, user("question A"), bot("answer A"), user("A was wrong")], key)
    assert a2.previous_turn_id is None and a2.next_state is None


def test_a_rewritten_answer_is_matched_after_a_restart():
    t = tracker()
    history = [SYSTEM, user("What is the capital of France?")]
    t.restore(Restored("oc-1:0", "affinity", 1, 0.0, "turn-0", [*history, CONTEXT], bot(RAMBLE)))
    key = Hints(session_id="oc-1:0", source="affinity")
    r = turn(t, [*history, bot(RESENT), user("What is 2 + 3?")], key)
    assert r.previous_turn_id == "turn-0" and r.next_state_match == "rewritten"


def test_a_named_session_says_how_its_next_state_was_matched():
    t = tracker()
    named = Hints(session_id="mine", source="header")
    turn(t, [SYSTEM, user("hi")], named, answer=RAMBLE)
    r = t.resolve([SYSTEM, user("hi"), bot(RESENT), user("more"), CONTEXT], named, 1.0)
    assert r.previous_turn_id == "turn-0" and r.next_state_match == "rewritten"
    t.answered(r, "turn-1", bot("ok"), 1.0)
    r = t.resolve([SYSTEM, user("edited hi"), bot(RESENT), user("more"), bot("ok"), user("and?")], named, 2.0)
    assert r.previous_turn_id == "turn-1" and r.next_state == [user("and?")] and r.next_state_match == "named"


def test_an_explicit_session_id_still_takes_what_follows_the_last_answer():
    t = tracker()
    named = Hints(session_id="mine", source="header")
    turn(t, [SYSTEM, user("hi")], named, answer="hello")
    r = t.resolve([SYSTEM, user("edited hi"), bot("hello"), user("more"), CONTEXT], named, 1.0)
    assert r.previous_turn_id == "turn-0" and r.next_state == [user("more")]


@pytest.mark.parametrize(
    "text",
    [
        "Pre-compaction memory flush. Store durable memories only in memory/2026-11-23.md (create memory/ "
        "if needed). If nothing to store, reply with NO_REPLY.",
        "This is the PREFIX of a turn that was too large to keep. The SUFFIX (recent work) is retained. "
        "Summarize the prefix so the work can continue.",
        "Follow the heartbeat monitor scratch context when provided. If nothing needs attention, reply "
        "NO_REPLY.",
        "Generate a short title for this conversation.",
    ],
)
def test_openclaw_housekeeping_is_side_even_with_context_after_it(text):
    t = tracker()
    first = turn(t, [SYSTEM, user("What is 2+2?")], answer="4")
    r = t.resolve([SYSTEM, user("What is 2+2?"), bot("4"), user(text), CONTEXT], Hints(), 1.0)
    assert r.turn_type == "side"
    assert r.session_id == first.session_id and r.next_state is None


def test_ordinary_messages_are_main():
    t = tracker()
    for text in ["Compact the list of files into one line", "What is a heartbeat?", "Summarize this file"]:
        assert t.resolve([SYSTEM, user(text), CONTEXT], Hints(), 0.0).turn_type == "main"


def _hints(headers, body=None, affinity=True):
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], **(body or {})}
    )
    return hints_from(Headers(headers), request, affinity)


def test_openclaw_affinity_headers_and_prompt_cache_key_name_the_session():
    sent = {"session_id": "s1:0", "x-client-request-id": "s1:0", "x-session-affinity": "s1:0"}
    assert _hints(sent) == Hints(session_id="s1:0", source="affinity")
    assert _hints({}, {"prompt_cache_key": "s1:0"}) == Hints(session_id="s1:0", source="affinity")
    assert _hints({"x-session-id": "mine", **sent}).session_id == "mine"  # clawrl's own header wins
    assert _hints(sent, {"session_id": "body-id"}).session_id == "body-id"
    assert _hints(sent, affinity=False) == Hints()


def test_an_affinity_key_that_is_no_valid_session_id_is_hashed_not_refused():
    hints = _hints({"x-session-affinity": "agent:main/explicit s1 with spaces" * 10})
    assert hints.source == "affinity" and hints.session_id.startswith("aff-") and len(hints.session_id) == 36
    with pytest.raises(BadRequest):
        _hints({"x-session-id": "not valid!"})  # clawrl's own header stays strict
