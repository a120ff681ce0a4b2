"""The trainer loop: ready samples in, published versions out, for as long as it runs.

Each pass:

1. Follow the store. If the latest published version is not the one the
   trainer holds (a `clawrl rollback`, another trainer before a restart), load
   it, weights and optimizer state, and go on from there.
2. Count the ready samples; with fewer than `batch_size`, wait (`poll_s`)
   and count again (a wait costs one count, not a read of the samples).
3. Look at the oldest ready samples. Defective ones (empty response,
   non-finite logprobs, over-long, unknown token ids) are marked `skipped`
   and samples more than `max_staleness` versions behind are marked `stale`,
   each with its reason; neither is ever trained on, and both stay in the
   store. With fewer than `batch_size` usable samples left, wait again.
4. Otherwise take the oldest `batch_size`, run one step, write
   `checkpoints/vN/` (weights, optimizer state, manifest), then publish vN in
   the store in one transaction with marking those samples `trained`; then
   log its metrics (`train/loggers.py`: metrics.jsonl, TensorBoard).

Crash safety: until that transaction commits, the samples stay `ready` and the
version does not exist, so a crash at any point loses at most the step in
progress and never trains a sample twice. A checkpoint folder that was written
but never published (a crash between the two writes) is moved aside as
`.vN-unpublished-<time>` when the trainer starts, never deleted.

A published version whose folder cannot be loaded (a file missing, truncated
or garbled) is logged and passed over, never retried: the trainer trains on
from the newest version that loads, and its next version names that one as
parent. It does not crash, so the supervisor does not restart it in a loop.

Writing a version's folder and row happens under `publish_lock`, which
`clawrl rollback` takes too. A rollback published while a step runs is found
under that lock: the step is dropped, and the next pass loads the rollback and
trains the same samples from there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from clawrl.store.db import Store
from clawrl.train.checkpoints import (
    CHECKPOINTS,
    CheckpointError,
    claim_next,
    publish_lock,
    save_version,
    set_aside,
)
from clawrl.train.loggers import StepLoggers
from clawrl.train.policy import Policy
from clawrl.train.trainer import triage
from clawrl.types import Sample, Version

log = logging.getLogger("clawrl.trainer")


class TrainLoop:
    def __init__(
        self, store: Store, policy: Policy, run_dir: Path, loggers: StepLoggers | None = None
    ) -> None:
        self.store = store
        self.policy = policy
        self.cfg = policy.cfg
        self.run_dir = Path(run_dir)
        self.loggers = loggers or StepLoggers([], run_dir)  # metrics.jsonl, TensorBoard (`train.loggers`)
        self.version = ""  # the version the policy is now; set by `resume`
        self.step = 0
        self._waiting_for: int | None = None
        self._broken: set[str] = set()  # published versions whose folder cannot be loaded

    def resume(self) -> None:
        """Set unpublished checkpoint folders aside and load the latest published version."""
        published = {v.name for v in self.store.versions()}
        root = self.run_dir / CHECKPOINTS
        for folder in sorted(root.glob("v*")) if root.is_dir() else []:
            if folder.is_dir() and folder.name not in published:
                set_aside(folder, "unpublished")
        self._follow(self.store.latest_version())

    def _follow(self, version: Version) -> None:
        """Become `version`; if it cannot be loaded, the newest earlier version that can."""
        try:
            self.policy.load(Path(version.path) if version.path else None)
        except CheckpointError as exc:
            log.error("cannot train from %s, passing over it: %s", version.name, exc)
            self._broken.add(version.name)
            self._follow(self._target())
            return
        self.version, self.step = version.name, version.step
        log.info("training from %s (step %d)", version.name, version.step)

    def _target(self) -> Version:
        """The newest published version that is not known to be broken (v0, the base, never is)."""
        return next(v for v in reversed(self.store.versions()) if v.name not in self._broken)

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Train until `should_stop()` is true (checked between steps and while waiting)."""
        while not should_stop():
            if not self.run_once():
                time.sleep(self.cfg.poll_s)

    def run_once(self) -> bool:
        """One pass (see the module docstring); True when it published a version."""
        latest = self.store.latest_version()
        if latest.name != self.version and latest.name not in self._broken:
            log.info("%s was published elsewhere (parent %s); following it", latest.name, latest.parent)
            self._follow(latest)
        # Count first: while waiting, each poll is one count, not a read of every sample's tokens.
        ready = self.store.count_samples("ready")
        usable = self._usable() if ready >= self.cfg.batch_size else []
        if len(usable) < self.cfg.batch_size:
            waiting = len(usable) if ready >= self.cfg.batch_size else ready
            if self._waiting_for != waiting:
                log.info("waiting for samples: %d/%d ready", waiting, self.cfg.batch_size)
                self._waiting_for = waiting
            return False
        self._waiting_for = None
        batch = usable[: self.cfg.batch_size]
        log.info("step %d: training %s on %d samples", self.step + 1, self.version, len(batch))
        metrics = self.policy.trainer.step(batch)
        return self._publish(batch, metrics)

    def _usable(self) -> list[Sample]:
        """The usable ready samples, oldest first; the rest are marked stale or skipped, with a reason."""
        t = triage(
            self.store.ready_samples(limit=4 * self.cfg.batch_size),
            self.version,
            self.cfg,
            self.policy.vocab_size,
        )
        for status, left_out, level in (
            ("skipped", t.skipped, logging.WARNING),
            ("stale", t.stale, logging.INFO),
        ):
            if left_out:
                self.store.leave_out_samples({s.id: why for s, why in left_out if s.id is not None}, status)
            for s, why in left_out:
                log.log(level, "%s sample %s of turn %s: %s", status, s.id, s.turn_id, why)
        return t.usable

    def _publish(self, batch: list[Sample], metrics: dict) -> bool:
        ids = [s.id for s in batch if s.id is not None]
        with publish_lock(self.run_dir):  # no rollback can take the name between folder and row
            latest = self.store.latest_version()
            if latest.name != self.version and latest.name not in self._broken:
                log.warning("%s was published during the step; dropping the step to follow it", latest.name)
                return False  # the samples are still ready: the next pass trains them from the new version
            name = claim_next(self.run_dir, latest.number)
            manifest = {"step": self.step + 1, "samples": ids, "metrics": metrics, "parent": self.version}
            path = save_version(self.run_dir, name, self.policy.model, self.policy.optimizer, manifest)
            version = Version(name, self.step + 1, str(path), metrics, parent=self.version)
            self.store.publish_version(version, trained=ids)
        self.version, self.step = name, version.step
        log.info(progress_line(version))
        self.loggers.step(version)
        return True


def progress_line(v: Version) -> str:
    """One line per published version, for the terminal and the log."""
    m = v.metrics
    reward = "-" if m.get("mean_reward") is None else f"{m['mean_reward']:+.2f}"
    return (
        f"published {v.name} (step {v.step}): {m['samples']} samples ({m['samples_rl']} rl, "
        f"{m['samples_opd']} opd), loss {m['loss']:.4f} (pg {m['pg_loss']:.4f}, kl {m['kl']:.4f}), "
        f"clip {m['clip_frac']:.3f}, reward {reward}, {m['tokens']} tokens in {m['step_s']:.2f} s "
        f"({m['tokens_per_s']:.0f} tokens/s)"
    )
