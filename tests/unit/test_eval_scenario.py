"""The experiment loop against a scripted server: one measurement per version, paced users,
eval requests greedy and side, training requests main and rated, sessions closed."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from clawrl.eval.client import Answer, EvalError, Unanswered
from clawrl.eval.experiment import check_learning, run_experiment
from clawrl.eval.pacing import expected_samples
from clawrl.eval.personas import get_persona
from clawrl.eval.scenario import Settings
from clawrl.eval.tasks import load_tasks, split


@dataclass
class Call:
    session_id: str
    temperature: float
    side: bool
    done: bool
    last_user: str
    memory: bool | None = None


@dataclass
class ScriptedServer:
    """Implements EvalClient's interface. Its "trainer" publishes a version as soon as
    `batch` samples are ready, so a user who outruns the pacing makes it skip a version.
    Version vN answers with 60 - 10 N filler words before the right number."""

    batch: int
    method: str = "rl"
    trainer: str = "running"
    version_number: int = 0
    ready: int = 0
    hold: set[int] = field(default_factory=set)  # versions the "canary gate" holds: made, never served
    made: int = 0
    fail_every: int = 0  # every n-th call raises Unanswered (an OpenClaw turn that failed); 0: none
    fail_closing: bool = False  # every closing message raises Unanswered (a capped answer OpenClaw drops)
    fail_side_from: int | None = None  # held-out answers raise Unanswered from this version on
    unanswered: int = 0
    memory: bool = False  # memory on: an answer with the block is brief once a rating taught a lesson
    lessons: int = 0  # ratings received (each teaches "keep it short")
    calls: list[Call] = field(default_factory=list)
    ratings: list[tuple[str, int, str | None]] = field(default_factory=list)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _answers: dict[str, int] = field(default_factory=dict)  # question -> answer, for the scripted text

    async def health(self) -> dict[str, Any]:
        held = max((n for n in self.hold if n <= self.made), default=None)
        return {
            "version": f"v{self.version_number}",
            "judge": {"status": "ok", "judge": "feedback", "method": self.method},
            "trainer": {"status": self.trainer},
            "guard": {"last_held": None if held is None else {"version": f"v{held}"}},
            "memory": {"status": "on" if self.memory else "off"},
        }

    async def version(self) -> str:
        return (await self.health())["version"]

    async def chat(
        self, messages, session_id, *, temperature, max_tokens, side=False, done=False, memory=None
    ) -> Answer:
        await asyncio.sleep(0)  # let other users run, as a real request would
        self.calls.append(Call(session_id, temperature, side, done, messages[-1]["content"], memory))
        blocked = memory is False or (side and memory is None)  # the server adds no block to these
        if (
            (self.fail_every and len(self.calls) % self.fail_every == 0)
            or (self.fail_closing and done and not side)
            or (side and self.fail_side_from is not None and self.version_number >= self.fail_side_from)
        ):
            self.unanswered += 1
            raise Unanswered("openclaw exited 1")
        filler = max(0, 60 - 10 * self.version_number)
        if self.memory and self.lessons and not blocked:
            filler = 0
        answer = next((a for q, a in self._answers.items() if q in messages[0]["content"]), 0)
        text = "well " * filler + f"it is {answer}."
        return Answer(f"chatcmpl-{next(self._ids)}", text, f"v{self.version_number}", "stop")

    async def experiences(self) -> dict[str, int]:
        return {"active": min(self.lessons, 1), "distilled": 0, "retired": 0}

    async def feedback(self, response_id: str, rating: int, comment: str | None) -> None:
        self.ratings.append((response_id, rating, comment))
        self.lessons += 1
        self.ready += expected_samples(self.method, rating, comment)
        if self.ready >= self.batch and self.trainer != "off":
            self.ready -= self.batch
            self.made += 1
            if self.made not in self.hold:
                self.version_number = self.made


def _setup(batch: int, method: str = "rl"):
    tasks = load_tasks()
    train, held = split(tasks, held_out=3, seed=0)
    server = ScriptedServer(batch=batch, method=method)
    server._answers = {t.question: t.answer for t in tasks}
    settings = Settings(steps=3, concurrency=4, samples_per_step=batch, poll_s=0.001, max_wall_s=30)
    return server, train, held, settings


@pytest.mark.parametrize("method", ["rl", "combine"])
def test_every_step_is_measured_once_and_scores_follow_the_served_version(method):
    server, train, held, settings = _setup(batch=2, method=method)
    outcome = asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))
    assert [p.step for p in outcome.points] == [0, 1, 2, 3]
    assert [p.version for p in outcome.points] == ["v0", "v1", "v2", "v3"]
    assert all(p.answer_versions == [p.version] for p in outcome.points)
    # brief: 60 - 10 N filler words + 3; credit 1 up to 30 words, falling to 0 at 120
    expected = [1 - (63 - 10 * n - 30) / 90 for n in range(4)]
    assert [p.score for p in outcome.points] == pytest.approx(expected)
    # Three held-out answers, alike but for their different numbers: ROUGE-L (W - 1) / W of W words.
    assert len({t.answer for t in held}) == 3
    assert [p.self_rouge_l for p in outcome.points] == pytest.approx(
        [(62 - 10 * n) / (63 - 10 * n) for n in range(4)]
    )
    assert outcome.method == method and outcome.judge == "feedback" and outcome.stopped == "done"
    # Every session's first answer is rated: v0's 63 words already score 0.63, a thumbs up.
    firsts = {c.session_id for c in server.calls if not c.side and c.session_id.startswith("train-")}
    assert settings.concurrency <= len(outcome.sessions) <= len(firsts) and all(outcome.sessions)


def test_eval_requests_are_greedy_side_turns_and_training_requests_are_rated_main_turns():
    server, train, held, settings = _setup(batch=2)
    asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))
    evals = [c for c in server.calls if c.side]
    training = [c for c in server.calls if not c.side]
    assert len(evals) == 4 * len(held)
    assert all(c.temperature == 0.0 and c.done and c.session_id.startswith("eval-") for c in evals)
    assert {c.last_user for c in evals} == {get_persona("brief").first_message(t) for t in held}
    assert training and all(c.temperature == 1.0 and c.session_id.startswith("train-rl-") for c in training)
    held_questions = {t.question for t in held}
    assert not any(q in c.last_user for c in training for q in held_questions)
    # exactly one step's worth of ratings per version; 33-63 words score >= 0.5: thumbs up, yet
    # over 30 words, so each still carries the brief persona's hint
    assert len(server.ratings) == 3 * 2
    assert all(rating == 1 and comment for _, rating, comment in server.ratings)


def test_turns_without_an_answer_are_counted_and_the_experiment_goes_on():
    """Through OpenClaw a turn can fail or time out: the conversation ends there, a held-out task
    without an answer scores 0, and the run still measures every step."""
    server, train, held, settings = _setup(batch=2)
    server.fail_every = 3  # the third call is a held-out answer at v0, later ones training turns
    outcome = asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))
    assert [p.step for p in outcome.points] == [0, 1, 2, 3] and outcome.stopped == "done"
    assert outcome.unanswered == server.unanswered >= 3
    assert outcome.points[0].scores[2] == 0.0 and outcome.points[0].scores[0] > 0
    assert outcome.points[0].answer_versions == ["v0"]  # the missing answer names no version
    failed = [i for i, c in enumerate(server.calls) if (i + 1) % 3 == 0 and not c.side]
    assert failed
    for i in failed:  # its conversation sent nothing more
        assert all(c.session_id != server.calls[i].session_id for c in server.calls[i + 1 :])


def test_an_agent_that_answers_no_held_out_task_stops_the_eval_naming_its_error():
    """Every held-out answer failed (an OpenClaw with no route to the server, say): a score of 0
    would read as the policy's; the eval stops with the agent's error instead."""
    server, train, held, settings = _setup(batch=2)
    server.fail_every = 1
    with pytest.raises(EvalError, match="no held-out task was answered.*openclaw exited 1"):
        asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))


def test_an_agent_that_stops_answering_later_ends_the_run_keeping_what_it_measured():
    """v0 measured, then every held-out answer fails: the run stops at that point, its report keeps
    v0's score and says why it stopped, rather than scoring v1 0 or losing v0."""
    server, train, held, settings = _setup(batch=2)
    server.fail_side_from = 1
    outcome = asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))
    assert [p.version for p in outcome.points] == ["v0"] and outcome.stopped == "unanswered"
    assert outcome.sessions  # the training sessions before it are kept too


