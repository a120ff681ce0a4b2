"""Session resolution, turn typing and next-state pairing (pure logic)."""

from __future__ import annotations

import itertools

import pytest

from clawrl.sessions.messages import canonical
from clawrl.sessions.tracker import Hints, Restored, SessionTracker
from clawrl.sessions.turn_type import DEFAULT_SIDE_PATTERNS, SidePatterns
from clawrl.testing import make_turn

SYS = {"role": "system", "content": "You are helpful."}


def user(text):
    return {"role": "user", "content": text}


def bot(text):
    return {"role": "assistant", "content": text}


def tracker(idle=600.0, cap=1000):
    ids = (f"s{i}" for i in itertools.count())
    return SessionTracker(SidePatterns(DEFAULT_SIDE_PATTERNS), idle, cap, new_id=lambda: next(ids))


class Client:
    """Plays a client that resends its whole history, as OpenAI clients do."""

    def __init__(self, t, *first, hints=None):
        self.t, self.messages, self.hints, self.n = t, list(first), hints or Hints(), 0

    def send(self, now=0.0, answer=None, hints=None):
        r = self.t.resolve(list(self.messages), hints or self.hints, now)
        self.n += 1
        reply = bot(answer or f"answer {self.n} of {id(self)}")
        self.t.answered(r, f"turn-{r.session_id}-{r.turn_index}", reply, now)
        self.messages.append(reply)
        return r

    def say(self, *msgs):
        self.messages.extend(msgs)
        return self


def test_three_turns_without_headers_are_one_session_with_next_states():
    t = tracker()
    c = Client(t, SYS, user("hi"))
    r1 = c.send()
    r2 = c.say(user("tell me more")).send()
    r3 = c.say(user("no, that's wrong")).send()
    assert r1.is_new and not r2.is_new and not r3.is_new
    assert r1.session_id == r2.session_id == r3.session_id
    assert [r.turn_index for r in (r1, r2, r3)] == [0, 1, 2]
    assert [r.turn_type for r in (r1, r2, r3)] == ["main"] * 3
    assert r1.previous_turn_id is None and r1.next_state is None
    assert r2.previous_turn_id == f"turn-{r1.session_id}-0" and r2.next_state == [user("tell me more")]
    assert r3.previous_turn_id == f"turn-{r1.session_id}-1" and r3.next_state == [user("no, that's wrong")]


def test_interleaved_clients_stay_apart():
    t = tracker()
    a, b = Client(t, SYS, user("weather?")), Client(t, SYS, user("recipe?"))
    ra = [a.send(), None, None]
    rb = [b.send(), None, None]
    for i in (1, 2):
        rb[i] = b.say(user(f"b{i}")).send()
        ra[i] = a.say(user(f"a{i}")).send()
    assert len({r.session_id for r in ra}) == 1 and len({r.session_id for r in rb}) == 1
    assert ra[0].session_id != rb[0].session_id
    assert ra[2].next_state == [user("a2")] and rb[2].next_state == [user("b2")]


def test_identical_openings_from_two_clients_get_two_sessions():
    t = tracker()
    a, b = Client(t, SYS, user("hi")), Client(t, SYS, user("hi"))
    ra, rb = a.send(answer="Hello!"), b.send(answer="Hello!")  # greedy: same answer
    assert ra.session_id != rb.session_id
    ra2 = a.say(user("from a")).send()
    rb2 = b.say(user("from b")).send()
    # Each continuation takes one of the two identical tips; neither opens a new session.
    assert {ra2.session_id, rb2.session_id} == {ra.session_id, rb.session_id}
    assert {ra2.previous_turn_id, rb2.previous_turn_id} == {
        f"turn-{ra.session_id}-0",
        f"turn-{rb.session_id}-0",
    }


def test_edited_or_truncated_history_starts_a_new_session():
    t = tracker()
    c = Client(t, SYS, user("first"))
    r1 = c.send()
    c.say(user("second")).send()
    edited = t.resolve([SYS, user("first"), bot("something else"), user("again")], Hints(), 1.0)
    compacted = t.resolve([SYS, user("Summary so far: ..."), user("next")], Hints(), 1.0)
    assert edited.is_new and compacted.is_new
    assert len({edited.session_id, compacted.session_id, r1.session_id}) == 3
    assert edited.next_state is None and compacted.next_state is None


def test_branch_from_an_earlier_answer_is_a_new_session():
    t = tracker()
    c = Client(t, SYS, user("q1"))
    c.send(answer="a1")
    c.say(user("q2")).send(answer="a2")
    branch = t.resolve([SYS, user("q1"), bot("a1"), user("q2 but different")], Hints(), 1.0)
    assert branch.is_new and branch.previous_turn_id is None


