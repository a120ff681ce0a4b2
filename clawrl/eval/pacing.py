"""Pacing the simulated users so that every training step is measured.

The trainer takes `train.batch_size` ready samples per step, and the server serves
only its newest version. If the users sent many more ratings than a step needs, the
trainer would publish two versions back to back and the evaluation would never see
the first. So a user holds back a rating (and the next message, which follows it) once
the users have sent one step's worth of samples beyond the steps already published, and
goes on when the next version is served. This is client-side bookkeeping on what the
client itself sent: no private server state.

The rating is what is held, not the answer request: the next message always follows
the rating at once. (A next message arriving after its turn's sample was trained makes
the server judge the turn again, and the same answer would be trained twice.)

How many samples one explicit rating makes (the method's `per_rating`, see clawrl/algo/):

    rl        1 (an explicit rating is +1 or -1, never 0)
    opd       1 when a comment over 10 characters comes with it (the hint), else 0
    combine   1: an `opd` sample carrying the rating as its reward when hinted, else an `rl` one

and one more for a hinted -1 when the server makes hint rewrites (`train.hint_rewrite`, shown in
`/healthz` as the judge's `hint_rewrite`, for `opd` and `combine`: clawrl/algo/rewrite.py).

If the count is off (a sample skipped by the trainer, a hint refused), the users would
wait for a version that never comes; after `stall_s` without one they get one more
step's worth of budget, so an evaluation slows down but never hangs.

Without ratings there is nothing to hold back: the samples come from the judge reading each
next message. Unpaced, the users' agents and the judge then take the cores the trainer needs
(through OpenClaw on two cores a step took 22 minutes, the niced trainer at 7% of one core). So
`Backlog` holds the users' next messages instead, as a person's pauses would, once `/healthz`
shows a step's batch waiting for the trainer or being trained (ready + training samples >= the
batch), until the next version is made (served or held) or `stall_s` passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from clawrl.algo import get_method
from clawrl.judge.votes import MIN_HINT_CHARS


def expected_samples(method: str, rating: int, comment: str | None, rewrites: bool = False) -> int:
    """Training samples the server makes from one explicit rating (see the module docstring);
    `rewrites`: the server makes hint rewrites."""
    try:
        chosen = get_method(method)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    hinted = comment is not None and len(comment.strip()) > MIN_HINT_CHARS
    rewrite = rewrites and chosen.wants_hint and hinted and rating <= 0
    return chosen.per_rating(rating, hinted) + int(rewrite)


@dataclass
class Pacer:
    """The users' sample budget: `per_step` samples for each step not yet published.

    `per_step=None` paces nothing (the budget is unlimited). Versions are counted as
    steps from `start`, the version number served when the evaluation began.
    """

    per_step: int | None
    start: int = 0
    stall_s: float = 120.0
    current: int = 0
    sent: int = 0
    granted: int = 0  # extra budget given after stalls
    blocked_since: float | None = None

    def __post_init__(self) -> None:
        if self.per_step is not None and self.per_step < 1:
            raise ValueError(f"per_step must be at least 1, got {self.per_step}")
        self.current = max(self.current, self.start)

    @property
    def budget(self) -> int | None:
        """Samples the users may have sent by now; None when unpaced."""
        if self.per_step is None:
            return None
        return (self.current - self.start + 1) * self.per_step + self.granted

    def take(self, now: float, samples: int) -> bool:
        """Count a rating that makes `samples` samples, if the budget has room; else note the wait.

        Room means fewer samples sent than the budget, so a rating worth more than one sample
        (no method's is now) may pass it: the trainer leaves the rest for the next step.
        """
        budget = self.budget
        if samples == 0 or budget is None or self.sent < budget:
            self.sent += samples
            self.blocked_since = None
            return True
        if self.blocked_since is None:
            self.blocked_since = now
        return False

    def served(self, number: int) -> None:
        """Version `number` is served now: its step's budget opens."""
        if number > self.current:
            self.current = number
            self.blocked_since = None

    def unstall(self, now: float) -> bool:
        """Grant one more step's budget if the users have waited `stall_s`; True if granted."""
        if self.per_step is None or self.blocked_since is None or now - self.blocked_since < self.stall_s:
            return False
        self.granted += self.per_step
        self.blocked_since = None
        return True


@dataclass
class Backlog:
    """Without ratings: whether the users hold their next messages while a batch waits.

    `per_step=None` holds nothing (ratings are paced by `Pacer` instead). `until` is the version
    number the users wait for once a full batch was seen pending.
    """

    per_step: int | None
    stall_s: float = 120.0
    until: int | None = None
    since: float | None = None

    @property
    def holding(self) -> bool:
        return self.until is not None

    def seen(self, now: float, pending: int, newest: int) -> None:
        """`/healthz` showed `pending` samples ready or in training, `newest` the newest version made.
        Fewer than a batch pending lets the users go on even before a version: samples can leave
        without one (marked stale once newer versions were made), and the trainer then waits for
        more, as the users would wait for it."""
        if self.per_step is None:
            return
        if self.until is None and pending >= self.per_step:
            self.until, self.since = newest + 1, now
        elif self.until is not None and pending < self.per_step:
            self.until = self.since = None

    def made(self, number: int) -> None:
        """Version `number` was made (served or held): the users go on if it is the one awaited."""
        if self.until is not None and number >= self.until:
            self.until = self.since = None

    def stalled(self, now: float) -> bool:
        """Let the users go on after `stall_s` of holding; True if that happened now."""
        if self.since is None or now - self.since < self.stall_s:
            return False
        self.until = self.since = None
        return True