async def cancel_and_check_no_user_talks(run: asyncio.Future, calls: Callable[[], int]) -> None:
    """Cancel `run` (what Ctrl-C or SIGTERM does to asyncio.run); then no simulated user is left
    talking to the server (`calls`: how many requests it has had)."""
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    before = calls()
    await asyncio.sleep(0.05)
    assert calls() == before


def test_an_interrupted_experiment_leaves_its_caller_what_it_measured():
    """Cancelled mid-run (what Ctrl-C or SIGTERM does to asyncio.run): the outcome the caller was
    handed keeps the points and sessions so far and says it was interrupted; the users are stopped."""
    server, train, held, settings = _setup(batch=10**6)  # no version ever comes: the users run on
    seen: list = []

    async def interrupt() -> None:
        run = asyncio.ensure_future(run_experiment(server, get_persona("brief"), train, held, settings, seen))
        while len(server.ratings) < 6:  # v0 measured, then some training sessions rated
            await asyncio.sleep(0.001)
        await cancel_and_check_no_user_talks(run, lambda: len(server.calls))

    asyncio.run(interrupt())
    (outcome,) = seen
    assert outcome.stopped == "interrupted" and [p.version for p in outcome.points] == ["v0"]
    assert outcome.answers >= 6 and outcome.sessions and outcome.wall_s > 0