def test_echoed_answer_variants_still_continue():
    t = tracker()
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    r1 = t.resolve([user("go")], Hints(), 0)
    t.answered(r1, "t1", {"role": "assistant", "content": None, "tool_calls": [call]}, 0)
    echoed = {
        "role": "assistant",
        "content": "",
        "refusal": None,
        "tool_calls": [{**call, "id": "other", "function": {"name": "f", "arguments": '{ "a":1 }'}}],
    }
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    r2 = t.resolve([user("go"), echoed, tool], Hints(), 1)
    assert r2.session_id == r1.session_id and r2.next_state == [tool]
    assert canonical({"role": "developer", "content": [{"type": "text", "text": "x"}]}) == canonical(
        {"role": "system", "content": "x"}
    )


@pytest.mark.parametrize(
    "resent",
    [{}, {"reasoning_content": "Hi means hello."}, {"reasoning": "Hi means hello."}, {"reasoning": None}],
)
def test_an_answer_with_reasoning_pairs_when_the_client_resends_its_content_only(resent):
    """Turn 1 thought before it answered (clawrl/chat/reasoning.py); its answer message is the content
    the client got. Qwen3's template and OpenClaw drop the think block from the history they resend;
    other clients keep the reasoning in a field: either way the next user message is turn 1's next
    state, by inference, no session named."""
    t = tracker()
    r1 = t.resolve([SYS, user("hi")], Hints(), 0)
    turn = make_turn("t1", r1.session_id, response_text="Hello!", reasoning="Hi means hello.", tool_calls=[])
    t.answered(r1, turn.id, turn.answer_message(), 0)
    assert turn.answer_message() == bot("Hello!")
    r2 = t.resolve([SYS, user("hi"), {**bot("Hello!"), **resent}, user("thanks")], Hints(), 1)
    assert r2.session_id == r1.session_id and r2.previous_turn_id == "t1"
    assert r2.next_state == [user("thanks")] and r2.next_state_match == "history"


def test_an_answer_resent_with_its_think_block_inline_is_a_rewrite_in_a_named_session():
    t = tracker()
    hints = Hints(session_id="oc-1", source="affinity")
    r1 = t.resolve([SYS, user("hi")], hints, 0)
    t.answered(r1, "t1", bot("Hello!"), 0)
    inline = bot("<think>\nHi means hello.\n</think>\n\nHello!")
    r2 = t.resolve([SYS, user("hi"), inline, user("thanks")], hints, 1)
    assert r2.previous_turn_id == "t1" and r2.next_state_match == "rewritten"


def test_header_beats_body_beats_inference():
    t = tracker()
    c = Client(t, SYS, user("hi"))
    r1 = c.send()
    named = t.resolve(c.messages + [user("next")], Hints(session_id="mine", source="header"), 1)
    assert named.session_id == "mine" and named.source == "header" and named.is_new
    assert named.previous_turn_id is None  # a new named session has no earlier turn
    again = t.resolve(c.messages + [user("next")], Hints(), 2)
    assert again.session_id == r1.session_id and again.previous_turn_id is not None


def test_named_session_pairs_even_when_history_was_rewritten():
    t = tracker()
    hints = Hints(session_id="agent-7", source="body")
    r1 = t.resolve([SYS, user("task")], hints, 0)
    t.answered(r1, "t1", bot("done"), 0)
    # The agent compacted its history but names the session: the trailing new messages are the next state.
    r2 = t.resolve([SYS, user("summary"), bot("done"), user("thanks")], hints, 1)
    assert r2.session_id == "agent-7" and r2.previous_turn_id == "t1" and r2.next_state == [user("thanks")]


@pytest.mark.parametrize(
    "text",
    [
        "Generate a concise title for this conversation.",
        "Please summarize the conversation above in 3 bullet points.",
        "Compact the conversation history into a memory note.",
        "HEARTBEAT",
    ],
)
def test_side_patterns_mark_side_turns_that_do_not_take_the_tip(text):
    t = tracker()
    c = Client(t, SYS, user("hi"))
    r1 = c.send()
    side = t.resolve(c.messages + [user(text)], Hints(), 1)
    assert side.turn_type == "side" and side.session_id == r1.session_id
    assert side.next_state is None and side.previous_turn_id is None
    t.answered(side, "side-turn", bot("A title"), 1)
    main = c.say(user("real follow-up")).send(now=2)
    assert main.session_id == r1.session_id and main.previous_turn_id == f"turn-{r1.session_id}-0"


