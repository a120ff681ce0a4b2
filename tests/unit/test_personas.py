"""Simulated users: the shipped task set, each scripted persona's score and replies on
hand-written answers, and the LLM persona against a real local HTTP server."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from clawrl.eval.llm_persona import LLMPersona, PersonaError
from clawrl.eval.personas import PERSONAS, get_persona, mentions_answer, student_answer
from clawrl.eval.tasks import Task, load_tasks, split

BAKER = Task("t1", "A baker makes 24 rolls and sells 15 of them. How many rolls are left?", 9)
AI_STYLE = (
    "## Solution\n\n**Step 1:** Start with 24 rolls.\n\n1. Subtract the 15 sold rolls.\n"
    "2. 24 - 15 = 9\n\n**Final answer:** $\\boxed{9}$"
)
PLAIN = "The baker started with 24 rolls and sold 15, so 24 minus 15 leaves 9 rolls."


# -- tasks -----------------------------------------------------------------------------


def test_math_tasks_load_with_unique_ids_and_integer_answers():
    tasks = load_tasks("math")
    assert len(tasks) == 48
    assert len({t.id for t in tasks}) == 48
    assert all(type(t.answer) is int and 0 < t.answer < 10_000 for t in tasks)
    assert tasks[0] == Task("m01", BAKER.question, 9)


def test_unknown_task_set_names_the_known_ones():
    with pytest.raises(ValueError, match="known task sets: math"):
        load_tasks("physics")


def test_split_is_deterministic_disjoint_and_complete():
    tasks = load_tasks()
    train, held = split(tasks, held_out=12, seed=7)
    assert (train, held) == split(tasks, held_out=12, seed=7)
    assert len(train) == 36 and len(held) == 12
    assert {t.id for t in train}.isdisjoint(t.id for t in held)
    assert {t.id for t in train} | {t.id for t in held} == {t.id for t in tasks}
    assert split(tasks, held_out=12, seed=8)[1] != held
    with pytest.raises(ValueError, match="held_out"):
        split(tasks, held_out=49)


# -- numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "answer", "expected"),
    [
        ("There are 9 left.", 9, True),
        ("That makes 9.0 rolls", 9, True),
        ("nine rolls", 9, True),
        ("1,200 grams in all", 1200, True),
        ("19 rolls", 9, False),
        ("3,4 and 5", 34, False),
        ("no number here", 9, False),
    ],
)
def test_mentions_answer(text: str, answer: int, expected: bool):
    assert mentions_answer(text, answer) is expected


# -- scripted personas -----------------------------------------------------------------


def test_registry_and_unknown_persona():
    assert set(PERSONAS) == {
        "student",
        "teacher",
        "brief",
        "pirate",
        "direct",
        "autograde",
        "stepwise",
        "finish",
    }
    assert get_persona("brief", max_turns=5).max_turns == 5
    with pytest.raises(
        ValueError,
        match="known personas: student, teacher, brief, pirate, direct, autograde, stepwise, finish",
    ):
        get_persona("pilot")


def test_first_messages_contain_the_question_and_are_stable():
    for name in PERSONAS:
        persona = get_persona(name)
        assert BAKER.question in persona.first_message(BAKER)
        assert persona.first_message(BAKER) == get_persona(name).first_message(BAKER)


def test_student_dislikes_ai_formatting_and_says_what_to_change():
    student = get_persona("student")
    assert student.score(BAKER, AI_STYLE) == pytest.approx(1 / 6)  # only the number is right
    reply = student.reply(BAKER, AI_STYLE, turn=1)
    assert (reply.rating, reply.done) == (-1, False)
    assert reply.message is not None
    for asked in ("bold text", "lists", "headings", "'Final answer'", "AI-written", "plain sentences"):
        assert asked in reply.message
    # One check a rule since the persona became a file: each missed rule's hint, in the file's order.
    assert (
        reply.comment
        == "Write plain prose with no bold. No lists. No headings. No 'Step'/'Final answer' labels. No LaTeX."
    )


def test_student_accepts_plain_prose_with_the_right_number():
    student = get_persona("student")
    assert student.score(BAKER, PLAIN) == 1.0
    reply = student.reply(BAKER, PLAIN, turn=1)
    assert reply.rating == 1 and reply.done and reply.comment is None
    assert reply.message is not None and reply.message.startswith("Thanks")


def test_student_wants_the_right_number_without_being_told_it():
    student = get_persona("student")
    wrong = "The baker sold 15 of 24 rolls, so 11 are left."
    assert student.score(BAKER, wrong) == pytest.approx(5 / 6)
    reply = student.reply(BAKER, wrong, turn=1)
    # Good enough for a thumbs up (5/6 >= 0.5), yet the student still asks for the fix.
    assert reply.rating == 1 and not reply.done and "redo the arithmetic" in (reply.message or "")
    assert "9" not in (reply.message or "") + (reply.comment or "")


def test_unsatisfied_user_gives_up_after_max_turns():
    student = get_persona("student", max_turns=2)
    assert not student.reply(BAKER, AI_STYLE, turn=1).done
    last = student.reply(BAKER, AI_STYLE, turn=2)
    assert last.done and last.rating == -1 and "bold text" in (last.message or "")
    with pytest.raises(ValueError, match="from 1"):
        student.reply(BAKER, PLAIN, turn=0)


def test_brief_gives_partial_credit_falling_with_length():
    brief = get_persona("brief")
    short = "9 rolls are left."
    medium = " ".join(["The baker had 24 rolls and sold 15 of them."] * 5) + " So 9 are left."
    long = " ".join(["The baker had 24 rolls and sold 15 of them."] * 20) + " So 9 are left."
    scores = [brief.score(BAKER, text) for text in (short, medium, long)]
    assert scores[0] == 1.0 and 1.0 > scores[1] > scores[2] == 0.0
    assert brief.score(BAKER, "Eleven rolls.") == 1.0  # the form is rated, not the arithmetic
    reply = brief.reply(BAKER, long, turn=1)
    assert reply.rating == -1 and "under 30 words" in (reply.message or "")
    assert brief.reply(BAKER, short, turn=1).rating == 1


def worked_steps(answer: str) -> float:
    """stepwise's steps check as a count: its credit is a share of 3 worked steps."""
    return get_persona("stepwise").checks(BAKER, answer)[0].value * 3


