"""The experiment against one server: measure, let simulated users talk, measure each new version.

1. **Measure** (`measure`): every held-out task's opening message is sent once, greedy
   (temperature 0) and marked `X-Turn-Type: side`, so it is never trained on; the
   persona scores each first answer, and the point is their mean.
2. **Train** (`Traffic`): `concurrency` simulated users hold conversations on the
   training tasks at temperature 1: opening message, answer, the persona's reply, and so
   on until the persona is done. Each answer is also rated through `POST /v1/feedback`
   (rating and comment) unless feedback is off, before the next message is sent; the
   conversation's closing message is sent with `session_done`, its own answer capped at
   a few tokens (nobody reads it).
3. Whenever `/healthz` shows a newer version, the users pause, the held-out tasks are
   measured again, and they go on, until `steps` versions past the start are measured.

Users are paced (clawrl.eval.pacing) so that each training step is measured; without ratings
they hold their next messages while a full batch waits for the trainer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass, field

from clawrl.eval.client import Answer, EvalClient, EvalError, Unanswered
from clawrl.eval.pacing import Backlog, Pacer, expected_samples
from clawrl.eval.personas.base import Persona
from clawrl.eval.tasks import Task
from clawrl.version_folder import version_number

log = logging.getLogger(__name__)
CLOSING_MAX_TOKENS = 8  # the answer to "thanks" is never rated: keep it cheap


@dataclass(frozen=True)
class Settings:
    """How one experiment runs (the `clawrl eval` options)."""

    steps: int
    max_tokens: int = 128
    concurrency: int = 4
    feedback: bool = True
    samples_per_step: int | None = None  # pacing budget; None: unpaced
    rewrites: bool = False  # the server makes hint rewrites (its /healthz): a hinted -1 makes one more
    stall_s: float = 120.0
    max_wall_s: float = 7200.0
    poll_s: float = 1.0
    seed: int = 0
    via: str = "api"  # api: bare requests; openclaw: through the OpenClaw agent (eval/via_openclaw.py)
    points_every: int = 4  # sessions between two points on a server with no trainer (memory only)


@dataclass
class Point:
    """One measurement of the held-out tasks."""

    step: int  # versions past the start
    version: str
    score: float  # mean of `scores`
    scores: list[float]  # per held-out task, in task order
    answer_versions: list[str]  # the versions that wrote the answers (one, unless a swap came mid-way)
    elapsed_s: float  # since the experiment began
    self_rouge_l: float | None = None  # between the answers to different held-out tasks (guard/collapse.py)
    sessions: int = 0  # training sessions opened before this measurement
    # With the server's memory on: the same tasks answered with its memory block (X-Memory: on);
    # `score` is then the bare policy's (X-Memory: off). None: memory off.
    score_memory: float | None = None
    scores_memory: list[float] | None = None
    experiences: dict[str, int] | None = None  # the server's experiences by state (GET /v1/memory)


@dataclass
class Outcome:
    """What one experiment measured and did."""

    method: str
    judge: str
    points: list[Point] = field(default_factory=list)
    conversations: int = 0
    answers: int = 0  # training answers rated (or, without feedback, answered)
    wall_s: float = 0.0
    # done | timeout | held (the last steps' versions were held, never served) | unanswered (a later
    # point's held-out tasks all went unanswered: the run stopped there, what it measured kept) |
    # interrupted (Ctrl-C or SIGTERM: the report keeps what was measured until then)
    stopped: str = "done"
    held: list[str] = field(default_factory=list)  # versions the canary gate held (never measured)
    # Per training session, in the order they were opened: whether its first answer passed the
    # persona's checks (rated +1: score >= GOOD_ENOUGH). Sessions with no first answer are left out.
    sessions: list[bool] = field(default_factory=list)
    session_versions: list[str] = field(default_factory=list)  # the version that gave each first answer
    unanswered: int = 0  # turns that gave no answer (through OpenClaw: failed or timed out)


class NoAnswers(EvalError):
    """No held-out task got an answer (the agent cannot reach the server, say): nothing to score."""


async def measure(
    client: EvalClient,
    persona: Persona,
    tasks: list[Task],
    max_tokens: int,
    label: str,
    memory: bool | None = None,
) -> tuple[list[float], list[str], list[str | None]]:
    """(scores, answer versions, answers): the persona's score of each task's first greedy answer,
    and the answers, in task order (None for a task left unanswered: it is like no other answer).
    `memory`: the server's memory block asked for (True) or refused (False); None: its default."""

    async def one(task: Task) -> tuple[float, str, str | None]:
        messages = [{"role": "user", "content": persona.first_message(task)}]
        answer = await client.chat(
            messages,
            f"eval-{label}-{task.id}",
            temperature=0.0,
            max_tokens=max_tokens,
            side=True,
            done=True,
            memory=memory,
        )
        return await asyncio.to_thread(persona.score, task, answer.text), answer.version, answer.text

    errors: list[str] = []

    async def one_or_none(task: Task) -> tuple[float, str, str | None]:
        try:
            return await one(task)
        except Unanswered as exc:  # counted by the client; no answer scores nothing
            log.warning("held-out task %s: no answer (%s)", task.id, exc)
            errors.append(str(exc))
            return 0.0, "", None

    results = await asyncio.gather(*(one_or_none(task) for task in tasks))
    if tasks and len(errors) == len(tasks):  # a score of 0 would read as the policy's; it is nobody's
        raise NoAnswers(f"no held-out task was answered ({label}); the last error: {errors[-1][-2000:]}")
    return [r[0] for r in results], sorted({r[1] for r in results if r[1]}), [r[2] for r in results]


