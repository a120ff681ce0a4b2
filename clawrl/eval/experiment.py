"""One method's experiment against one live server: v0, then each new version, measured.

`run_experiment` measures the held-out tasks at the served version, starts the
simulated users (`clawrl.eval.scenario.Traffic`), and each time `/healthz` shows a
newer version pauses them, measures again and lets them go on, until `steps` versions
past the start are measured or `max_wall_s` has passed (then it stops with what it has).
On a server with memory on, every point is measured twice: the bare policy (`score`) and
with the memory block (`score_memory`). A server with memory on and no trainer (memory
only) makes no version: a point is measured every `points_every` sessions instead.

A version the server's canary gate holds is never served, so it is never measured:
when `/healthz` shows a newly held version, the users' next step opens as if it had
been served (the trainer goes on), the version is listed in `Outcome.held`, and it
counts as a step. The run ends when `steps` versions past the start were made,
served or held.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from clawrl.eval.client import EvalClient, EvalError
from clawrl.eval.personas.base import Persona
from clawrl.eval.scenario import NoAnswers, Outcome, Point, Settings, Traffic, measure
from clawrl.eval.tasks import Task
from clawrl.guard.collapse import self_rouge_l
from clawrl.version_folder import version_number

log = logging.getLogger(__name__)


def check_learning(health: dict[str, Any], memory_only: bool = False) -> tuple[str, str]:
    """(judge name, method) of a server that can learn; EvalError saying why one cannot.
    `memory_only`: a server with no trainer learns too if its memory is on (`memory_on`)."""
    judge, trainer = health.get("judge") or {}, health.get("trainer") or {}
    if judge.get("status", "off") == "off":
        raise EvalError("the server judges nothing (judge or collection off), so it cannot learn")
    if trainer.get("status", "off") == "off" and not (memory_only and memory_on(health)):
        raise EvalError("the server runs no trainer (train.enabled = false), so no version will come")
    return str(judge.get("judge", "?")), str(judge.get("method", "?"))


def rewrites_on(health: dict[str, Any]) -> bool:
    """Whether the server makes hint rewrites, one more sample for a hinted turn judged not good."""
    return bool((health.get("judge") or {}).get("hint_rewrite"))


def memory_on(health: dict[str, Any]) -> bool:
    """Whether the server adds its memory block to prompts (memory.enabled, docs/memory.md)."""
    return (health.get("memory") or {}).get("status") == "on"


def trains(health: dict[str, Any]) -> bool:
    """Whether the server runs a trainer (so versions will come)."""
    return (health.get("trainer") or {}).get("status", "off") != "off"


async def run_experiment(
    client: EvalClient,
    persona: Persona,
    train: list[Task],
    held_out: list[Task],
    settings: Settings,
    seen: list[Outcome] | None = None,
) -> Outcome:
    """Measure, train and measure again until `settings.steps` versions are measured. `seen`: the
    outcome is appended to it once made, so that a caller stopped by a signal (Ctrl-C, SIGTERM)
    still holds what was measured; it is then marked `stopped = "interrupted"`."""
    started = time.monotonic()
    health = await client.health()
    judge, method = check_learning(health, memory_only=True)
    settings = replace(settings, rewrites=rewrites_on(health))
    outcome = Outcome(method=method, judge=judge)
    if seen is not None:
        seen.append(outcome)
    start, memory = str(health["version"]), memory_on(health)
    await measure_point(
        client=client,
        persona=persona,
        tasks=held_out,
        settings=settings,
        start=start,
        version=start,
        started=started,
        memory=memory,
        into=outcome.points,
    )
    if not trains(health):  # no trainer: nothing to pace the users to (sessions are counted instead)
        settings = replace(settings, samples_per_step=None)
    traffic = Traffic(client=client, persona=persona, tasks=train, method=method, settings=settings)
    users = traffic.begin(start)
    run = Run(
        client=client,
        persona=persona,
        held_out=held_out,
        settings=settings,
        traffic=traffic,
        users=users,
        outcome=outcome,
        started=started,
    )
    try:
        if trains(health):
            await _follow(run, memory)
        else:  # memory only: a point every `points_every` sessions
            await follow_sessions(run)
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        outcome.stopped = "interrupted"
        raise
    finally:
        try:
            await stop_users(users)
        finally:  # what the users did, also when interrupted (the caller then reports it)
            outcome.conversations, outcome.answers = traffic.conversations, traffic.answers
            outcome.sessions, outcome.session_versions = traffic.sessions, traffic.session_versions
            outcome.unanswered = client.unanswered
            outcome.wall_s = time.monotonic() - started
    return outcome


@dataclass
class Run:
    """What one experiment's loop works with: the server, the users and what was measured so far."""

    client: EvalClient
    persona: Persona
    held_out: list[Task]
    settings: Settings
    traffic: Traffic
    users: list[asyncio.Task[None]]
    outcome: Outcome
    started: float