def test_stepwise_counts_worked_steps():
    assert worked_steps("24 - 15 = 9.") == 1
    assert worked_steps("First, 3 x 8 is 24. Then 24 minus 6 is 18. So the total = 18.") == 3
    assert worked_steps("Step 1: 36 / 6\nStep 2: 6 \\times 2\nDone, nothing else.") == 2
    assert worked_steps("There are 9 rolls left. The baker had 24.") == 0  # numbers, no calculation


def test_stepwise_wants_every_calculation_as_a_step_and_is_briefs_opposite():
    stepwise, brief = get_persona("stepwise"), get_persona("brief")
    worked = (
        "The baker starts with 24 rolls in the morning, fresh from the oven and ready to sell.\n"
        "Step 1: during the day the baker sells 15 of them, so we take those away: 24 - 15 = 9.\n"
        "Step 2: to check, add the sold rolls back to what is left: 9 + 15 = 24, the rolls we began with.\n"
        "Step 3: so the number of rolls still on the shelf at the end of the day = 9 rolls in all."
    )
    terse = "9 rolls are left."
    assert stepwise.score(BAKER, worked) == 1.0 and brief.score(BAKER, worked) < 0.5
    assert stepwise.score(BAKER, terse) == 0.0 and brief.score(BAKER, terse) == 1.0
    # PLAIN: one step of three (1/3); 16 words, credit 0 at 15 and 1 at 60 (1/45): the mean of both
    assert stepwise.score(BAKER, PLAIN) == pytest.approx((1 / 3 + 1 / 45) / 2)
    reply = stepwise.reply(BAKER, terse, turn=1)
    assert reply.rating == -1 and not reply.done
    assert "its own step" in (reply.message or "") and "(4 words)" in (reply.message or "")
    assert "every calculation as its own step" in (reply.comment or "")
    accepted = stepwise.reply(BAKER, worked, turn=1)
    assert accepted.rating == 1 and accepted.done and accepted.comment is None
    assert accepted.message in stepwise.thanks


