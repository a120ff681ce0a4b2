"""Track 2 at the gateway: finished episodes are recorded, complete groups become samples.

An environment runner (clawrl/envs) runs each episode as one session through
`/v1/chat/completions` and posts its reward to `POST /v1/episodes` when it ends.
`EpisodeBook.record` ends the session, records the episode (and its group, the
first time), and once the group's G episodes are all in, closes the group: the
method (`grpo`, clawrl/algo/grpo.py) turns the episodes' main turns into samples,
or drops the group and says why; both are written with the group's verdict in one
transaction. With `grpo.judge_coef` > 0 the group waits for the judge's votes on
its steps first, in the background.

A group of evaluation episodes (`train` false) closes as `eval`: recorded, never
trained on. Under another method than grpo, groups close as `dropped` with that
reason. On start, groups whose episodes were all in when the server stopped are
closed, so a restart loses no group. A runner whose other episodes never reached the
server (no answer was asked for: nothing to post) closes the group with the ones it has
(`close`, `POST /v1/episodes/groups/{id}/close`); the method then sees fewer than G.

Errors: `NotRecorded` (404) for an episode of a session never recorded,
`Conflict` (409) for an episode posted twice or a group posted with two sizes,
`RecordingRefused` (503) while the store refuses writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections import Counter
from typing import Any, Protocol

from clawrl.algo.grpo import EpisodeTurns, GroupOutcome, GroupRelative
from clawrl.collect.collector import Collector
from clawrl.collect.errors import Conflict, NotRecorded, RecordingRefused
from clawrl.store.db import EpisodeConflict, UnknownSession
from clawrl.store.writer import TRANSIENT
from clawrl.types import GROUP_DROPPED, GROUP_EVAL, GROUP_OPEN, Episode, Group

log = logging.getLogger(__name__)


class StepJudge(Protocol):
    """What the book asks the judge (`clawrl.judge.worker.JudgeLoop`)."""

    async def settled(self, session_ids: list[str]) -> None:
        """Return once every turn of these sessions queued for judging is judged."""
        ...


class EpisodeBook:
    def __init__(
        self,
        collector: Collector,
        method: GroupRelative | None,
        method_name: str,
        judge: StepJudge | None = None,
    ) -> None:
        self.collector, self.store, self.writer = collector, collector.store, collector.writer
        self.method, self.method_name, self.judge = method, method_name, judge
        self._background: set[asyncio.Task[Any]] = set()
        self.closed: Counter[str] = Counter()  # groups closed since start, by status
        self.samples = 0  # samples written from groups since start

    async def db(self, fn: Any, *args: Any) -> Any:
        return await self.writer.run(fn, *args)

    async def start(self) -> None:
        for group_id in await self.db(self.store.complete_open_groups):
            await self._close(group_id)

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    async def record(self, episode: Episode) -> Group:
        """Record a finished episode; returns its group (closed already when it was the last one)."""
        self.collector.admit()
        await self.collector.end_session(episode.session_id)
        await self.writer.settled()  # the session's turns are on disk before its episode
        try:
            group = await self.db(self.store.record_episode, episode)
        except UnknownSession as exc:
            raise NotRecorded(str(exc), param="session_id", code="session_not_found") from exc
        except EpisodeConflict as exc:
            raise Conflict(str(exc), param="session_id", code="episode_conflict") from exc
        except TRANSIENT as exc:
            self.writer.failed(exc)
            raise RecordingRefused(
                f"the store cannot record the episode now: {exc}", code="store_unavailable"
            ) from exc
        if group.received < group.size:
            return group
        if self._waits_for_judge(episode):  # judge calls may take long: the reply does not wait
            task = asyncio.get_running_loop().create_task(self._close(group.id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return group
        return await self._close(group.id)

    async def close(self, group_id: str, reason: str | None) -> Group:
        """Close an open group now, with the episodes it has (a runner whose other episodes never
        reached the server says so); a group closed already is returned as it is."""
        group = await self.db(self.store.group, group_id)
        if group is None:
            raise NotRecorded(f"no group {group_id!r} was recorded", param="group_id", code="group_not_found")
        if group.status != GROUP_OPEN:
            return group
        short = f"closed with {group.received} of {group.size} episodes" + (f": {reason}" if reason else "")
        return await self._close(group_id, short)

    def _waits_for_judge(self, episode: Episode) -> bool:
        return episode.train and self.method is not None and self.method.wants_prm and self.judge is not None

    async def _close(self, group_id: str, short: str | None = None) -> Group:
        """Close the group with its episodes; `short` says why it closes with fewer than G."""
        episodes: list[Episode] = await self.db(self.store.group_episodes, group_id)
        outcome = await self._outcome(episodes)
        if short is not None:
            reason = f"{short}; {outcome.reason}" if outcome.reason else short
            outcome = dataclasses.replace(outcome, reason=reason)
        stats = (outcome.mean, outcome.std)
        close = functools.partial(
            self.store.close_group,
            group_id=group_id,
            status=outcome.status,
            reason=outcome.reason,
            stats=stats,
            samples=outcome.samples,
        )
        await self.writer.write(close)
        self.closed[outcome.status] += 1
        self.samples += len(outcome.samples)
        log.info(
            "group %s: %s%s, %d sample(s)",
            group_id,
            outcome.status,
            f" ({outcome.reason})" if outcome.reason else "",
            len(outcome.samples),
        )
        group = await self.db(self.store.group, group_id)
        return group if group.status != GROUP_OPEN else _as(group, outcome)

    async def _outcome(self, episodes: list[Episode]) -> GroupOutcome:
        if not all(e.train for e in episodes):
            return GroupOutcome(
                status=GROUP_EVAL, reason="evaluation episodes", mean=None, std=None, samples=[]
            )
        if self.method is None:
            reason = f"the server's method is {self.method_name!r}, not grpo"
            return GroupOutcome(status=GROUP_DROPPED, reason=reason, mean=None, std=None, samples=[])
        sessions = [e.session_id for e in episodes]
        if self.method.wants_prm and self.judge is not None:
            await self.judge.settled(sessions)
            await self.writer.settled()
        return self.method.group(await self.db(self._episode_turns, episodes))

    def _episode_turns(self, episodes: list[Episode]) -> list[EpisodeTurns]:
        out = []
        for e in episodes:
            turns = list(self.store.turns(e.session_id))
            judgments = {t.id: j for t in turns if (j := self.store.latest_judgment(t.id)) is not None}
            out.append(EpisodeTurns(e.reward, turns, judgments))
        return out


def _as(group: Group, outcome: GroupOutcome) -> Group:
    """The group as closed, while its close waits in the writer's backlog (the store refused it)."""
    group.status, group.reason, group.samples = outcome.status, outcome.reason, len(outcome.samples)
    group.reward_mean, group.reward_std = outcome.mean, outcome.std
    return group
