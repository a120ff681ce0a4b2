"""Groups of episodes: G episodes of one task, run concurrently, each posted when it ends.

GRPO compares the episodes of one task with each other, so a group is G episodes of
the same row (`--group-size`), with ids `<run>-g00007` (group) and `<run>-g00007-e3`
(the episode's session). At most `--concurrency` K episodes are in flight over all
groups (one semaphore), and the caller decides how many groups to start at once.

Each episode is posted to `POST /v1/episodes` as soon as it ends, with the group's id
and size; the server closes the group once all G are in. An episode that never asked
for an answer (its environment could not be built, its row did not fit `reset`) has no
session on the server and cannot be posted: it is kept here, in the report, as a dropped
episode that was not posted, and once the group's other episodes are in, the group is
closed with them (`POST /v1/episodes/groups/{id}/close`) rather than left open waiting
for episodes that will never come. A post the server refuses (404 unknown session, 409
posted twice or another group size, 400) is noted on the group and the run goes on.
With `shuffle` (`clawrl envs train --shuffle-rewards`, the control run), a group's episodes
are posted once all of them have ended, their rewards permuted among them: the same episodes,
the same group statistics, but a reward that no longer belongs to its episode (`info` keeps
the true one, and so does the report). Evaluation episodes are posted with `"train": false`
(groups of one, which the server records and closes as `eval`, never training on them):
posting ends their sessions.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from clawrl.envs.client import EnvClient
from clawrl.envs.episode import EpisodeResult, EpisodeSettings, Refused, run_episode
from clawrl.envs.load import EnvSpec
from clawrl.version_folder import version_rank

T = TypeVar("T")


@dataclass(frozen=True)
class Task:
    """One row of the tasks, with its id."""

    id: str
    row: dict[str, Any]


@dataclass
class GroupResult:
    """One group: its episodes, and what the server said of the group after the last post."""

    id: str
    task: str
    size: int
    episodes: list[EpisodeResult] = field(default_factory=list)
    status: str | None = None  # open | used | dropped, as the server last said; None: nothing posted
    reason: str | None = None
    samples: int = 0
    post_errors: list[str] = field(default_factory=list)

    @property
    def version(self) -> str | None:
        """The version of the group's earliest answer."""
        versions = [e.version for e in self.episodes if e.version]
        return min(versions, key=version_rank) if versions else None


class Runner:
    """Runs groups of `group_size` episodes of `env` with at most `concurrency` episodes in flight."""

    def __init__(
        self,
        client: EnvClient,
        env: EnvSpec,
        settings: EpisodeSettings,
        *,
        group_size: int = 1,
        concurrency: int = 4,
        reward_fn: Callable[..., Any] | None = None,
        post: bool = True,
        train: bool = True,
        on_episode: Callable[[EpisodeResult], None] | None = None,
        tag: str | None = None,
        shuffle: random.Random | None = None,
    ) -> None:
        if not 1 <= group_size <= 1024:
            raise ValueError(f"--group-size must be 1 to 1024, got {group_size}")
        if concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
        self.client, self.env, self.settings = client, env, settings
        self.group_size, self.concurrency = group_size, concurrency
        self.reward_fn, self.post, self.train = reward_fn, post, train
        self.on_episode = on_episode
        self.shuffle = shuffle  # the control run: rewards permuted within each group before posting
        self.tag = tag or f"ep-{uuid.uuid4().hex[:8]}"
        self._slots = asyncio.Semaphore(concurrency)
        self._groups = 0

    async def group(self, task: Task) -> GroupResult:
        """Run one group of `task` to its end: every episode run and posted."""
        group = GroupResult(f"{self.tag}-g{self._groups:05d}", task.id, self.group_size)
        self._groups += 1
        runs = [self._episode(task, group, i) for i in range(self.group_size)]
        group.episodes = await all_or_none(runs)
        if self.post and self.shuffle is not None:
            await self._post_shuffled(group)
        unposted = [e for e in group.episodes if e.turns == 0]
        if self.post and unposted and group.status == "open":  # the rest will never come: close it
            await self._close(group, f"{len(unposted)} never reached the server ({unposted[0].reason})")
        return group

    async def _close(self, group: GroupResult, reason: str) -> None:
        try:
            state = await self.client.close_group(group.id, reason)
        except Refused as exc:
            group.post_errors.append(f"{group.id}: close: {exc}")
            return
        group.status, group.reason = state.get("status"), state.get("reason")
        group.samples = int(state.get("samples") or 0)

    async def _episode(self, task: Task, group: GroupResult, index: int) -> EpisodeResult:
        async with self._slots:
            result = await run_episode(
                chat=self.client,
                factory=self.env.factory,
                row=task.row,
                task=task.id,
                session_id=f"{group.id}-e{index}",
                settings=self.settings,
                reward_fn=self.reward_fn,
            )
        if self.post and self.shuffle is None:
            await self._post(result, group)
        if self.on_episode is not None:
            self.on_episode(result)
        return result

    async def _post_shuffled(self, group: GroupResult) -> None:
        """Post the group's episodes once all have ended, their rewards permuted among them (the
        report keeps the true ones): what the model learns then is not the environment's signal."""
        reached = [e for e in group.episodes if e.turns > 0]
        rewards = [e.reward for e in reached]
        assert self.shuffle is not None
        self.shuffle.shuffle(rewards)
        for result in group.episodes:
            await self._post(result, group, rewards.pop(0) if result.turns > 0 else result.reward)

    async def _post(self, result: EpisodeResult, group: GroupResult, reward: float | None = None) -> None:
        """Post one episode (with `reward` instead of its own, for the shuffled control)."""
        if result.turns == 0:
            group.post_errors.append(
                f"{result.session_id}: not posted (the server recorded no answer of it): {result.reason}"
            )
            return
        try:
            body = episode_body(
                result=result, group_id=group.id, size=group.size, env=self.env.name, train=self.train
            )
            if self.shuffle is not None:
                body["reward"], body["info"]["true_reward"] = reward, result.reward
            answer = await self.client.post_episode(body)
        except Refused as exc:
            group.post_errors.append(f"{result.session_id}: {exc}")
            return
        state = answer.get("group") or {}
        group.status, group.reason = state.get("status"), state.get("reason")
        group.samples = int(state.get("samples") or 0)


def episode_body(
    result: EpisodeResult, group_id: str, size: int, env: str, train: bool = True
) -> dict[str, Any]:
    """The `POST /v1/episodes` body for one finished episode (`train` false: an evaluation episode)."""
    return {
        "session_id": result.session_id,
        "group_id": group_id,
        "group_size": size,
        "reward": result.reward,
        "reason": result.reason,
        "task": result.task,
        "env": env,
        "turns": result.turns,
        "tool_calls": result.tool_calls,
        "info": result.info(),
        "train": train,
    }


async def run_all(runner: Runner, tasks: list[Task], groups_at_once: int) -> list[GroupResult]:
    """One group of each task, at most `groups_at_once` groups started at a time, in task order."""
    gate = asyncio.Semaphore(max(1, groups_at_once))

    async def one(task: Task) -> GroupResult:
        async with gate:
            return await runner.group(task)

    return await all_or_none([one(t) for t in tasks])


async def all_or_none(coroutines: list[Awaitable[T]]) -> list[T]:
    """Their results in order; if one raises (the server is gone), the others are cancelled first,
    so nothing is left running against a closed client."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def groups_at_once(concurrency: int, group_size: int) -> int:
    """Groups to keep started so that K episode slots stay busy: ceil(K / G) + 1."""
    return -(-concurrency // group_size) + 1
