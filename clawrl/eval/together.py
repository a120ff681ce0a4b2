"""Several simulated users on one live server at once, each measured on their own line of versions.

`run_together` is `clawrl.eval.experiment.run_experiment` for several users (`clawrl eval --users`):
each user (`SimUser`) talks under their own key (their own `EvalClient`) with their own persona and
their own paced traffic (`clawrl.eval.scenario.Traffic`), all at once. The admin client reads
`/healthz`'s details (is it learning, which version the canary gate held); each user's own
`/healthz` gives the version that user is served: their own (`brief/v2`) with an adapter per user,
the shared `v2` otherwise. Whenever any user's version is newer than the one last measured for
them, every user's traffic pauses, those users' held-out tasks are measured with their own key
and persona, and the traffic goes on. A user is done once `steps` versions of their line were
made (served or held); their traffic then stops, so it trains their line no further.

A held version is seen in `guard.last_held`, the newest held of any line: a user counts it when it
is on their line. Two lines' holds between two polls show only the newer one; the other user's
pacing then waits `stall_s` before going on (their next served version still counts the steps).

Without ratings every user holds their next messages on one shared `Backlog`: while the admin's
`/healthz` shows enough samples ready or in training that some line has a full batch
(`lines * (batch - 1) + 1`: with fewer, every line could be one short), until a version of any line
is made (served or held), fewer are pending (samples gone stale), or `stall_s` passes; as the
one-user eval holds, so the trainer has the machine between steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field

from clawrl.eval.client import EvalClient
from clawrl.eval.experiment import (
    check_learning,
    made,
    measure_point,
    raise_failed,
    rewrites_on,
    stop_users,
    unanswered,
)
from clawrl.eval.pacing import Backlog
from clawrl.eval.personas.base import Persona
from clawrl.eval.scenario import NoAnswers, Outcome, Settings, Traffic
from clawrl.eval.tasks import Task
from clawrl.eval.users import per_step_share
from clawrl.version_folder import version_number, version_user

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimUser:
    """One simulated user: a persona under its own key, on a line of versions (`users.line_of`)."""

    name: str
    persona: Persona
    client: EvalClient  # with this user's key
    line: str


@dataclass
class Track:
    """One user during the experiment: their traffic and what was measured of them."""

    user: SimUser
    outcome: Outcome
    traffic: Traffic
    start: str  # the version they were served when it began
    version: str  # the newest version measured for them
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    done: bool = False


async def run_together(
    admin: EvalClient,
    users: list[SimUser],
    train: list[Task],
    held_out: list[Task],
    settings: Settings,
    seen: dict[str, Outcome] | None = None,
) -> dict[str, Outcome]:
    """Measure every user at their start, then each user's every new version, until each has
    `settings.steps` versions made or `settings.max_wall_s` has passed; each user's outcome. `seen`
    gets every user's outcome once made, so that a caller stopped by a signal still holds what was
    measured; a user not done by then is marked `stopped = "interrupted"`."""
    started = time.monotonic()
    health = await admin.health()
    judge, method = check_learning(health)
    settings = dataclasses.replace(settings, rewrites=rewrites_on(health))
    tracks = [
        await _track(user=u, users=users, method=method, judge=judge, train=train, settings=settings)
        for u in users
    ]
    if seen is not None:
        seen.update({t.user.name: t.outcome for t in tracks})
    backlog = Backlog(backlog_size(settings, len({u.line for u in users})), settings.stall_s)
    try:
        for t in tracks:
            await _measure(t, held_out, settings, started)
            await t.traffic.share(backlog)
        for t in tracks:
            t.tasks = t.traffic.begin(t.start)
        await _follow(
            admin=admin, tracks=tracks, held_out=held_out, settings=settings, started=started, backlog=backlog
        )
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        for t in tracks:
            t.outcome.stopped = t.outcome.stopped if t.done else "interrupted"
        raise
    finally:
        try:
            await stop_users([task for t in tracks for task in t.tasks])
        finally:  # what the users did, also when interrupted (the caller then reports it)
            for t in tracks:
                _close(t, started)
    return {t.user.name: t.outcome for t in tracks}


async def _track(
    user: SimUser, users: list[SimUser], method: str, judge: str, train: list[Task], settings: Settings
) -> Track:
    """`user`'s track: their traffic paced to their share of their line's steps."""
    share = per_step_share(settings.samples_per_step, sum(u.line == user.line for u in users))
    traffic = Traffic(
        client=user.client,
        persona=user.persona,
        tasks=train,
        method=method,
        settings=dataclasses.replace(settings, samples_per_step=share),
    )
    start = await user.client.version()
    return Track(
        user=user, outcome=Outcome(method=method, judge=judge), traffic=traffic, start=start, version=start
    )


def backlog_size(settings: Settings, lines: int) -> int | None:
    """Samples pending at which the users hold (without ratings): enough that one of `lines` lines has
    a full batch; None (no hold) with ratings, which the users' `Pacer`s pace instead."""
    if settings.feedback or settings.samples_per_step is None:
        return None
    return lines * (settings.samples_per_step - 1) + 1