def test_teacher_quotes_a_scripted_student_answer():
    tasks = load_tasks()
    teacher = get_persona("teacher")
    answers = [student_answer(t) for t in tasks]
    assert 10 < sum(a == t.answer for a, t in zip(answers, tasks, strict=True)) < 38  # some right, some not
    assert all(a > 0 for a in answers)
    for task in tasks:
        assert f" {student_answer(task)}." in teacher.first_message(task)


def test_teacher_prefers_specific_friendly_comments_to_harsh_ones():
    teacher = get_persona("teacher")
    task = next(t for t in load_tasks() if student_answer(t) != t.answer)
    wrote = student_answer(task)
    harsh = "Wrong!! This is careless work, check it again."
    kind = f"Good effort! You wrote {wrote}, but the answer is {task.answer}. Check the last step again."
    assert teacher.score(task, harsh) == 0.25  # short, nothing else
    assert teacher.score(task, kind) == 1.0
    reply = teacher.reply(task, harsh, turn=1)
    assert reply.rating == -1
    assert "harsh wording" in (reply.message or "") and f"they wrote {wrote}" in (reply.message or "")
    assert f"the correct one ({task.answer})" in (reply.comment or "")
    assert teacher.reply(task, kind, turn=1).rating == 1


def test_teacher_wants_short_comments():
    teacher = get_persona("teacher")
    rambling = "Good effort, nice try. " + "Let us go over it carefully together. " * 30 + "The answer is 9."
    assert 0.75 <= teacher.score(BAKER, rambling) < 1.0
    assert "under 60 words" in (teacher.reply(BAKER, rambling, turn=1).message or "")


def test_pirate_wants_ahoy_first():
    pirate = get_persona("pirate")
    assert pirate.score(BAKER, "Ahoy! There are 9 rolls left.") == 1.0
    assert pirate.score(BAKER, "There are 9 rolls left. Ahoy!") == 0.5
    assert pirate.score(BAKER, PLAIN) == 0.0
    reply = pirate.reply(BAKER, PLAIN, turn=1)
    assert reply.rating == -1 and '"Ahoy!"' in (reply.message or "")
    assert reply.comment == 'Begin the answer with the exact word "Ahoy!".'
    assert pirate.reply(BAKER, "  Ahoy! 9 rolls.", turn=3).rating == 1


def test_direct_objects_to_the_stock_opener_wherever_it_starts():
    direct = get_persona("direct")
    opener = "To solve this problem, we need to subtract 15 from 24. There are 9 rolls left."
    assert direct.score(BAKER, opener) == 0.0
    assert direct.score(BAKER, "There are 9 rolls left. To find it, subtract 15 from 24.") == 0.5
    assert direct.score(BAKER, "24 - 15 = 9, so 9 rolls are left.") == 1.0
    reply = direct.reply(BAKER, opener, turn=1)
    assert reply.rating == -1 and '"To solve..."' in (reply.message or "")
    assert "never write" in (reply.comment or "")
    long_but_direct = "24 - 15 = 9. " * 40  # length is not this user's concern
    assert direct.reply(BAKER, long_but_direct, turn=1).done


def test_autograde_wants_a_last_line_answer_n_and_credits_the_answer_in_words():
    grader = get_persona("autograde")
    assert grader.score(BAKER, "24 - 15 = 9 rolls are left.\nAnswer: 9") == 1.0
    assert grader.score(BAKER, "Answer: 1,250") == 1.0  # the format, not the number, is graded
    assert grader.score(BAKER, "Answer: 9\nHope that helps!") == 0.5
    assert grader.score(BAKER, "So, the answer is 9.") == 0.5
    assert grader.score(BAKER, PLAIN) == 0.0
    assert grader.score(BAKER, "Answer: nine") == 0.0
    reply = grader.reply(BAKER, PLAIN, turn=1)
    assert reply.rating == -1 and '"Answer: N"' in (reply.message or "")


def test_a_persona_with_no_checks_is_refused_at_start(tmp_path):
    silent = tmp_path / "silent.toml"
    silent.write_text('name = "silent"\ndescription = "checks nothing"\nopenings = ["{question}"]\n')
    with pytest.raises(ValueError, match="no checks"):
        get_persona(str(silent))


