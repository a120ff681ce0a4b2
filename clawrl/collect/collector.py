"""The collect loop at the gateway: sessions resolved in memory, turns written to the store.

Every request is resolved by the pure `SessionTracker` (microseconds, on the
event loop). Store writes run on one dedicated writer thread (`StoreWriter`),
so the event loop never waits on SQLite. A turn is written *before* the client
receives the end of its answer; an answer a client holds is therefore on disk,
or, while the store refuses writes (disk full, database locked), in the
writer's bounded in-memory backlog, retried until it lands. A request cut off
by its client is still recorded (finish reason `abort`) but does not become
the session's tip.

On start the tracker is rebuilt from the store (sessions active within the
idle timeout), so a conversation that goes on after a restart, even after a
SIGKILL, keeps its session and attaches its next state to the turn before.

Errors (`clawrl/collect/errors.py`): `NotRecorded` for feedback on an answer or session
that was never recorded, `RecordingRefused` while the store cannot take the write.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from clawrl.collect.errors import NotRecorded, RecordingRefused
from clawrl.sessions.tracker import Hints, Resolution, Restored, SessionTracker
from clawrl.store.db import Store
from clawrl.store.writer import TRANSIENT, StoreWriter
from clawrl.types import Feedback, Message, Turn

log = logging.getLogger(__name__)
T = TypeVar("T")


class JudgeFeed(Protocol):
    """What the collector tells the judge (`clawrl.judge.worker.JudgeLoop`)."""

    def submit(self, turn_id: str, session_id: str) -> None:
        """The turn has its next state (or a rating): judge it."""
        ...

    def session_ended(self, session_id: str) -> None:
        """The session ended: its last turn gets no next state."""
        ...


class Collector:
    def __init__(
        self,
        store: Store,
        tracker: SessionTracker,
        idle_timeout: float,
        expire_every: float,
        writer: StoreWriter,
        judge: JudgeFeed | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.tracker = tracker
        self._idle = idle_timeout
        self._every = expire_every
        self._clock = clock
        self.writer = writer
        self._expiry: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.judge = judge  # None when judging is off

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.writer.run(fn, *args)

    async def start(self) -> None:
        since = self._clock() - self._idle
        for s in await self.db(self.store.open_sessions, since):
            last = s.last_turn
            self.tracker.restore(
                Restored(
                    session_id=s.id,
                    source=s.source,
                    turn_count=s.turn_count,
                    last_active=s.updated_at,
                    last_turn_id=last.id if last else None,
                    messages=last.messages if last else [],
                    answer=last.answer_message() if last else None,
                    user=s.user,
                )
            )
        log.info("tracking %d open sessions from the store", len(self.tracker))
        self.writer.start()
        self._expiry = asyncio.create_task(self._expire_forever(), name="clawrl-session-expiry")

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.gather(self._expiry, return_exceptions=True)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        # Sessions still open end as `shutdown`: a restart within the idle timeout reopens them.
        ended = self.tracker.expire(self._clock()) + [(sid, "shutdown") for sid in self.tracker.close_all()]
        await self.writer.write(self._write_ended, ended, self._clock())
        await self.writer.stop()

    async def begin(self, messages: list[Message], hints: Hints) -> Resolution:
        self._admit()
        now = self._clock()
        r = self.tracker.resolve(messages, hints, now)
        await self.writer.write(self._write_begin, r, now)
        if r.previous_turn_id is not None and self.judge is not None:
            self.judge.submit(r.previous_turn_id, r.session_id)
        return r

    def _admit(self, most: int | None = None) -> None:
        """503 while more than `most` writes wait (default: while the backlog is full; see StoreWriter)."""
        w = self.writer
        if w.full or (most is not None and w.pending > most):
            raise RecordingRefused(
                f"the store cannot record this now ({w.health().error}); {w.pending} writes are "
                "waiting for it; try again later",
                code="store_unavailable",
            )

    def _write_begin(self, r: Resolution, now: float) -> None:
        self.store.upsert_session(r.session_id, r.source, now, r.user)
        if r.previous_turn_id is not None and r.next_state:
            self.store.set_next_state(r.previous_turn_id, r.next_state, now, r.next_state_match)

    async def finish(self, r: Resolution, turn: Turn) -> None:
        """Record a finished turn (awaited before the client gets the end of the answer)."""
        await self.writer.write(self.store.insert_turn, turn)
        if turn.finish_reason == "abort":
            self.tracker.abandon(r)
        else:
            self.tracker.answered(r, turn.id, turn.answer_message(), turn.finished_at)
        if r.done and self.tracker.end(r.session_id):
            await self.writer.write(self.store.end_session, r.session_id, "done", self._clock())
            self._ended(r.session_id)

    async def end_session(self, session_id: str, reason: str = "done") -> None:
        """End a session now (its episode was posted): its last turn gets no next state."""
        if self.tracker.end(session_id):
            await self.writer.write(self.store.end_session, session_id, reason, self._clock())
            self._ended(session_id)

    def admit(self) -> None:
        """503 unless the store takes writes now (a reply that must name what it recorded)."""
        self._admit(most=0)

    def _ended(self, session_id: str) -> None:
        if self.judge is not None:
            self.judge.session_ended(session_id)

    def finish_later(self, r: Resolution, turn: Turn) -> None:
        """Record a cut-off turn from a cancelled task, which can no longer await anything."""
        task = asyncio.get_running_loop().create_task(self.finish(r, turn))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def fail(self, r: Resolution) -> None:
        """The engine failed: nothing was answered, so the session keeps its tip."""
        self.tracker.abandon(r)

    async def feedback(
        self,
        response_id: str | None,
        session_id: str | None,
        rating: int,
        comment: str | None,
        owner: str | None = None,
    ) -> tuple[Turn, int]:
        """Rate a recorded answer; `owner`: only one of that user's (None: anyone's, the admin's).
        Another user's answer is NotRecorded, as an unknown one is (docs/users.md)."""
        self._admit(most=0)  # its turn may still be waiting; and its id must be known to answer
        try:
            write = functools.partial(
                self._write_feedback,
                response_id=response_id,
                session_id=session_id,
                rating=rating,
                comment=comment,
                owner=owner,
            )
            turn, fid = await self.db(write)
        except TRANSIENT as exc:  # never kept for later: the reply carries the rating's id
            self.writer.failed(exc)
            raise RecordingRefused(
                f"the store cannot record feedback now: {exc}", code="store_unavailable"
            ) from exc
        if self.judge is not None:
            self.judge.submit(turn.id, turn.session_id)  # an explicit rating decides the reward
        return turn, fid

    def _write_feedback(
        self,
        response_id: str | None,
        session_id: str | None,
        rating: int,
        comment: str | None,
        owner: str | None,
    ) -> tuple[Turn, int]:
        if response_id is not None:
            turn = self.store.get_turn(response_id)
            if turn is None or not self._owns(owner, turn.session_id):
                raise NotRecorded(f"no answer with id {response_id!r} was recorded", param="response_id")
        else:
            assert session_id is not None
            turn = self.store.latest_main_turn(session_id)
            if turn is None or not self._owns(owner, session_id):
                raise NotRecorded(
                    f"no session {session_id!r} with a main turn was recorded", param="session_id"
                )
        fid = self.store.add_feedback(Feedback(turn.id, rating, comment, self._clock()))
        return turn, fid

    def _owns(self, owner: str | None, session_id: str) -> bool:
        """Whether `owner` may see the session (None: the admin, who sees every user's)."""
        return owner is None or self.store.session_user(session_id) == owner

    async def erase_user(self, user: str) -> tuple[dict[str, int], set[int]]:
        """Erase `user`'s rows while serving (docs/users.md): their open sessions leave the tracker
        first, so nothing of theirs is continued, then the store thread, which runs every write made
        before in order, deletes the rows (`Store.erase_user`). Returns the counts erased and the ids
        of their samples that versions were trained on (read just before). RecordingRefused while
        writes wait for the store: they could land after the erase."""
        self._admit(most=0)
        self.tracker.forget_user(user)
        return await self.db(self._erase, user)

    def _erase(self, user: str) -> tuple[dict[str, int], set[int]]:
        trained = self.store.trained_sample_ids(user)
        return self.store.erase_user(user), trained

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            ended = self.tracker.expire(self._clock())
            if ended:
                await self.writer.write(self._write_ended, ended, self._clock())
                for session_id, _ in ended:
                    self._ended(session_id)

    def _write_ended(self, ended: list[tuple[str, str]], now: float) -> None:
        for session_id, reason in ended:
            self.store.end_session(session_id, reason, now)