async def _follow(
    admin: EvalClient,
    tracks: list[Track],
    held_out: list[Task],
    settings: Settings,
    started: float,
    backlog: Backlog,
) -> None:
    """Poll until every user is done: count holds, measure newer versions, hold the users while a
    batch waits (without ratings), re-check stalls."""
    deadline = started + settings.max_wall_s
    while not all(t.done for t in tracks):
        if time.monotonic() >= deadline:
            for t in tracks:
                t.outcome.stopped = t.outcome.stopped if t.done else "timeout"
            return
        raise_failed([task for t in tracks for task in t.tasks])
        health = await admin.health()
        check_learning(health)
        held = ((health.get("guard") or {}).get("last_held") or {}).get("version")
        newer: dict[str, str] = {}
        made_now = 0  # versions made on every line, as the users have seen them
        for t in tracks:
            if held and not t.done:
                await _count_held(t, held, settings.steps)
            made_now += len(t.outcome.held)
            if t.done:
                made_now += version_number(t.version)
                continue
            served = await t.user.client.version()
            made_now += max(version_number(served), version_number(t.version))
            if version_number(served) > version_number(t.version):
                newer[t.user.name] = served
        if newer:
            await _measure_newer(
                tracks=tracks, newer=newer, held_out=held_out, settings=settings, started=started
            )
        await _hold(tracks, backlog, health, made_now)
        for t in tracks:
            if not t.done:
                await t.traffic.poke()
        await asyncio.sleep(settings.poll_s)


async def _hold(tracks: list[Track], backlog: Backlog, health: dict, made_now: int) -> None:
    """Update the shared backlog from the admin's `/healthz`; wake the users when it lets go."""
    samples = health.get("samples") or {}
    pending = int(samples.get("ready", 0)) + int(samples.get("training", 0))
    now, holding = time.monotonic(), backlog.holding
    backlog.made(made_now)
    if backlog.stalled(now):
        log.warning("no new version after %.0f s of holding; the users go on", backlog.stall_s)
    backlog.seen(now, pending, made_now)
    if holding and not backlog.holding:
        for t in tracks:
            await t.traffic.wake()


async def _count_held(t: Track, held: str, steps: int) -> None:
    """Count `held` if it is a new hold on `t`'s line: they are done when it was the last of their
    steps, else their traffic's next step opens (the trainer goes on)."""
    if version_user(held) != t.user.line or held in t.outcome.held:
        return
    if version_number(held) <= version_number(t.version):
        return
    t.outcome.held.append(held)
    step = version_number(held) - version_number(t.start)
    print(
        f"clawrl eval: {t.user.name}: step {step} ({held}): held by the canary gate, not served", flush=True
    )
    if made(t.outcome, t.start) >= steps:
        await _finish(t, "held")
    else:
        await t.traffic.resume(held)


async def _measure_newer(
    tracks: list[Track], newer: dict[str, str], held_out: list[Task], settings: Settings, started: float
) -> None:
    """Pause everyone's traffic, measure the users with a newer version, let the traffic go on."""
    active = [t for t in tracks if not t.done]
    for t in active:
        await t.traffic.pause()
    for t in active:
        if t.user.name in newer:
            t.version = newer[t.user.name]
            try:
                await _measure(t, held_out, settings, started)
            except NoAnswers as exc:
                unanswered(t.outcome, exc)
                await _finish(t, "unanswered")
    for t in active:
        if t.done:
            continue
        if t.outcome.points[-1].step >= settings.steps:
            await _finish(t, "done")  # before its next step's budget could open
        else:
            await t.traffic.resume(t.version)


async def _measure(t: Track, held_out: list[Task], settings: Settings, started: float) -> None:
    """`t`'s user's point at `t.version`, in their outcome before it is printed."""
    user = t.user
    await measure_point(
        client=user.client,
        persona=user.persona,
        tasks=held_out,
        settings=settings,
        start=t.start,
        version=t.version,
        started=started,
        who=f"{user.name}: ",
        into=t.outcome.points,
    )


async def _finish(t: Track, stopped: str) -> None:
    """`t`'s user has their steps: their traffic stops, so their line is trained no further by them."""
    t.done = True
    t.outcome.stopped = stopped
    await stop_users(t.tasks)


def _close(t: Track, started: float) -> None:
    t.outcome.conversations, t.outcome.answers = t.traffic.conversations, t.traffic.answers
    t.outcome.sessions, t.outcome.session_versions = t.traffic.sessions, t.traffic.session_versions
    t.outcome.unanswered = t.user.client.unanswered
    t.outcome.wall_s = time.monotonic() - started