def test_explicit_turn_type_wins_over_patterns():
    t = tracker()
    assert t.resolve([user("Generate a title for this chat")], Hints(turn_type="main"), 0).turn_type == "main"
    assert t.resolve([user("hello")], Hints(turn_type="side"), 0).turn_type == "side"


def test_tool_results_are_next_states():
    t = tracker()
    c = Client(t, user("list files"))
    c.send()
    results = [
        {"role": "tool", "tool_call_id": "a", "content": "x.txt"},
        {"role": "tool", "tool_call_id": "b", "content": "y.txt"},
    ]
    r = c.say(*results).send()
    assert r.next_state == results


def test_abandoned_request_gives_the_tip_back():
    t = tracker()
    c = Client(t, user("q"))
    r1 = c.send()
    retry = c.messages + [user("follow")]
    failed = t.resolve(retry, Hints(), 1)
    t.abandon(failed)
    again = t.resolve(retry, Hints(), 2)
    assert again.session_id == r1.session_id and again.previous_turn_id == failed.previous_turn_id


def test_idle_sessions_expire_and_memory_stays_bounded():
    t = tracker(idle=10.0, cap=100)
    for i in range(1000):
        t.resolve([user(f"abandoned {i}")], Hints(), now=float(i) / 100)
    assert len(t) == 100  # the cap holds while they are recent
    ended = t.expire(now=5.0)
    assert len(ended) == 900 and {reason for _, reason in ended} == {"evicted"}
    assert len(t.expire(now=100.0)) == 100 and len(t) == 0


def test_done_and_end():
    t = tracker()
    r = t.resolve([user("bye")], Hints(done=True), 0)
    assert r.done
    assert t.end(r.session_id) and not t.end(r.session_id)


def test_restore_after_restart_continues_the_session():
    t = tracker()
    t.restore(
        Restored(
            "sess-old",
            "inferred",
            turn_count=2,
            last_active=5.0,
            last_turn_id="t-1",
            messages=[SYS, user("q1"), bot("a1"), user("q2")],
            answer=bot("a2"),
        )
    )
    r = t.resolve([SYS, user("q1"), bot("a1"), user("q2"), bot("a2"), user("q3")], Hints(), 6.0)
    assert r.session_id == "sess-old" and r.turn_index == 2 and r.previous_turn_id == "t-1"
    assert r.next_state == [user("q3")]


def test_inference_never_joins_two_users_conversations():
    """Bob sends exactly what continues Alice's conversation (her history and the answer she got): it
    opens a session of his own, and Alice's answer gets no next state from him (docs/users.md)."""
    t = tracker()
    alice = Client(t, SYS, user("hi"), hints=Hints(user="alice"))
    a1 = alice.send(answer="hello")
    bob = Client(t, SYS, user("hi"), bot("hello"), user("tell me more"), hints=Hints(user="bob"))
    b1 = bob.send()
    assert b1.is_new and b1.session_id != a1.session_id and b1.user == "bob"
    assert b1.previous_turn_id is None and b1.next_state is None
    a2 = alice.say(user("tell me more")).send()  # Alice's own continuation still finds her session
    assert a2.session_id == a1.session_id and a2.user == "alice"
    assert a2.previous_turn_id == f"turn-{a1.session_id}-0"


def test_a_restored_session_keeps_its_user():
    t = tracker()
    hello = bot("hello")
    t.restore(Restored("s-old", "inferred", 1, 0.0, "turn-0", [SYS, user("hi")], hello, user="alice"))
    r = t.resolve([SYS, user("hi"), hello, user("more")], Hints(user="bob"), 1.0)
    assert r.is_new and r.user == "bob"
    r = t.resolve([SYS, user("hi"), hello, user("more")], Hints(user="alice"), 1.0)
    assert r.session_id == "s-old" and r.previous_turn_id == "turn-0"


def test_a_forgotten_users_sessions_are_never_continued_and_the_others_are():
    """Erasing a user while serving (docs/users.md) forgets their open sessions: their next request
    opens a new session with no next state; another user's conversation goes on."""
    t = tracker()
    alice = Client(t, SYS, user("hi"), hints=Hints(user="alice"))
    bob = Client(t, SYS, user("hi"), hints=Hints(user="bob"))
    first, theirs = alice.send(), bob.send()
    assert t.forget_user("alice") == [first.session_id]
    again = alice.say(user("more")).send()
    assert again.session_id != first.session_id and again.previous_turn_id is None
    assert bob.say(user("more")).send().session_id == theirs.session_id
