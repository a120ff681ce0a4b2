"""Persona files: every check kind (met, missed, graded), the loader's messages on bad input, the
shipped files scoring as the Python personas they replaced, tasks beside the file, and the real
`clawrl eval --persona FILE.toml` refusing a bad file with exit status 2 before anything starts."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clawrl.eval.personas import PERSONAS, PersonaFileError, get_persona, load_persona
from clawrl.eval.personas.checks import KINDS, Rule, measure
from clawrl.eval.tasks import Task

BAKER = Task("m01", "A baker makes 24 rolls and sells 15 of them. How many rolls are left?", 9)
NUMBERED = """\
name = "numbered"
description = "Wants the working as numbered steps, one per line."
openings = ["{question}", "Walk me through it: {question}"]
thanks = ["Now I can follow it, thanks."]
give_up = "Okay, forget it for now."
tasks = "math"          # a built-in set, or a JSONL path (relative to the file) of id, question, answer

[[checks]]
kind = "min_lines_matching"
pattern = '^\\s*\\d+[.)]\\s+\\S'
count = 3
partial = true          # graded credit where the kind defines it (a share of count, of words)
complaints = ["I can't follow that. Could you number the steps, one per line?"]
hints = ["Write the working as numbered steps, one per line."]
"""


def _rule(kind: str, partial: bool = False, **params: object) -> Rule:
    pattern = params.pop("pattern", None)
    compiled = re.compile(str(pattern)) if pattern is not None else None
    return Rule(kind, ("c",), ("h",), partial, pattern=compiled, **params)  # type: ignore[arg-type]


def _credit(rule: Rule, reply: str, task: Task = BAKER) -> float:
    return measure(rule, task, reply).credit


# -- check kinds ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "met", "missed"),
    [
        (_rule("max_words", words=3), "9 rolls left.", "There are 9 rolls left."),
        (_rule("min_words", words=4), "There are 9 rolls left.", "9 rolls left."),
        (_rule("starts_with", text="Ahoy!"), "  Ahoy! 9 rolls.", "9 rolls. Ahoy!"),
        (_rule("starts_with", text="Ahoy!"), "Ahoy! 9", "ahoy! 9"),  # case-sensitive
        (_rule("ends_with", text="Answer: 9"), "24 - 15 = 9\nAnswer: 9\n", "Answer: 9, I think"),
        (_rule("contains", text="rolls"), "9 rolls", "9 Rolls"),
        (_rule("matches", pattern=r"(?i)\bnine\b"), "Nine are left.", "Ninety are left."),
        (_rule("not_matches", pattern=r"\*\*"), "9 rolls", "**9** rolls"),
        (_rule("min_lines_matching", pattern=r"^\d\.", count=2), "1. a\n2. b", "1. a 2. b"),
        (_rule("min_sentences_matching", pattern=r"\d", count=2), "It is 9. Yes 9.", "It is 9. Yes."),
        (_rule("right_number"), "nine rolls are left", "11 rolls are left"),
        (_rule("ends_on_number"), "24 - 15 = 9, so 9.", "9 rolls, 24 at first."),
        (_rule("first_line_has_number"), "\n9 rolls\nok", "Rolls:\n9"),
        (_rule("names_student_answer"), "They wrote 9, which is right.", "Good effort!"),
    ],
)
def test_each_kind_is_met_or_missed(rule: Rule, met: str, missed: str):
    assert _credit(rule, met) == 1.0
    assert _credit(rule, missed) == 0.0


def test_every_kind_has_a_test_above():
    tested = {"max_words", "min_words", "starts_with", "ends_with", "contains", "matches", "not_matches"}
    tested |= {"min_lines_matching", "min_sentences_matching", "right_number", "ends_on_number"}
    tested |= {"first_line_has_number", "names_student_answer"}
    assert tested == set(KINDS)


def test_graded_kinds_give_partial_credit_only_with_partial():
    lines = _rule("min_lines_matching", partial=True, pattern=r"^\d\.", count=3)
    assert _credit(lines, "1. a\n2. b\nc") == pytest.approx(2 / 3)
    assert _credit(_rule("min_lines_matching", pattern=r"^\d\.", count=3), "1. a\n2. b\nc") == 0.0
    sentences = _rule("min_sentences_matching", partial=True, pattern=r"\d", count=4)
    assert _credit(sentences, "It is 9. Yes 9. No.") == 0.5
    # max_words: 1 up to 10 words, falling linearly to 0 at 40 (4 x words)
    short = _rule("max_words", partial=True, words=10)
    assert [_credit(short, "w " * n) for n in (10, 25, 40, 60)] == [1.0, 0.5, 0.0, 0.0]
    assert _credit(_rule("max_words", words=10), "w " * 25) == 0.0
    # min_words: 1 from 20 words on, falling linearly to 0 at 5 (a quarter)
    long = _rule("min_words", partial=True, words=20)
    assert [_credit(long, "w " * n) for n in (20, 11, 5, 0)] == [1.0, 0.4, 0.0, 0.0]
    assert _credit(_rule("min_words", words=20), "w " * 11) == 0.0


def test_regex_kinds_hand_what_they_found_to_the_complaint(tmp_path):
    path = tmp_path / "plain.toml"
    path.write_text(
        'name = "plain"\ndescription = "d"\nopenings = ["{question}"]\n\n[[checks]]\n'
        "kind = \"not_matches\"\npattern = '(?i)to solve'\n"
        'complaints = ["Drop \\"{found}\\" ({words} words)."]\nhints = ["No {found}."]\n'
    )
    reply = load_persona(path).reply(BAKER, "To solve it, subtract.", turn=1)
    assert reply.message == 'Drop "To solve" (4 words).' and reply.comment == "No To solve."


def test_the_numbered_example_scores_and_answers(tmp_path):
    (tmp_path / "numbered.toml").write_text(NUMBERED)
    persona = get_persona(str(tmp_path / "numbered.toml"))
    assert persona.score(BAKER, "1. 24 rolls\n2. sell 15\n3) 24 - 15 = 9") == 1.0
    assert persona.score(BAKER, "1. 24 rolls\n2. 24 - 15 = 9") == pytest.approx(2 / 3)
    first = persona.reply(BAKER, "24 - 15 = 9", turn=1)
    assert first.message == "I can't follow that. Could you number the steps, one per line?"
    assert first.comment == "Write the working as numbered steps, one per line." and first.rating == -1
    assert persona.reply(BAKER, "9", turn=3).message.endswith("Okay, forget it for now.")  # type: ignore[union-attr]
    assert persona.reply(BAKER, "1. a\n2. b\n3. c", turn=1).message == "Now I can follow it, thanks."


# -- the shipped files ----------------------------------------------------------------------

PLAIN = "The baker started with 24 rolls and sold 15, so 24 minus 15 leaves 9 rolls."
AI = (
    "## Solution\n\n**Step 1:** Start with 24 rolls.\n\n1. Subtract the 15 sold rolls.\n2. 24 - 15 = 9\n\n"
    "**Final answer:** $\\boxed{9}$"
)
OPENER = (
    "To solve this problem, we need to subtract 15 from 24. 24 - 15 = 9. So there are 9 rolls left. "
    "Hope that helps!"
)
PIRATE = "Ahoy! 24 - 15 = 9, so 9 rolls are left.\nAnswer: 9"
WORKED = "Good effort! 24 - 15 = 9.\nThen 9 + 15 = 24 checks it.\nSo the total = 9.\nAnswer: 9"
CUT = "There are 24 rolls and 15 are sold, so 24 - 15 = 9 and then we"
LONG = "Good effort, you wrote 9. " + "We check it together step by step. " * 15  # 110 words

# What the Python personas these files replaced scored (commit a067577), answer by answer.
BEFORE = {
    "student": [1.0, 1 / 6, 1.0, 5 / 6, 5 / 6, 1.0, 1.0],
    "teacher": [0.75, 0.75, 0.75, 0.75, 1.0, 0.75, 0.895833],
    "brief": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.111111],
    "pirate": [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
    "direct": [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0],
    "autograde": [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0],
    "stepwise": [0.177778, 0.255556, 0.277778, 0.166667, 0.577778, 0.188889, 0.5],
    "finish": [1.0, 1.0, 0.5, 1.0, 1.0, 0.0, 0.0],
}
# teacher's length credit now reaches 0 at 4 x 60 words (max_words' one ramp), not 3 x: a
# 110-word comment keeps (1 - 50/180) of it instead of (1 - 50/120).
NOW = BEFORE | {"teacher": [*BEFORE["teacher"][:-1], 0.930556]}


def test_every_shipped_file_is_listed_and_loads():
    shipped = {p.stem for p in Path(PERSONAS["brief"]).parent.glob("*.toml")}
    assert shipped == set(PERSONAS)
    for name, path in PERSONAS.items():
        persona = get_persona(name)
        assert persona.name == name and persona.source.path == path and len(persona.source.sha256) == 64
        assert len(persona.tasks) == 48 and persona.description


@pytest.mark.parametrize("name", list(PERSONAS))
def test_shipped_files_score_as_the_python_personas_did(name: str):
    persona = get_persona(name)
    scores = [persona.score(BAKER, a) for a in (PLAIN, AI, OPENER, PIRATE, WORKED, CUT, LONG)]
    assert scores == pytest.approx(NOW[name], abs=1e-6)


def test_a_name_or_a_file_is_one_persona(tmp_path):
    copy = tmp_path / "brief.toml"
    copy.write_bytes(PERSONAS["brief"].read_bytes())
    by_file, by_name = get_persona(str(copy)), get_persona("brief")
    assert by_file.source.sha256 == by_name.source.sha256
    assert by_file.first_message(BAKER) == by_name.first_message(BAKER)
    assert by_file.source.as_json()["path"] == str(copy.resolve())


# -- tasks beside the file ------------------------------------------------------------------


def test_a_jsonl_task_file_is_read_relative_to_the_persona_file(tmp_path, monkeypatch):
    (tmp_path / "p" / "data").mkdir(parents=True)
    (tmp_path / "p" / "data" / "t.jsonl").write_text(
        '{"id": "a", "question": "What is 2 + 3?", "answer": 5}\n'
        '{"id": "b", "question": "And 4 + 4?", "answer": 8}\n'
    )
    (tmp_path / "p" / "mine.toml").write_text(NUMBERED.replace('tasks = "math"', 'tasks = "data/t.jsonl"'))
    monkeypatch.chdir(tmp_path)  # the path is the file's, not the working directory's
    persona = get_persona("p/mine.toml")
    assert [t.id for t in persona.tasks] == ["a", "b"] and persona.source.tasks_name == "data/t.jsonl"


def test_tasks_need_no_answers_unless_a_check_does(tmp_path):
    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Name a colour."}\n')
    (tmp_path / "ok.toml").write_text(NUMBERED.replace('tasks = "math"', 'tasks = "q.jsonl"'))
    assert load_persona(tmp_path / "ok.toml").tasks == [Task("a", "Name a colour.", None)]


# -- bad input ------------------------------------------------------------------------------


def _error(tmp_path: Path, text: str, tasks: str | None = None) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    if tasks is not None:
        (tmp_path / "t.jsonl").write_text(tasks)
    with pytest.raises(PersonaFileError) as info:
        load_persona(path)
    message = str(info.value)
    assert str(path) in message
    return message


def test_an_unknown_check_kind_names_the_check_and_its_line(tmp_path):
    message = _error(tmp_path, NUMBERED.replace('"min_lines_matching"', '"min_lines"'))
    assert "line 8: checks[0] (kind 'min_lines'): unknown check kind; known kinds: max_words" in message


def test_a_regex_that_does_not_compile_names_its_line(tmp_path):
    message = _error(tmp_path, NUMBERED.replace("pattern = '^", "pattern = '(^"))
    assert "line 10: checks[0] (kind 'min_lines_matching'): pattern '(^" in message
    assert "does not compile" in message


def test_a_check_missing_its_parameter_or_with_a_stranger_is_named(tmp_path):
    assert "checks[0] (kind 'min_lines_matching'): missing its parameter count" in _error(
        tmp_path, NUMBERED.replace("count = 3\n", "")
    )
    message = _error(tmp_path, NUMBERED.replace("count = 3", "count = 3\nwords = 5"))
    assert "checks[0] (kind 'min_lines_matching'): words is not its parameter" in message
    message = _error(tmp_path, NUMBERED.replace("count = 3", "limit = 3"))
    assert "line 11: checks[0] (kind 'min_lines_matching'): limit: unknown key" in message
    message = _error(tmp_path, NUMBERED.replace('complaints = ["I can', 'complaints = []\n# ["I can'))
    assert "checks[0] (kind 'min_lines_matching'): complaints:" in message


def test_no_checks_is_an_error(tmp_path):
    text = NUMBERED[: NUMBERED.index("[[checks]]")]
    assert "no checks: a persona needs at least one [[checks]] table" in _error(tmp_path, text)
    assert "no checks" in _error(tmp_path, text + "checks = []\n")


def test_unknown_top_level_keys_and_bad_toml_name_their_line(tmp_path):
    with_key = NUMBERED.replace("openings =", "temperature = 0.5\nopenings =", 1)
    assert "line 3: temperature: unknown key" in _error(tmp_path, with_key)
    assert "not valid TOML" in _error(tmp_path, NUMBERED.replace("count = 3", "count = "))
    assert "line 11" in _error(tmp_path, NUMBERED.replace("count = 3", "count = "))


def test_a_task_file_without_answers_for_a_check_that_needs_them(tmp_path):
    right = NUMBERED.replace('tasks = "math"', 'tasks = "t.jsonl"') + (
        '\n[[checks]]\nkind = "right_number"\ncomplaints = ["Wrong."]\nhints = ["Fix it."]\n'
    )
    message = _error(tmp_path, right, tasks='{"id": "a", "question": "What is 2 + 3?"}\n')
    assert (
        "t.jsonl:1: no 'answer'" in message
        and "checks[1] (kind 'right_number') needs each task's answer" in message
    )
    ends = right.replace('"right_number"', '"ends_on_number"')
    assert "checks[1] (kind 'ends_on_number')" in _error(
        tmp_path, ends, tasks='{"id": "a", "question": "q"}\n'
    )
    asks = NUMBERED.replace('tasks = "math"', 'tasks = "t.jsonl"').replace(
        '{question}"]', '{question} ({answer})"]'
    )
    assert "openings[1] needs each task's answer" in _error(
        tmp_path, asks, tasks='{"id": "a", "question": "q"}\n'
    )


def test_unknown_fields_and_task_sets_are_named(tmp_path):
    message = _error(tmp_path, NUMBERED.replace("one per line?", "one per {lines}?"))
    assert "checks[0] (kind 'min_lines_matching'): complaints[0]: unknown field {lines}" in message
    assert "unknown task set 'physics'" in _error(tmp_path, NUMBERED.replace('"math"', '"physics"'))
    assert "t.jsonl does not exist" in _error(tmp_path, NUMBERED.replace('"math"', '"t.jsonl"'))


def test_clawrl_eval_refuses_a_bad_persona_file_with_exit_status_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(NUMBERED.replace('"min_lines_matching"', '"numbered_lines"'))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "clawrl", "eval", "--persona", str(bad), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert f"persona file {bad}, line 8: checks[0] (kind 'numbered_lines'): unknown check kind" in done.stderr
    assert not (tmp_path / "out").exists()  # refused before any server, model or report
    assert time.monotonic() - started < 60
