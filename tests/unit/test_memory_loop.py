"""Memory around the store: the judge loop learns from hints and comments (and a failure there never
stops judging), `clawrl records show` prints what a turn carried, `clawrl memory list|forget`, and
the teacher prompt keeps a turn's memory block. No model, no tokenizer: a scripted teacher."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from clawrl.algo import get_method
from clawrl.algo.teacher import served_messages
from clawrl.cli import main
from clawrl.config import JudgeConfig, MemoryConfig
from clawrl.judge.worker import JudgeLoop
from clawrl.memory import with_memory
from clawrl.store.db import Store
from clawrl.store.writer import StoreWriter
from clawrl.testing import make_turn
from clawrl.types import EXPERIENCE_RETIRED, Feedback

COMMENT = "Way too long. Answer in French please. The capital is Canberra."


def teacher(turn, hint: str) -> list[int]:
    return [1, 2, 3]


class BrokenMemory(Store):
    """A store whose experiences table is gone: learning fails, everything else works."""

    def learn(self, *args, **kwargs):
        raise sqlite3.OperationalError("no such table: experiences")


def _judge(db: Path, store_class: type[Store] = Store, memory: MemoryConfig | None = None):
    async def run():
        with store_class.open(db) as store:
            writer = StoreWriter(retry_every_s=1.0, max_pending=100)
            writer.start()
            loop = JudgeLoop(
                store, writer, None, get_method("combine"), teacher, JudgeConfig(), memory=memory
            )
            try:
                j = await loop.judge("t0")
            finally:
                await writer.stop()
            return j, loop.health(), store.experiences()

    return asyncio.run(run())


def _rated(db: Path, comment: str = COMMENT) -> None:
    with Store.open(db) as store:
        store.upsert_session("s1", "header", 1.0)
        store.insert_turn(make_turn("t0", "s1", 0))
        store.add_feedback(Feedback("t0", -1, comment, 2.0))


def test_a_rating_comment_teaches_its_wishes_not_its_facts(db):
    _rated(db)
    j, health, learnt = _judge(db, memory=MemoryConfig(free_form=True))
    assert j.score == -1 and j.hint == COMMENT
    assert sorted(e.text for e in learnt) == [
        "Answer in French please.",
        "Keep answers short and to the point.",
    ]
    assert all(e.turn_ids == ["t0"] and e.session_ids == ["s1"] and e.from_comment for e in learnt)
    assert health.lessons == 2 and health.memory_failures == 0


def test_without_free_form_a_comment_teaches_only_the_known_complaints(db):
    _rated(db)
    learnt = _judge(db, memory=MemoryConfig())[2]
    assert [e.text for e in learnt] == ["Keep answers short and to the point."]


def test_a_lesson_with_a_control_character_is_dropped_and_logged(db, caplog):
    _rated(db, "Answer in French\u202e please. Way too long.")
    learnt = _judge(db, memory=MemoryConfig(free_form=True))[2]
    assert [e.text for e in learnt] == ["Keep answers short and to the point."]
    (record,) = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert "control character U+202E" in record.getMessage() and "t0" in record.getMessage()


def test_memory_learn_off_learns_nothing(db):
    _rated(db)
    assert _judge(db, memory=MemoryConfig(learn=False))[2] == []
    assert _judge(db, memory=None)[2] == []


def test_a_failed_extraction_never_blocks_judging(db):
    _rated(db)
    j, health, learnt = _judge(db, BrokenMemory, MemoryConfig())
    assert j is not None and j.id is not None and learnt == []
    assert health.memory_failures == 1
    with Store.open(db) as store:
        assert store.latest_judgment("t0").score == -1  # the judgment and its samples were written
        assert [s.turn_id for s in store.ready_samples()] == ["t0"]


def test_records_show_prints_the_memory_a_turn_carried(db, capsys):
    with Store.open(db) as store:
        store.upsert_session("s1", "header", 1.0)
        e = store.learn("Answer in French.", "t0", "s0", now=1.0)
        store.insert_turn(make_turn("t0", "s1", 0, memory={"ids": [e.id], "block": "B"}))
        store.insert_turn(make_turn("t1", "s1", 1, memory={"ids": [], "dropped": "window", "picked": [e.id]}))
    assert main(["records", "show", "--session", "s1", "--run-dir", str(db.parent)]) == 0
    out = capsys.readouterr().out
    assert f"  memory:\n    #{e.id} Answer in French." in out
    assert f"  memory: dropped (window): #{e.id}" in out
    assert main(["records", "export", "--run-dir", str(db.parent)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["memory"] == {"ids": [e.id], "block": "B"}


def test_cli_memory_lists_and_forgets(db, capsys):
    with Store.open(db) as store:
        e = store.learn("Answer in French.", "t0", "s0", now=1.0)
    run = ["--run-dir", str(db.parent)]
    assert main(["memory", "list", *run]) == 0
    assert f"#{e.id:<4} active    seen 1   Answer in French.  (from t0)" in capsys.readouterr().out
    assert main(["memory", "forget", str(e.id), *run]) == 0
    assert main(["memory", "forget", "999", *run]) == 2
    assert "no experience 999" in capsys.readouterr().err
    assert main(["memory", "list", "--json", "--state", "retired", *run]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["state"] == EXPERIENCE_RETIRED
    assert main(["memory", "list", "--state", "active", *run]) == 0
    assert capsys.readouterr().out == ""


def test_the_teacher_renders_the_same_memory_block_the_turn_was_served_with():
    turn = make_turn("t0", "s1", 0, memory={"ids": [1], "block": "BLOCK"})
    assert served_messages(turn) == with_memory(turn.messages, "BLOCK")
    assert served_messages(make_turn("t1", "s1", 1)) == make_turn("t1", "s1", 1).messages
    dropped = make_turn("t2", "s1", 2, memory={"ids": [], "dropped": "window"})
    assert served_messages(dropped) == dropped.messages
