"""The trainer loop: ready samples in, published versions out, for as long as it runs.

Each pass:

1. Follow the store. If the latest servable version (the newest one the
   canary gate did not hold) is not the one the trainer holds (a `clawrl
   rollback`, another trainer before a restart, or the trainer's own last
   version was held), load it, weights and optimizer state, and go on from
   there.
2. Count the ready samples; with fewer than `batch_size`, wait (`poll_s`)
   and count again (a wait costs one count, not a read of the samples). With users
   (`server.users`, docs/users.md) only the samples of the users in the file and of the
   `default` user count: a user removed from the file is no longer trained on (their samples
   stay `ready` in the store). With one shared policy (`train.adapters = "shared"`) every
   user's samples train it. With an adapter per user (`per_user`) the pass first picks whose
   adapter this step trains (`train/rotation.py`: users in turn among those with a full batch),
   follows that user's newest servable version (the base, v0, for a user without one: the
   adapter as built), and reads that user's samples only; everything below is per user: the
   staleness, the canary (KL on the user's own turns), the next name (`alice/v4`), the hold.
3. Look at the oldest ready samples (earliest deadline first: each is trained
   while it is still inside the staleness bound; newest first was measured and
   left out, see below). Defective ones (empty response,
   non-finite logprobs, over-long, unknown token ids) are marked `skipped`
   and samples more than `max_staleness` training steps behind are marked `stale`,
   each with its reason (the steps along the lineage of the version trained from, so
   held versions age nothing: train/lineage.py); neither is ever trained on, and both stay in the
   store. With fewer than `batch_size` usable samples left, wait again.
4. Otherwise claim the oldest `batch_size`, at most one of them a sample that failed a step
   before (`train/failures.py`) (`ready` -> `training`: a rating or a
   judgment landing during the step no longer touches them), run one step, run the canary on
   the new weights (`clawrl.guard`, when `guard.enabled`), write
   `checkpoints/vN/` (weights, optimizer state, manifest), then publish vN
   with the canary's status and figures in the store in one transaction with
   marking those samples `trained`; then log its metrics (`train/loggers.py`:
   metrics.jsonl, TensorBoard). A held vN is never served: the next pass goes
   back to the last servable version (step 1); with `guard.on_hold =
   "rollback"` a copy of that version is published first, as `clawrl
   rollback` does.
5. Still under the publish lock, after the publish: prune this user's line to what
   `train.keep_versions` and `train.keep_every` keep (old optimizer state; old weights neither
   served, newest, the newest held, rolled back to nor every N-th; `train/prune.py`).

Why oldest first: a replayed backlog (bench/backlog.py, five seeds) left 412 samples stale
newest first against 419 oldest first (2% fewer) and trained samples 1.46 versions behind
rather than 1.53; but under steady load newest first left a crashed step's samples, handed
back at the restart, to go stale behind newer ones (tests/service/test_trainer_group.py).
The importance weights correct for the staleness either way.

Crash safety: until that transaction commits, the samples stay claimed and the
version does not exist, so a crash at any point loses at most the step in
progress and never trains a sample twice. A step that raises counts a failed
attempt against each of its samples first (out of memory: after one retry split
in halves), and a batch holds at most one sample that failed before, so a sample
that breaks every step is `skipped` at its second failure and the others train
(`train/failures.py`). A step that fails or is dropped hands
its claims back at once; a trainer that starts hands back every claim a dead one
left (`Store.release_samples`: `ready` again, or `superseded` if the turn was
judged meanwhile). A checkpoint folder that was written
but never published (a crash between the two writes) is moved aside as
`.vN-unpublished-<time>` when the trainer starts, never deleted.

A published version whose folder cannot be loaded (a file missing, truncated
or garbled) is logged and passed over, never retried: the trainer trains on
from the newest version that loads, and its next version names that one as
parent. It does not crash, so the supervisor does not restart it in a loop.

Several ranks (`train.distributed.num_processes` > 1, `train/group.py`): rank 0
alone reads and marks samples in the store, loads versions first, writes
checkpoints, runs the canary and publishes (under FSDP every rank runs the canary with it, and
joins the gather of the whole state that rank 0 writes; full weights: of the bf16 weights alone,
the training state saved sharded and in the background by every rank, train/saves.py). Each
pass it broadcasts whether to stop, then a
`PassPlan` (follow a version; train these samples); the other ranks load the
version it names from the run folder (shared by all ranks) and train their
share of the same samples. The other ranks never touch the store. Rank 0
broadcasts a plan at every poll, so no rank waits in a collective for long.

Writing a version's folder and row happens under `publish_lock`, which
`clawrl rollback` takes too. A rollback published while a step runs is found
under that lock: the step is dropped, and the next pass loads the rollback and
trains the same samples from there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from clawrl.model.gpu import release_cached
from clawrl.store.db import Store
from clawrl.train.baseline import centred, judged
from clawrl.train.checkpoints import CheckpointError, claim_next, publish_lock, save_version, set_aside
from clawrl.train.failures import MAX_FAILURES, failure_reason, pick
from clawrl.train.group import RankGroup
from clawrl.train.loggers import StepLoggers
from clawrl.train.policy import Policy
from clawrl.train.prune import choose, prune
from clawrl.train.ranks import RankStatus
from clawrl.train.remote.errors import PublishConflict
from clawrl.train.rotation import next_user
from clawrl.train.saves import serving_weights, sharded_saves
from clawrl.train.trainer import triage
from clawrl.types import DEFAULT_USER, UNCHECKED, Sample, Version
from clawrl.version_folder import version_folders

log = logging.getLogger("clawrl.trainer")
Check = Callable[[Policy], tuple[str, dict]]  # the canary: the policy's weights -> (status, figures)


@dataclass
class PassPlan:
    """One pass, as rank 0 decided it for every rank."""

    at: tuple[str, int]  # the version and step rank 0 is at (after its last publish)
    follow: Version | None = None  # load this version first (rank 0 already has)
    batch: list[Sample] | None = None  # then train one step on these


class TrainLoop:
    """The loop of one rank; `store` is rank 0's (None on the others, which never touch it): the
    run's `Store`, or a remote trainer's `RemoteStore` (train/remote/), its gateway's API."""

    def __init__(
        self,
        store: Store | None,
        policy: Policy,
        run_dir: Path,
        *,
        group: RankGroup | None = None,
        status: RankStatus | None = None,
        loggers: StepLoggers | None = None,
        canary: Check | None = None,
        on_hold: Callable[[Version, str], object] | None = None,
        after_publish: Callable[[Version], object] | None = None,
        users: frozenset[str] | None = None,
        per_user: bool = False,
        baseline: str = "none",
        fetch: Callable[[Version], Path | None] | None = None,
    ) -> None:
        self.store = store
        # Where a version is loaded from (None: its row's path). A remote trainer's store downloads
        # a version its run folder lacks (train/remote/client.py: RemoteStore.fetch).
        self.fetch = fetch
        self.baseline = baseline  # the step's reward baseline (train/baseline.py); grpo's is its groups'
        self.users = users  # whose samples are trained (None: every user's)
        self.per_user = per_user  # an adapter per user (module docstring); else one shared policy
        self.user = DEFAULT_USER  # whose line of versions the policy is on now
        self._last: str | None = None  # the user the last step, or try, was for (train/rotation.py)
        self.policy = policy
        self.cfg = policy.cfg
        self.run_dir = Path(run_dir)
        self.group = group or policy.trainer.group
        self.status = status
        self.loggers = loggers or StepLoggers([], run_dir)  # metrics.jsonl, TensorBoard (`train.loggers`)
        self.canary = canary  # rank 0's check of each new version; None: published unchecked
        self.on_hold = on_hold  # called with the servable version to return to and its user, after a hold
        self.after_publish = after_publish  # called with each servable version published (memory's probe)
        self.version = ""  # the version the policy is now; set by `resume`
        self.step = 0
        self._current: Version | None = None
        self._waiting_for: int | None = None
        self._broken: set[str] = set()  # published versions whose folder cannot be loaded
        self._seen = ""  # the newest version in the store when rank 0 planned the step
        # Full weights over several ranks: bf16 versions, the state saved sharded apart (train/saves.py)
        self.saves = sharded_saves(self.run_dir, policy, self.group)

    @property
    def _main(self) -> bool:
        return self.group.is_main

    def _state(self, state: str) -> None:
        if self.status is not None:
            self.status.set(state, self.version, self.step)

    def resume(self) -> None:
        """Set unpublished checkpoint folders aside and load the latest published version (every rank)."""
        self._state("loading")
        if self._main:
            assert self.store is not None
            released = self.store.release_samples()  # the claims of a trainer that died mid-step
            if released:
                log.info("%d samples claimed by an earlier trainer are ready again", released)
            published = {v.name for v in self.store.versions(None)}
            for name, folder in version_folders(self.run_dir).items():
                if name not in published:
                    set_aside(folder, "unpublished")
            self._follow(self._target())
        version = self.group.broadcast(self._current)
        if not self._main:
            self._load(version)

    def _follow(self, version: Version) -> None:
        """Become `version`; if it cannot be loaded, the newest earlier version that can."""
        try:
            self._load(version)
        except CheckpointError as exc:
            log.error("cannot train from %s, passing over it: %s", version.name, exc)
            self._broken.add(version.name)
            self._follow(self._target())
            return
        if self._main:
            log.info("training from %s (step %d)", version.name, version.step)

    def _load(self, version: Version) -> None:
        if self.fetch is not None:
            self.policy.load(self.fetch(version))
        else:
            self.policy.load(Path(version.path) if version.path else None)
        if self.saves is not None and version.path:
            self.saves.restore(version.name)
        self.version, self.step, self._current = version.name, version.step, version
        if self.per_user:
            self.policy.user = self.user  # the canary measures KL on this user's own turns

    def _target(self) -> Version:
        """The user's newest published version that is neither held nor known to be broken (v0 never is)."""
        assert self.store is not None
        versions = self.store.versions(self.user)
        return next(v for v in reversed(versions) if not v.held and v.name not in self._broken)

    def run(self, should_stop: Callable[[], bool], steps: int | None = None) -> None:
        """Train until `should_stop()` is true on rank 0 (checked between steps and while waiting),
        or until `steps` versions are published. Every rank of a group calls this."""
        published = 0
        while True:
            stop = self._main and (should_stop() or (steps is not None and published >= steps))
            if self.group.broadcast(stop):
                if self.saves is not None:
                    self.saves.wait()  # the save in flight, complete before the process exits
                self._state("stopped")
                return
            if self.run_once():
                published += 1
            elif self._main:  # the other ranks wait in the next broadcast
                time.sleep(self.cfg.poll_s)

    def run_once(self) -> bool:
        """One pass (see the module docstring), on every rank; True when rank 0 published a version."""
        plan = self.group.broadcast(self._plan() if self._main else None)
        if not self._main:
            if plan.follow is not None:
                self._load(plan.follow)
            self.version, self.step = plan.at  # what rank 0 published last: the weights every rank holds
        if not plan.batch:
            self._state("waiting")
            return False
        published = False
        try:
            published = self._train(plan.batch)
        finally:
            if self._main and not published:  # failed or dropped: the claims go back (module docstring)
                self.store.release_samples([s.id for s in plan.batch if s.id is not None])
        return published

    def _train(self, batch: list[Sample]) -> bool:
        """Step, check and publish one claimed batch (every rank); True when rank 0 published."""
        self._state("training")
        if self._main:
            whose = f" of {self.user}" if self.per_user else ""
            log.info("step %d: training %s on %d samples%s", self.step + 1, self.version, len(batch), whose)
        metrics = self._step(batch)
        rewards = [s.reward for s in batch if judged(s)]  # as judged, not less the baseline
        metrics["mean_reward"] = sum(rewards) / len(rewards) if rewards else None
        if not self._main and not self.group.lockstep and self.saves is None:
            return False
        status, figures = UNCHECKED, None
        if self.canary is not None:  # rank 0's; every rank's in a lockstep group, which runs it together
            self._state("checking")
            status, figures = self.canary(self.policy)
            release_cached(self.policy.trainer.device)  # the canary's passes: free for the server again
        self._state("publishing")
        if self.saves is not None:
            return self._publish_sharded(batch=batch, metrics=metrics, status=status, canary=figures)
        state = self.group.full_state(self.policy.model, self.policy.optimizer)  # FSDP: gathered to rank 0
        if not self._main:
            return False
        return self._publish(batch=batch, metrics=metrics, status=status, canary=figures, state=state)

    def _publish_sharded(self, batch: list[Sample], metrics: dict, status: str, canary: dict | None) -> bool:
        """Every rank: rank 0 publishes bf16 weights; every `save_every`-th version, every rank then
        starts writing its shard of the training state and trains on (train/saves.py)."""
        assert self.saves is not None
        weights = serving_weights(self.policy.model)  # under FSDP a gather, each weight cast first
        published = self._main and self._publish(
            batch=batch, metrics=metrics, status=status, canary=canary, state=(weights, None)
        )
        name, step = self.group.broadcast((self.version, self.step) if published else (None, 0))
        if name is not None and self.saves.due(step):
            self.saves.save(name)
        return published

    def _step(self, batch: list[Sample]) -> dict:
        """The step; out of memory, once more split in halves and unpacked; failed, the failure
        counted against its samples (a trainer alone, not a group of ranks), then raised
        (train/failures.py)."""
        trainer = self.policy.trainer
        batch = centred(batch, self.baseline)  # the step's copy: the store keeps the judged rewards
        try:
            try:
                return trainer.step(batch, current=self.version)
            except torch.OutOfMemoryError as exc:  # torch.cuda.OutOfMemoryError is this class
                if self.group.world > 1:  # the other ranks are in the step's collectives
                    raise
                log.warning("step %d ran out of memory; retrying it split in halves: %s", self.step + 1, exc)
            # Out of the except block, so the failed pass's frames and their tensors are freed first.
            release_cached(trainer.device)
            return trainer.step(batch, split=True, current=self.version)
        except Exception as exc:
            # In a group of ranks, rank 0's error is as often a peer's death seen in a collective
            # as the batch's own: not counted there (train/failures.py).
            if self.group.world == 1:
                self._count_failure(batch, exc)
            raise

    def _count_failure(self, batch: list[Sample], exc: Exception) -> None:
        """One failed step for each sample of the batch; those at their second are skipped."""
        assert self.store is not None
        reason = failure_reason(exc)
        skipped = self.store.fail_samples([s.id for s in batch if s.id is not None], reason, MAX_FAILURES)
        log.error(
            "step %d failed on %d samples (%s); %s",
            self.step + 1,
            len(batch),
            reason,
            f"samples {skipped} skipped ({MAX_FAILURES} failed steps each), the others tried again"
            if skipped
            else "each is tried again beside samples that never failed",
        )

    def _plan(self) -> PassPlan:
        """Rank 0: follow a version published elsewhere, then the next batch, if a full one is ready."""
        assert self.store is not None
        was = self.user
        counts = self._choose_user()
        latest = self.store.latest_version(self.user)
        self._seen = latest.name
        target = self._target() if latest.held or latest.name in self._broken else latest
        follow = None
        # Another user's adapter: always loaded, even "v0" after "v0" (the weights may hold a dropped
        # step of the user before).
        if target.name != self.version or self.user != was:
            if self.user != was:
                log.info("training %s's adapter: from %s", self.user, target.name)
            elif latest.held and latest.name == self.version:
                log.warning("%s is held; training on from %s", latest.name, target.name)
            else:
                log.info("%s was published elsewhere (parent %s); following it", target.name, target.parent)
            self._follow(target)
            follow = self._current
        # Count first: while waiting, each poll is one count, not a read of every sample's tokens.
        ready = (
            counts.get(self.user, 0) if self.per_user else self.store.count_samples("ready", users=self.users)
        )
        # At most one sample that failed a step before in a batch (train/failures.py).
        batch = pick(self._usable(), self.cfg.batch_size) if ready >= self.cfg.batch_size else []
        if len(batch) < self.cfg.batch_size:
            waiting = len(batch) if ready >= self.cfg.batch_size else ready
            if self._waiting_for != waiting:
                log.info("waiting for samples: %d/%d ready", waiting, self.cfg.batch_size)
                self._waiting_for = waiting
            return PassPlan((self.version, self.step), follow)
        self._waiting_for = None
        claimed = set(self.store.claim_samples([s.id for s in batch if s.id is not None]))
        if len(claimed) < len(batch):  # superseded or left out since read: plan again next pass
            self.store.release_samples(sorted(claimed))
            return PassPlan((self.version, self.step), follow)
        return PassPlan((self.version, self.step), follow, batch)

    def _choose_user(self) -> dict[str, int]:
        """With an adapter per user: the user the next step is for (train/rotation.py), and each user's
        ready samples; {} with one shared policy."""
        if not self.per_user:
            return {}
        counts = self.store.ready_counts(self.users)
        user = next_user(counts, self.cfg.batch_size, self._last)
        if user is not None:
            self._last, self.user = user, user
        return counts

    def _usable(self) -> list[Sample]:
        """The usable ready samples, oldest first; the rest are marked stale or skipped, with a reason."""
        mine = {"user": self.user} if self.per_user else {"users": self.users}
        n = self.cfg.batch_size
        window = self.store.ready_samples(limit=4 * n, **mine)
        if len(window) == 4 * n and sum(not s.attempts for s in window) < n:
            # Samples that failed a step crowd the window: a batch needs untried ones (`pick`).
            known = {s.id for s in window}
            untried = self.store.ready_samples(limit=n, untried=True, **mine)
            window += [s for s in untried if s.id not in known]
        t = triage(
            samples=window,
            current=self.version,
            cfg=self.cfg,
            vocab_size=self.policy.vocab_size,
            lineage={v.name: v for v in self.store.versions(None)},  # ages by lineage (train/lineage.py)
        )
        if t.skipped and not t.usable and not self.store.count_samples("trained"):
            log.error(
                "every sample so far was skipped (the last: %s); nothing will train until a sample "
                "fits (docs/training.md, 'Skipped samples')",
                t.skipped[-1][1],
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

    def _publish(
        self,
        batch: list[Sample],
        metrics: dict,
        status: str,
        canary: dict | None,
        state: tuple[dict, dict] | None = None,
    ) -> bool:
        ids = [s.id for s in batch if s.id is not None]
        with publish_lock(self.run_dir):  # no rollback can take the name between folder and row
            latest = self.store.latest_version(self.user)
            if latest.name != self._seen:
                log.warning("%s was published during the step; dropping the step to follow it", latest.name)
                return False  # its claims go back: the next pass trains them from the new version
            name = claim_next(self.run_dir, latest.number, self.user)
            manifest = {"step": self.step + 1, "samples": ids, "metrics": metrics, "parent": self.version}
            manifest |= {"status": status, "canary": canary}
            path = save_version(
                run_dir=self.run_dir,
                version=name,
                model=self.policy.model,
                optimizer=self.policy.optimizer,
                manifest=manifest,
                state=state,
            )
            version = Version(
                name=name,
                step=self.step + 1,
                path=str(path),
                metrics=metrics,
                parent=self.version,
                status=status,
                canary=canary,
            )
            try:
                self.store.publish_version(version, trained=ids)
            except PublishConflict as exc:  # a remote trainer's gateway published another meanwhile
                log.warning("%s; dropping the step", exc)
                return False  # its claims go back, as above
            self._prune()
        self.version, self.step, self._current = name, version.step, version
        self._seen = name
        log.log(logging.WARNING if version.held else logging.INFO, progress_line(version))
        self.loggers.step(version)
        if not version.held and self.after_publish is not None:
            self.after_publish(version)
        if version.held and self.on_hold is not None:
            self.on_hold(self._target(), self.user)
        return True

    def _prune(self) -> None:
        """Under the publish lock, after a publish: prune this user's line of versions to what
        `train.keep_versions` and `train.keep_every` keep (train/prune.py)."""
        assert self.store is not None
        last = self.store.served_version(self.user if self.per_user else None)
        pruning = choose(
            versions=self.store.versions(self.user),
            served={self._target().name, last or "v0"},
            keep=self.cfg.keep_versions,
            full=self.cfg.weights == "full",
            inspect=self._broken,
            every=self.cfg.keep_every or 0,
        )
        try:
            freed = prune(self.run_dir, pruning)
        except (OSError, ValueError) as exc:  # ValueError: a garbled pruned.json
            # The version is published; pruning again after the next one is enough.
            log.error("could not prune old versions: %s", exc)
            return
        if freed:
            log.info(
                "pruned old versions (train.keep_versions = %d, train.keep_every = %d): %.1f MB freed",
                self.cfg.keep_versions,
                self.cfg.keep_every or 0,
                freed / 1e6,
            )


def progress_line(v: Version) -> str:
    """One line per published version, for the terminal and the log: what it trained on, the loss,
    the importance weights (train/importance.py), the mismatch (and its numerics share, `exact`),
    and the answer tokens per second beside the tokens the gradient pass ran per second."""
    m = v.metrics
    reward = "-" if m.get("mean_reward") is None else f"{m['mean_reward']:+.2f}"
    return (
        f"published {v.name} (step {v.step}): {m['samples']} samples ({m['samples_rl']} rl, "
        f"{m['samples_opd']} opd), loss {m['loss']:.4f} (pg {m['pg_loss']:.4f}, "
        f"kl {m['kl']:.4f}{_topk_text(m)}), "
        f"reward {reward}, {_weights_text(m)}, {m['tokens']} answer tokens in {m['step_s']:.2f} s "
        f"({m['tokens_per_s']:.0f} answer tokens/s, {m.get('processed_tokens_per_s', 0):.0f} processed "
        f"tokens/s){'; ' + v.canary_note() if v.canary else ''}"
    )


def _topk_text(m: dict) -> str:
    """', top-k 0.1234': the opd top-k term (train/topk.py) where a step had one; '' otherwise."""
    return f", top-k {m['opd_topk_kl']:.4f}" if m.get("opd_topk_kl") else ""


def _weights_text(m: dict) -> str:
    """'IS weight 0.982 (min 0.410, 1.2% truncated), mismatch 0.0310 (exact 0.0040)'; '-' for none."""
    if m.get("is_weight_mean") is None:
        weights = "IS weight - (no logprobs recorded)"
    else:
        weights = (
            f"IS weight {m['is_weight_mean']:.3f} (min {m['is_weight_min']:.3f}, "
            f"{100 * m.get('is_truncated_frac', 0.0):.1f}% truncated)"
        )
    mismatch, exact = m.get("mismatch"), m.get("mismatch_exact")
    return (
        f"{weights}, mismatch {'-' if mismatch is None else f'{mismatch:.4f}'} "
        f"(exact {'-' if exact is None else f'{exact:.4f}'})"
    )