def test_closing_message_ends_the_session():
    server, train, held, settings = _setup(batch=6)
    settings = Settings(steps=1, concurrency=1, samples_per_step=6, poll_s=0.001, max_wall_s=30)
    asyncio.run(run_experiment(server, get_persona("brief", max_turns=3), train, held, settings))
    first = [c for c in server.calls if c.session_id.startswith("train-rl-00001-")]
    assert [c.done for c in first] == [False, False, False, True]
    assert "Never mind" in first[-1].last_user  # the give-up line after the third answer


def test_a_server_that_cannot_learn_is_refused():
    with pytest.raises(EvalError, match="no trainer"):
        check_learning({"judge": {"status": "ok"}, "trainer": {"status": "off"}})
    with pytest.raises(EvalError, match="judges nothing"):
        check_learning({"judge": {"status": "off"}, "trainer": {"status": "running"}})
    server, train, held, settings = _setup(batch=2)
    server.trainer = "off"
    with pytest.raises(EvalError, match="no trainer"):
        asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))


def test_no_new_version_stops_at_the_deadline_with_what_was_measured():
    server, train, held, _ = _setup(batch=10**6)
    settings = Settings(
        steps=2, concurrency=2, samples_per_step=2, poll_s=0.001, max_wall_s=0.3, stall_s=0.05
    )
    outcome = asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))
    assert outcome.stopped == "timeout"
    assert [p.step for p in outcome.points] == [0]
    assert len(server.ratings) > 2  # the stalled users were let go on after stall_s


def test_a_held_version_counts_as_a_step_and_the_users_go_on_without_waiting_for_it():
    server, train, held, settings = _setup(batch=4)
    server.hold = {2}
    settings = Settings(steps=3, concurrency=4, samples_per_step=4, poll_s=0.001, max_wall_s=30, stall_s=60)
    outcome = asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))
    assert [p.version for p in outcome.points] == ["v0", "v1", "v3"] and outcome.held == ["v2"]
    assert outcome.stopped == "done"  # no 60 s stall: the hold opened the next step at once


def test_a_run_whose_last_versions_are_held_ends_when_enough_versions_were_made():
    server, train, held, settings = _setup(batch=4)
    server.hold = {2, 3}
    outcome = asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))
    assert [p.version for p in outcome.points] == ["v0", "v1"] and outcome.held == ["v2", "v3"]
    assert outcome.stopped == "held"


@dataclass
class JudgedServer(ScriptedServer):
    """Without ratings: every training answer gives one sample (the judge reads the next message),
    shown in `/healthz`'s samples; the trainer steps only when the test says so."""

    async def chat(
        self, messages, session_id, *, temperature, max_tokens, side=False, done=False, memory=None
    ) -> Answer:
        answer = await super().chat(
            messages, session_id, temperature=temperature, max_tokens=max_tokens, side=side, done=done
        )
        if not side and not done:
            self.ready += 1
        return answer

    async def health(self) -> dict[str, Any]:
        return await super().health() | {"samples": {"ready": self.ready, "training": 0}}

    def training_calls(self) -> int:
        return sum(not c.side for c in self.calls)

    def step(self) -> None:
        self.ready = max(0, self.ready - self.batch)
        self.made += 1
        self.version_number = self.made


def test_without_ratings_the_users_hold_their_next_messages_while_a_batch_waits():
    """No rating to pace: once `/healthz` shows a step's batch pending, no new training message is
    sent until the trainer's version is made, so the trainer gets the cores a person's pause leaves."""
    tasks = load_tasks()
    train, held = split(tasks, held_out=3, seed=0)
    server = JudgedServer(batch=4)
    server._answers = {t.question: t.answer for t in tasks}
    settings = Settings(steps=2, concurrency=4, samples_per_step=4, poll_s=0.001, max_wall_s=30,
                        feedback=False, stall_s=600)  # fmt: skip
    still: list[bool] = []

    async def trainer() -> None:
        for _ in range(settings.steps):
            while server.ready < server.batch:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.1)  # the experiment's poll sees the batch; in-flight turns end
            before = server.training_calls()
            await asyncio.sleep(0.3)
            still.append(server.training_calls() == before)
            server.step()

    async def both():
        stepping = asyncio.create_task(trainer())
        outcome = await run_experiment(server, get_persona("brief"), train, held, settings)
        await stepping
        return outcome

    outcome = asyncio.run(both())
    assert [p.step for p in outcome.points] == [0, 1, 2] and outcome.stopped == "done"
    assert still == [True, True]
    assert server.ratings == []  # no feedback was sent


