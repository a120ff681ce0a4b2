"""The judge loop: turns with a next state (or explicit feedback) become judgments and samples.

It runs beside serving, never on its path: the collector only hands it turn ids.
A few worker tasks take them from a queue (the newest served version's turns first:
clawrl/judge/queue.py says why); for each turn they cast `m` PRM votes
and/or `m` hint votes (as the method wants) through the backend, with at most
`judge.concurrency` calls in flight, a time limit per call and retries with
exponential backoff. A call that still fails is a *failed vote* (value None, the
reason kept), never a silent 0. The judgment and the method's samples are
written to the store in one transaction; a newer judgment of a turn (explicit
feedback arriving later) supersedes the samples of the older one that were not
trained yet.

Judgment writes go through the server's `StoreWriter`: while the store refuses
writes (disk full, database locked) they are kept in order and retried, and
the loop waits before judging another turn, since its turn may not be on disk
yet.

A judgment with a hint, or a rating with a comment, then teaches memory (`memory.learn`): the
lessons `clawrl.memory.lessons` finds become or merge into experiences (`Store.learn`), those of
the comment marked as the user's own word; a lesson over the cap or with a control character is
dropped and logged with its reason. That
runs after the judgment is written, and a failure there is logged and counted
(`JudgeHealth.memory_failures`), never raised: it never blocks judging.

A turn served with a memory block also gives its memory distillation sample when it is judged
(`memory.distill`, clawrl/algo/distill.py), whatever the votes say and even when there is nothing
to judge on yet; it is written on its own (at most one a turn, none once one of its experiences
is erased), and a failure there is logged and counted like learning's, never raised.

When a session ends, the method's session rule runs (rl's at-least-one
guarantee) once every judgment of that session queued so far is written.
On start, turns that were waiting for a judgment when the server stopped are
queued again, so a restart loses no judging.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from clawrl.algo.base import Method, TeacherPrompt
from clawrl.algo.distill import BarePrompt, distillation_sample
from clawrl.algo.rewrite import rewrite_sample, wants_rewrite
from clawrl.config import JudgeConfig, MemoryConfig
from clawrl.engine.base import EngineError
from clawrl.judge.backends import JudgeBackend, JudgeCallFailed
from clawrl.judge.likelihood import reply_text
from clawrl.judge.prompts import JudgeKind, judge_messages, tool_names
from clawrl.judge.queue import JudgeQueue
from clawrl.judge.rewriter import Rewriter
from clawrl.judge.scorer import LikelihoodJudge
from clawrl.judge.votes import hint_vote, judgment, prm_vote, state_hint_vote
from clawrl.memory.lessons import read
from clawrl.store.db import Store
from clawrl.store.writer import StoreWriter
from clawrl.types import Feedback, Judgment, Sample, Turn, Vote
from clawrl.version_folder import version_rank

log = logging.getLogger(__name__)
_OUTCOMES = {1: "positive", 0: "neutral", -1: "negative"}  # a vote's value; None: failed


@dataclass(frozen=True)
class JudgeHealth:
    """What the judge loop says of itself (`judge` on /healthz and the dashboard, judge metrics)."""

    status: str  # "ok", or "degraded" while most of the last votes failed
    judge: str  # the backend's name ("feedback": no judge model, ratings only)
    method: str
    queued: int  # turns waiting to be judged
    judged: int  # turns judged since the server started
    failed_votes: int
    votes: dict[str, int]  # "kind:outcome" (e.g. "prm:negative", "hint:failed") -> votes cast
    in_flight: int  # judge calls waiting for their backend now
    latency_s: float | None  # mean latency of the last votes (None: no vote yet)
    vote_seconds: float  # summed latency of every vote cast
    last_error: str | None
    lessons: int = 0  # lessons handed to memory since the server started (one a turn taught before: a no-op)
    memory_failures: int = 0  # judged turns whose lessons or distillation sample failed (judging went on)
    distilled: int = 0  # memory distillation samples written since the server started
    rewrites: int = 0  # hint rewrite samples made since the server started (train.hint_rewrite)
    hint_rewrite: bool = False  # whether a hinted turn judged not good gets a rewrite (a method that distils)


class JudgeLoop:
    def __init__(
        self,
        store: Store,
        writer: StoreWriter,
        backend: JudgeBackend | None,
        method: Method,
        teacher: TeacherPrompt,
        config: JudgeConfig,
        likelihood: LikelihoodJudge | None = None,
        served: Callable[[], str] = lambda: "v0",
        memory: MemoryConfig | None = None,
        bare: BarePrompt | None = None,
        rewrite: Rewriter | None = None,
    ) -> None:
        self.store, self.writer, self.backend, self.method = store, writer, backend, method
        self.served = served  # the version served now: turns submitted under a newer one go first
        self.likelihood = likelihood  # PRM votes by label likelihood (judge.mode); None: by generation
        self.db = writer.run  # reads (and writes that must fail loudly) on the store's thread
        self.teacher, self.config = teacher, config
        self.memory = memory  # None, or memory.learn off: no experiences are learnt
        self.bare = bare  # renders a turn without its memory block; None: no distillation samples
        self.rewrite = rewrite  # writes a hinted turn's answer again with the hint; None: no rewrites
        judge = likelihood if likelihood is not None else backend
        self.name = judge.name if judge is not None else "feedback"
        self._queue = JudgeQueue()
        self._calls = asyncio.Semaphore(config.concurrency)
        self._pending: Counter[str] = Counter()  # session -> turns queued or being judged
        self._ending: set[str] = set()  # sessions that ended while judgments were pending
        self._drained = asyncio.Condition()  # notified each time a queued turn is done with
        self._workers: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()  # session-end rules in flight
        self._recent: deque[bool] = deque(maxlen=5)  # last vote outcomes, True = failed
        self._latencies: deque[float] = deque(maxlen=50)  # of the last votes, for the dashboard
        self.judged = 0
        self.failed_votes = 0
        self.votes: Counter[tuple[str, str]] = Counter()  # (kind, outcome) -> votes cast
        self.vote_seconds = 0.0  # summed latency of every vote cast
        self.in_flight = 0  # judge calls waiting for their backend now
        self.last_error: str | None = None
        self.lessons = 0
        self.memory_failures = 0
        self.distilled = 0
        self.rewrites = 0

    async def start(self) -> None:
        if self.backend is not None:
            await self.backend.start()
        for turn in await self.db(self.store.turns_awaiting_judgment):
            self.submit(turn.id, turn.session_id)
        # Each worker judges one turn at a time; the semaphore bounds the calls in flight.
        self._workers = [
            asyncio.create_task(self._work(), name=f"clawrl-judge-{i}")
            for i in range(self.config.concurrency)
        ]

    async def stop(self) -> None:
        for task in [*self._workers, *self._background]:
            task.cancel()
        await asyncio.gather(*self._workers, *self._background, return_exceptions=True)
        if self.backend is not None:
            await self.backend.stop()

    def submit(self, turn_id: str, session_id: str) -> None:
        self._pending[session_id] += 1
        self._queue.put(turn_id, session_id, version_rank(self.served()))

    def session_ended(self, session_id: str) -> None:
        if self._pending[session_id]:
            self._ending.add(session_id)
        else:
            self._pending.pop(session_id, None)
            task = asyncio.get_running_loop().create_task(self._end_session(session_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def settled(self, session_ids: list[str]) -> None:
        """Return once no turn of these sessions is queued or being judged (their judgments written)."""
        async with self._drained:
            await self._drained.wait_for(lambda: not any(self._pending[s] for s in session_ids))

    def health(self) -> JudgeHealth:
        failing = sum(self._recent) >= 3  # 3 of the last 5 votes failed: the judge is in trouble now
        return JudgeHealth(
            status="degraded" if failing else "ok",
            judge=self.name,
            method=self.method.name,
            queued=self._queue.qsize(),
            judged=self.judged,
            failed_votes=self.failed_votes,
            votes={f"{kind}:{outcome}": n for (kind, outcome), n in sorted(self.votes.items())},
            in_flight=self.in_flight,
            latency_s=sum(self._latencies) / len(self._latencies) if self._latencies else None,
            vote_seconds=self.vote_seconds,
            last_error=self.last_error,
            lessons=self.lessons,
            memory_failures=self.memory_failures,
            distilled=self.distilled,
            rewrites=self.rewrites,
            hint_rewrite=self._rewrites(),
        )

    async def _work(self) -> None:
        while True:
            turn_id, session_id = await self._queue.get()
            try:
                await self.judge(turn_id)
            except Exception as exc:  # one bad turn must not stop judging; the error is shown on /healthz
                log.exception("judging %s failed", turn_id)
                self.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                self._pending[session_id] -= 1
                if self._pending[session_id] <= 0:
                    del self._pending[session_id]
                    if session_id in self._ending:
                        self._ending.discard(session_id)
                        await self._end_session(session_id)
                async with self._drained:
                    self._drained.notify_all()

    async def judge(self, turn_id: str) -> Judgment | None:
        """Judge one turn now: votes (reused if it was judged before, none if it was rated before it
        was judged), feedback, samples, all stored."""
        await self.writer.settled()  # the turn and its next state may still be waiting to be written
        turn = await self.db(self.store.get_turn, turn_id)
        if turn is None:
            return None
        await self._distill(turn)
        feedback = await self.db(self.store.latest_feedback, turn_id)
        earlier = await self.db(self.store.latest_judgment, turn_id)
        if earlier is not None:
            votes = earlier.votes  # already paid for: a rating arriving later decides the score
        elif feedback is not None:
            votes = []  # rated first: a person's word beats the judge's, so no judge is asked
        else:
            votes = await self._votes(turn)
        if not votes and feedback is None:
            return None  # nothing to judge on yet (the feedback judge waits for a rating)
        j = judgment(
            turn_id=turn.id,
            judge=self.name,
            votes=votes,
            feedback_rating=feedback.rating if feedback else None,
            feedback_comment=feedback.comment if feedback else None,
        )
        samples = self.method.samples(turn, j, self.teacher) + await self._rewrite(turn, j)
        await self.writer.write(self.store.insert_judgment, j, samples)  # one transaction; supersedes older
        self.judged += 1
        await self._learn(turn, j, feedback)
        return j

    async def _learn(self, turn: Turn, j: Judgment, feedback: Feedback | None) -> None:
        """The lessons of the hint and of the rating's comment become experiences (see the module)."""
        m = self.memory
        if m is None or not m.learn:
            return
        try:
            comment = feedback.comment if feedback else None
            hint = j.hint if j.hint != comment else None  # a rating first: the comment is the hint
            found: dict[str, bool] = {}  # lesson -> taught by the rating's comment
            for text, by_comment in ((comment, True), (hint, False)):
                got = read(text, max_chars=m.max_chars, free_form=m.free_form)
                for sentence, reason in got.dropped:
                    log.warning("memory item of %s dropped (%s): %r", turn.id, reason, sentence)
                for lesson in got.kept:
                    found.setdefault(lesson, by_comment)
            for lesson, by_comment in found.items():
                learn = functools.partial(self.store.learn, from_comment=by_comment)
                args = (lesson, turn.id, turn.session_id, time.time(), None, m.merge_at, m.max_chars)
                await self.writer.write(learn, *args)  # owner None: the session's user
                self.lessons += 1
        except Exception:  # degrade on purpose: memory is a bonus, judging and serving must go on
            log.exception("learning from %s failed; its judgment stands", turn.id)
            self.memory_failures += 1

    def _rewrites(self) -> bool:
        """Rewrites are made when on and the method distils hints: a rewrite is an opd sample, which
        `rl` (binary RL alone) never trains, and a client pacing its ratings counts one sample each."""
        return self.rewrite is not None and self.method.wants_hint

    async def _rewrite(self, turn: Turn, j: Judgment) -> list[Sample]:
        """The turn's hint rewrite sample (clawrl/algo/rewrite.py), when it wants one and it can be had."""
        if not self._rewrites() or not wants_rewrite(turn, j):
            return []
        try:
            teacher_ids = self.teacher(turn, j.hint or "")
            response_ids, version = await self.rewrite(teacher_ids, turn)
        except (EngineError, ValueError) as exc:  # degrade on purpose: a bonus sample
            log.warning("the hint rewrite of %s failed (%s); judging goes on", turn.id, exc)
            return []
        sample = rewrite_sample(
            turn=turn, judgment=j, teacher_prompt_ids=teacher_ids, response_ids=response_ids, version=version
        )
        self.rewrites += sample is not None
        return [sample] if sample is not None else []

    async def _distill(self, turn: Turn) -> None:
        """Write the turn's memory distillation sample, if it has one (see the module)."""
        if self.bare is None or not (turn.memory or {}).get("block"):
            return
        try:
            sample = distillation_sample(turn, self.bare(turn))
            if sample is not None:
                await self.writer.write(self.store.insert_distillation, sample)
                self.distilled += sample.id is not None  # None: the turn had one, or a write kept for later
        except Exception:  # degrade on purpose: a distillation sample is a bonus, judging must go on
            log.exception("the memory distillation sample of %s failed; judging goes on", turn.id)
            self.memory_failures += 1

    async def _votes(self, turn: Turn) -> list[Vote]:
        if (self.backend is None and self.likelihood is None) or not turn.next_state:
            return []
        m = self.config.votes
        from_state = self.method.wants_hint and self.config.hints_from == "next_state"
        calls = []
        if self.method.wants_prm or from_state:  # a next-state hint needs the votes' verdict
            if self.likelihood is not None:
                reply = reply_text(turn.next_state, tool_names(turn))
                calls += [self._vote("prm", self._read(reply, i)) for i in range(m)]
            else:
                calls += [self._vote("prm", self._ask("prm", turn)) for _ in range(m)]
        if self.method.wants_hint and not from_state:
            calls += [self._vote("hint", self._ask("hint", turn)) for _ in range(m)]
        votes = list(await asyncio.gather(*calls))
        if from_state:
            votes.append(self._count(state_hint_vote(votes, turn)))
        return votes

    def _ask(self, kind: JudgeKind, turn: Turn) -> Callable[[], Awaitable[Vote]]:
        """One generation call: the judge writes, its reply is parsed."""
        messages = judge_messages(kind, turn, turn.next_state)
        build = prm_vote if kind == "prm" else hint_vote

        async def call() -> Vote:
            assert self.backend is not None
            start = time.perf_counter()
            raw = await self.backend.complete(messages, self.config.temperature, self.config.max_tokens)
            return build(raw, time.perf_counter() - start)

        return call

    def _read(self, reply: str, variant: int) -> Callable[[], Awaitable[Vote]]:
        """One likelihood call: the engine scores the labels after prompt `variant`."""

        async def call() -> Vote:
            assert self.likelihood is not None
            start = time.perf_counter()
            read = await self.likelihood.read(reply, variant)
            return Vote("prm", read.value, raw=read.text(), latency_s=time.perf_counter() - start)

        return call

    async def _vote(self, kind: str, call: Callable[[], Awaitable[Vote]]) -> Vote:
        """`call` under the judge's bound on calls in flight, time limit and retries; a failure
        after the last retry is a failed vote with its reason."""
        build = prm_vote if kind == "prm" else hint_vote
        start, error = time.perf_counter(), "no attempt"
        for attempt in range(self.config.retries + 1):
            try:
                async with self._calls:
                    self.in_flight += 1
                    try:
                        vote = await asyncio.wait_for(call(), self.config.timeout_s)
                    finally:
                        self.in_flight -= 1
                return self._count(dataclasses.replace(vote, latency_s=time.perf_counter() - start))
            except (JudgeCallFailed, TimeoutError) as exc:
                error = str(exc) or f"timeout after {self.config.timeout_s:g}s"
                if attempt < self.config.retries:
                    await asyncio.sleep(self.config.backoff_s * 2**attempt)
        return self._count(build(None, time.perf_counter() - start, error))

    def _count(self, vote: Vote) -> Vote:
        failed = vote.value is None  # the call failed, or its reply could not be parsed
        self._recent.append(failed)
        self._latencies.append(vote.latency_s)
        self.vote_seconds += vote.latency_s
        self.votes[vote.kind, _OUTCOMES.get(vote.value, "failed")] += 1
        if failed:
            self.failed_votes += 1
            self.last_error = vote.error
        return vote

    async def _end_session(self, session_id: str) -> None:
        await self.writer.settled()
        scored = await self.db(self.store.scored_turns, session_id)
        emitted = await self.db(self.store.session_rl_count, session_id)
        samples = self.method.session_end(scored, emitted)
        if samples:
            await self.writer.write(self.store.insert_samples, samples)
            log.info("session %s: %d sample(s) by the at-least-one rule", session_id, len(samples))