async def _follow(run: Run, memory: bool) -> None:
    """Measure each newer version, the users paused meanwhile, until enough steps or the deadline."""
    client, persona, held_out, settings = run.client, run.persona, run.held_out, run.settings
    traffic, users, outcome, started = run.traffic, run.users, run.outcome, run.started
    start = version = outcome.points[0].version
    while outcome.points[-1].step < settings.steps:
        deadline = started + settings.max_wall_s
        newer = await _next_version(
            client=client,
            traffic=traffic,
            users=users,
            current=version,
            deadline=deadline,
            outcome=outcome,
            start=start,
            steps=settings.steps,
        )
        if newer is None:
            outcome.stopped = "held" if made(outcome, start) >= settings.steps else "timeout"
            return
        await traffic.pause()
        try:
            await measure_point(
                client=client,
                persona=persona,
                tasks=held_out,
                settings=settings,
                start=start,
                version=newer,
                started=started,
                memory=memory,
                sessions=traffic.opened,
                into=outcome.points,
            )
        except NoAnswers as exc:
            unanswered(outcome, exc)
            return
        version = newer
        await traffic.resume(version)


async def follow_sessions(run: Run) -> None:
    """Memory only (no trainer, memory on): a point after every `points_every` sessions. The users
    open that many, every one of them ends, the judge's queue drains (the lessons of their last
    turns are learnt then; at most `stall_s`), and the held-out tasks are measured with and without
    memory, until `steps` points past the first or the deadline."""
    client, persona, held_out, settings = run.client, run.persona, run.held_out, run.settings
    traffic, users, outcome, started = run.traffic, run.users, run.outcome, run.started
    start, every = outcome.points[0].version, settings.points_every
    deadline = started + settings.max_wall_s
    for step in range(1, settings.steps + 1):
        await traffic.open_until(step * every)
        while traffic.conversations < step * every:
            if time.monotonic() > deadline:
                outcome.stopped = "timeout"
                return
            raise_failed(users)
            await asyncio.sleep(settings.poll_s)
        drained = time.monotonic() + settings.stall_s
        while time.monotonic() < min(drained, deadline):
            judge = (await client.health()).get("judge") or {}
            if not judge.get("queued") and not judge.get("in_flight"):
                break
            await asyncio.sleep(settings.poll_s)
        await traffic.pause()
        try:
            await measure_point(
                client=client,
                persona=persona,
                tasks=held_out,
                settings=settings,
                start=start,
                version=start,
                started=started,
                memory=True,
                sessions=traffic.opened,
                step=step,
                into=outcome.points,
            )
        except NoAnswers as exc:
            unanswered(outcome, exc)
            return
        await traffic.resume(start)


def unanswered(outcome: Outcome, exc: NoAnswers) -> None:
    """A later point got no answer at all: the run stops there and keeps what it measured (the first
    point's NoAnswers ends the eval instead: nothing was measured)."""
    log.error("%s", exc)
    print(f"clawrl eval: stopped: {exc}", flush=True)
    outcome.stopped = "unanswered"