def test_a_closing_message_without_an_answer_ends_its_session_and_the_run_goes_on():
    """Through OpenClaw the closing message's capped answer can come back as a failed turn (OpenClaw
    drops an answer cut at max_tokens as incomplete): counted, and the users go on."""
    server, train, held, _ = _setup(batch=6)
    server.fail_closing = True
    settings = Settings(steps=2, concurrency=1, samples_per_step=6, poll_s=0.001, max_wall_s=30)
    outcome = asyncio.run(run_experiment(server, get_persona("brief", max_turns=3), train, held, settings))
    assert [p.step for p in outcome.points] == [0, 1, 2] and outcome.stopped == "done"
    closing = [c for c in server.calls if c.done and not c.side]
    assert closing and outcome.unanswered == server.unanswered == len(closing)


def test_with_memory_on_each_point_is_measured_bare_and_with_the_block():
    server, train, held, settings = _setup(batch=2)
    server.memory = True
    outcome = asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))
    assert [p.version for p in outcome.points] == ["v0", "v1", "v2", "v3"]
    assert [p.score for p in outcome.points] == pytest.approx([1 - (63 - 10 * n - 30) / 90 for n in range(4)])
    assert outcome.points[0].score_memory == outcome.points[0].score  # nothing was rated yet
    assert [p.score_memory for p in outcome.points[1:]] == [1.0] * 3  # 3 words: the lesson is used
    evals = [c for c in server.calls if c.side]
    assert {c.memory for c in evals} == {True, False} and len(evals) == 2 * 4 * len(held)
    assert all(c.memory is None for c in server.calls if not c.side)  # training turns: the default
    assert outcome.points[-1].experiences == {"active": 1, "distilled": 0, "retired": 0}


def test_memory_only_measures_a_point_every_n_sessions_at_v0():
    """No trainer, memory on: the users open `points_every` sessions, all of them end, then the
    held-out tasks are measured with and without memory; no version ever comes."""
    server, train, held, settings = _setup(batch=2)
    server.trainer, server.memory = "off", True
    settings = dataclasses.replace(settings, points_every=3, steps=2)
    outcome = asyncio.run(run_experiment(server, get_persona("brief"), train, held, settings))
    assert [(p.step, p.version, p.sessions) for p in outcome.points] == [
        (0, "v0", 0),
        (1, "v0", 3),
        (2, "v0", 6),
    ]
    assert outcome.stopped == "done" and outcome.conversations >= 6
    assert [p.score_memory for p in outcome.points][1:] == [1.0, 1.0]
    assert outcome.points[1].score == outcome.points[0].score  # the weights never changed
    # Each point's measurement came after its sessions had all ended, and before any later one opened.
    order = [c.session_id for c in server.calls]
    first_eval = next(i for i, c in enumerate(server.calls) if c.side and "-s3" in c.session_id)
    opened_before = {sid for sid in order[:first_eval] if sid.startswith("train-")}
    assert len(opened_before) == 3
    assert not opened_before & {c.session_id for c in server.calls[first_eval:]}  # all had ended


def test_the_backlog_lets_go_when_fewer_than_a_batch_are_pending_even_without_a_version():
    """Samples can leave without a version (stale once held versions were made): the trainer then
    waits for more, and users held until a version would wait with it until --stall-s."""
    from clawrl.eval.pacing import Backlog

    backlog = Backlog(8, stall_s=600)
    backlog.seen(0.0, 9, 2)
    assert backlog.holding
    backlog.seen(1.0, 8, 2)
    assert backlog.holding
    backlog.seen(2.0, 5, 2)  # four went stale
    assert not backlog.holding
    backlog.seen(3.0, 8, 2)
    backlog.made(3)
    assert not backlog.holding


def test_a_hinted_minus_one_counts_its_rewrite_where_the_server_makes_them():
    """The pacing counts what the server will make of a rating: a hint rewrite beside a hinted -1
    (train.hint_rewrite, for the methods that distil), so no step is trained past unmeasured."""
    comment = "Could you number the steps, one per line?"
    assert expected_samples("combine", -1, comment) == 1
    assert expected_samples("combine", -1, comment, rewrites=True) == 2
    assert expected_samples("opd", -1, comment, rewrites=True) == 2
    assert expected_samples("combine", 1, comment, rewrites=True) == 1  # a good answer: no rewrite
    assert expected_samples("combine", -1, None, rewrites=True) == 1  # no hint: no rewrite
    assert expected_samples("rl", -1, comment, rewrites=True) == 1  # rl distils nothing: none made