def test_finish_wants_the_reply_to_end_on_its_number():
    finish = get_persona("finish")
    assert finish.score(BAKER, "24 - 15 = 9.\nSo 9 rolls are left.") == 1.0
    assert finish.score(BAKER, "24 rolls and 15 sold.\nThe answer is: 9") == 1.0
    assert finish.score(BAKER, "There are 24 rolls and 15 are sold, so 24 - 15 = 9") == 0.0  # cut off
    assert finish.score(BAKER, "24 - 15 = 9. This is a simple subtraction.") == 0.5
    remark = "So 9 are left. This is a classic example of subtraction! Let me know if you need more."
    assert finish.score(BAKER, remark) == 0.0
    assert finish.score(BAKER, "Nine rolls are left.") == 0.0  # no number at all
    reply = finish.reply(BAKER, remark, turn=1)
    assert reply.rating == -1 and "End on the result" in (reply.message or "")
    assert finish.reply(BAKER, "Nine, since 24 - 15 = 9.", turn=1).done


# -- LLM persona over real HTTP --------------------------------------------------------


class _Canned(BaseHTTPRequestHandler):
    """Answers every POST with the next canned chat completion text and records the request."""

    def do_POST(self) -> None:
        server: Any = self.server
        length = int(self.headers["Content-Length"])
        server.requests.append((self.path, dict(self.headers), json.loads(self.rfile.read(length))))
        status, content = server.replies.pop(0)
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def endpoint() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    server.requests, server.replies = [], []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server
    server.shutdown()
    thread.join()
    server.server_close()


def _persona(server: Any, name: str = "student") -> LLMPersona:
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    return LLMPersona(get_persona(name), url, "judge-model", api_key="k", timeout_s=5)


def test_llm_persona_scores_with_the_persona_description(endpoint: Any):
    endpoint.replies = [(200, "Score: 0.25")]
    with _persona(endpoint) as persona:
        assert persona.score(BAKER, AI_STYLE) == 0.25
    path, headers, body = endpoint.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer k"
    assert body["model"] == "judge-model" and body["temperature"] == 0.0
    prompt = "\n".join(m["content"] for m in body["messages"])
    assert get_persona("student").description in prompt and AI_STYLE in prompt


def test_llm_persona_parses_rejections_and_acceptances(endpoint: Any):
    endpoint.replies = [
        (200, "VERDICT: REJECT\nMESSAGE: Please drop the bold text.\nIt looks fake.\nCOMMENT: No bold."),
        (200, "**VERDICT:** Accept\nMESSAGE: Thanks!\nCOMMENT: none"),
        (200, "VERDICT: REJECT\nMESSAGE: Still too formal.\nCOMMENT: none"),
    ]
    with _persona(endpoint) as persona:
        first = persona.reply(BAKER, AI_STYLE, turn=1)
        accepted = persona.reply(BAKER, PLAIN, turn=2)
        last = persona.reply(BAKER, AI_STYLE, turn=3)
    assert first.message == "Please drop the bold text.\nIt looks fake."
    assert (first.rating, first.comment, first.done) == (-1, "No bold.", False)
    assert (accepted.message, accepted.rating, accepted.comment, accepted.done) == ("Thanks!", 1, None, True)
    assert (last.rating, last.comment, last.done) == (-1, None, True)  # max_turns reached


@pytest.mark.parametrize(
    ("method", "status", "content", "error"),
    [
        ("score", 200, "I'd say it's pretty good.", "no score"),
        ("score", 200, "7", "outside"),
        ("reply", 200, "Looks fine to me!", "no VERDICT"),
        ("reply", 200, "VERDICT: REJECT", "without a MESSAGE"),
        ("score", 500, "boom", "http 500"),
    ],
)
def test_llm_persona_raises_on_unusable_answers(
    endpoint: Any, method: str, status: int, content: str, error: str
):
    endpoint.replies = [(status, content)]
    with _persona(endpoint) as persona, pytest.raises(PersonaError, match=error):
        if method == "reply":
            persona.reply(BAKER, PLAIN, turn=1)
        else:
            persona.score(BAKER, PLAIN)


def test_llm_persona_that_is_down_raises():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket closes
    persona = LLMPersona(get_persona("brief"), f"http://127.0.0.1:{port}/v1", "m", timeout_s=5)
    with persona, pytest.raises(PersonaError, match="Connect"):
        persona.score(BAKER, PLAIN)