async def measure_point(
    client: EvalClient,
    persona: Persona,
    tasks: list[Task],
    settings: Settings,
    start: str,
    version: str,
    started: float,
    who: str = "",
    *,
    memory: bool = False,
    sessions: int = 0,
    step: int | None = None,
    into: list[Point],
) -> None:
    """Measure the held-out tasks at `version` (`who`: the simulated user, printed before the step).
    `memory` (the server's is on): the bare policy's answers (`score`) and, again, with the memory
    block (`score_memory`). `step`: the point's number (default: versions past `start`). The point
    is appended to `into` before its line is printed: a caller who stops the eval on seeing the
    line (Ctrl-C, SIGTERM) finds it in the report."""
    label = f"{start}-{version}" + (f"-s{sessions}" if step is not None else "")
    bare = False if memory else None
    scores, seen, answers = await measure(
        client=client, persona=persona, tasks=tasks, max_tokens=settings.max_tokens, label=label, memory=bare
    )
    step = version_number(version) - version_number(start) if step is None else step
    elapsed = time.monotonic() - started
    alike = self_rouge_l([a for a in answers if a is not None])
    point = Point(
        step=step,
        version=version,
        score=sum(scores) / len(scores),
        scores=scores,
        answer_versions=seen,
        elapsed_s=elapsed,
        self_rouge_l=alike,
        sessions=sessions,
    )
    shown = f"held-out score {point.score:.3f}"
    if memory:
        point.scores_memory, *_ = await measure(
            client=client,
            persona=persona,
            tasks=tasks,
            max_tokens=settings.max_tokens,
            label=f"{label}-memory",
            memory=True,
        )
        point.score_memory = sum(point.scores_memory) / len(point.scores_memory)
        point.experiences = await client.experiences()
        shown += f" ({point.score_memory:.3f} with memory; experiences {point.experiences})"
    into.append(point)
    log.info("step %d (%s): %s", step, version, shown)
    print(f"clawrl eval: {who}step {step} ({version}): {shown}", flush=True)


async def _next_version(
    client: EvalClient,
    traffic: Traffic,
    users: list[asyncio.Task[None]],
    current: str,
    deadline: float,
    outcome: Outcome,
    start: str,
    steps: int,
) -> str | None:
    """The first version newer than `current` that `/healthz` shows served; None at the deadline,
    or once `steps` versions were made and the newest ones were held."""
    while time.monotonic() < deadline:
        raise_failed(users)
        health = await client.health()
        check_learning(health)
        await traffic.seen(health)
        if version_number(health["version"]) > version_number(current):
            return str(health["version"])
        held = ((health.get("guard") or {}).get("last_held") or {}).get("version")
        if held and held not in outcome.held and version_number(held) > version_number(current):
            outcome.held.append(held)
            step = version_number(held) - version_number(start)
            print(f"clawrl eval: step {step} ({held}): held by the canary gate, not served", flush=True)
            if made(outcome, start) >= steps:
                return None
            await traffic.resume(held)  # its step's samples are spent: the users' next step opens
        await traffic.poke()
        await asyncio.sleep(traffic.settings.poll_s)
    return None


def made(outcome: Outcome, start: str) -> int:
    """Versions made past `start`, served (measured) or held."""
    newest = [version_number(p.version) for p in outcome.points] + [version_number(v) for v in outcome.held]
    return max(newest) - version_number(start)


def raise_failed(users: list[asyncio.Task[None]]) -> None:
    """Re-raise the error of a simulated user that stopped (their loops never end otherwise)."""
    for user in users:
        if user.done() and not user.cancelled() and user.exception() is not None:
            raise EvalError(f"a simulated user failed: {user.exception()}") from user.exception()


async def stop_users(users: list[asyncio.Task[None]]) -> None:
    """Cancel the simulated users' tasks and wait until they have ended."""
    for user in users:
        user.cancel()
    await asyncio.gather(*users, return_exceptions=True)