class Traffic:
    """Simulated users holding training conversations, paced, pausable."""

    def __init__(
        self, client: EvalClient, persona: Persona, tasks: list[Task], method: str, settings: Settings
    ) -> None:
        if not tasks:
            raise EvalError("no training tasks left: lower --held-out")
        order = list(tasks)
        random.Random(settings.seed).shuffle(order)
        self.client, self.persona, self.method, self.settings = client, persona, method, settings
        self._tasks = itertools.cycle(order)
        self.opened = 0  # training sessions opened
        self.session_limit: int | None = None  # open no session past this many (None: no limit)
        self.pacer = Pacer(settings.samples_per_step if settings.feedback else None, stall_s=settings.stall_s)
        self.backlog = Backlog(None if settings.feedback else settings.samples_per_step, settings.stall_s)
        self._open = True
        self._changed = asyncio.Condition()
        self._in_flight = 0
        self.conversations = self.answers = 0
        # session number -> (its first answer passed, the version that gave that answer)
        self._first: dict[int, tuple[bool, str]] = {}

    def begin(self, version: str) -> list[asyncio.Task[None]]:
        """Start the users, counting steps from `version`; returns their tasks."""
        number = version_number(version)
        self.pacer.start = self.pacer.current = number
        return [
            asyncio.create_task(self._user(), name=f"clawrl-eval-user-{i}")
            for i in range(self.settings.concurrency)
        ]

    async def pause(self) -> None:
        """Let no new answer start, and wait until none is being generated."""
        async with self._changed:
            self._open = False
            await self._changed.wait_for(lambda: self._in_flight == 0)

    async def resume(self, version: str) -> None:
        async with self._changed:
            self._open = True
            self.pacer.served(version_number(version))
            self.backlog.made(version_number(version))
            self._changed.notify_all()

    async def seen(self, health: dict) -> None:
        """What `/healthz` shows: without ratings, a full batch pending holds the next messages."""
        samples = health.get("samples") or {}
        pending = int(samples.get("ready", 0)) + int(samples.get("training", 0))
        async with self._changed:
            held = self.backlog.holding
            self.backlog.seen(
                time.monotonic(), pending, max(self.pacer.current, version_number(health["version"]))
            )
            if self.backlog.holding and not held:
                log.info("%d samples pending for the trainer: the users hold their next messages", pending)
            if held and not self.backlog.holding:
                self._changed.notify_all()

    async def share(self, backlog: Backlog) -> None:
        """Hold on `backlog` from now on, one several users' traffic shares (`eval --users`), which its
        owner updates; `wake` lets the users go on when it lets go."""
        async with self._changed:
            self.backlog = backlog

    async def wake(self) -> None:
        """Let the users check again whether they may go on (the shared backlog let go)."""
        async with self._changed:
            self._changed.notify_all()

    async def poke(self) -> None:
        """Re-check the pacing budget now (after a stall grant)."""
        async with self._changed:
            now = time.monotonic()
            if self.pacer.unstall(now) or self.backlog.stalled(now):
                log.warning("no new version after %.0f s of waiting; the users go on", self.pacer.stall_s)
                self._changed.notify_all()

    @property
    def sessions(self) -> list[bool]:
        """Whether each session's first answer passed the persona's checks, in session order."""
        return [self._first[n][0] for n in sorted(self._first)]

    @property
    def session_versions(self) -> list[str]:
        """The version that gave each session's first answer, in the order of `sessions`."""
        return [self._first[n][1] for n in sorted(self._first)]

    async def open_until(self, sessions: int) -> None:
        """Let the users open sessions until `sessions` were opened in all, then wait."""
        async with self._changed:
            self.session_limit = sessions
            self._changed.notify_all()

    def _may_open(self) -> bool:
        return self.session_limit is None or self.opened < self.session_limit

    async def _user(self) -> None:
        while True:
            async with self._changed:
                await self._changed.wait_for(self._may_open)
                self.opened += 1
                task, number = next(self._tasks), self.opened
            await self._converse(task, f"train-{self.method}-{number:05d}-{task.id}", number)
            self.conversations += 1

    async def _converse(self, task: Task, session_id: str, number: int) -> None:
        messages = [{"role": "user", "content": self.persona.first_message(task)}]
        for turn in range(1, self.persona.max_turns + 1):
            try:
                answer = await self._answer(messages, session_id)
            except Unanswered as exc:  # counted by the client: this conversation ends here
                log.warning("session %s: no answer (%s)", session_id, exc)
                return
            reply = await asyncio.to_thread(self.persona.reply, task, answer.text, turn)
            if turn == 1:  # its rating is +1 from GOOD_ENOUGH on: the persona's checks passed
                self._first[number] = (reply.rating > 0, answer.version)
            await self._rate(answer, reply.rating, reply.comment)
            messages.append({"role": "assistant", "content": answer.text})
            if reply.message is None:
                return
            messages.append({"role": "user", "content": reply.message})
            if reply.done or turn == self.persona.max_turns:
                await self._close(messages, session_id)
                return

    async def _close(self, messages: list[dict[str, str]], session_id: str) -> None:
        """Send the closing message (its answer capped, nobody reads it). Through OpenClaw a capped
        answer can come back as a failed turn ("Agent couldn't generate a response"): counted as
        unanswered, as any other, and the conversation is over anyway."""
        try:
            await self.client.chat(
                messages, session_id, temperature=1.0, max_tokens=CLOSING_MAX_TOKENS, done=True
            )
        except Unanswered as exc:
            log.warning("session %s: its closing message got no answer (%s)", session_id, exc)

    async def _answer(self, messages: list[dict[str, str]], session_id: str) -> Answer:
        """An answer, once the users are not paused for a measurement or holding for the trainer."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._open and not self.backlog.holding)
            self._in_flight += 1
        try:
            return await self.client.chat(
                messages, session_id, temperature=1.0, max_tokens=self.settings.max_tokens
            )
        finally:
            async with self._changed:
                self._in_flight -= 1
                self._changed.notify_all()

    async def _rate(self, answer: Answer, rating: int, comment: str | None) -> None:
        """Rate the answer, once the pacing budget has room for the samples the rating makes."""
        self.answers += 1
        if not self.settings.feedback:
            return
        samples = expected_samples(self.method, rating, comment, rewrites=self.settings.rewrites)
        async with self._changed:
            await self._changed.wait_for(lambda: self._open and self.pacer.take(time.monotonic(), samples))
        await self.client.feedback(answer.id, rating, comment)
