"""The trainer process, wired in one place (`clawrl train`): store, policy, canary gate and
replay (`clawrl.guard.trainer_hooks`), loggers, the rank group, then `TrainLoop`.

`clawrl serve` starts it beside the server (see `clawrl/train/supervisor.py`) so that
a Python-heavy training step never stalls serving; it can also run alone
against a run folder. Either way:

- one trainer per run folder: an exclusive `flock` on `<run_dir>/trainer.lock`
  (held for the process's life, released by the OS even on SIGKILL); a second
  trainer exits with code 3 and says who holds it;
- on a GPU it keeps to its share of the memory budget `clawrl serve` decided at start
  (`train.device`, `train.gpu_share`: clawrl/model/budget.py): its allocator is capped at it,
  and each step hands its cached memory back;
- it runs at `train.nice` niceness (serving keeps the CPU first) with
  `train.threads` torch threads, by default half the cores: two OpenMP teams
  each spinning on every core slow both down many times over;
- started by a server (`--exit-with-parent PID`), it exits when that server is
  gone, so a SIGKILLed server leaves no trainer behind.

With `train.distributed.num_processes` > 1 it launches a group of ranks
through accelerate (`clawrl/train/launch.py`) and holds the lock for them; each rank
is `clawrl train --launch none --in-group` (`clawrl/train/group.py`, `clawrl/train/loop.py`:
rank 0 alone reads the store and publishes). Under `accelerate launch -m clawrl
train` (a group started by hand, e.g. across machines) rank 0 takes the lock.

With `--server URL` (a remote trainer, `clawrl/train/remote/`) the store is its gateway's, reached
through the gateway's API with the admin key; `clawrl.db` is never opened here, the run folder
holds the trainer's own copies of the versions, and memory's retirement probe does not run (it
reads conversations).

Exit codes: 0 stopped (Ctrl-C, parent gone, `--steps` done), 2 bad setup (no
store, no model, a gateway that refuses the key), 3 another trainer holds the run folder (or,
remote, the gateway's samples). A crash (or a
failed rank of a group) is exit 1; the supervisor restarts it.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch
import transformers

from clawrl.chat.template import ChatRenderer
from clawrl.config import Config, launched_world_size
from clawrl.exit_watch import exit_watch
from clawrl.guard import trainer_hooks
from clawrl.model.gpu import cap_process, cuda_index
from clawrl.model.load import ModelNotFound, model_folder, served_context
from clawrl.store.db import Store, StoreError
from clawrl.store.locks import TRAINER_LOCK, FolderLocked, hold
from clawrl.train.group import RankGroup, open_group, strategy_refusal
from clawrl.train.loggers import StepLoggers
from clawrl.train.loop import TrainLoop
from clawrl.train.memory_probe import MemoryProbe
from clawrl.train.policy import build_policy
from clawrl.train.ranks import RankStatus
from clawrl.train.remote.client import RemoteStore
from clawrl.train.remote.errors import TrainerBusy, TrainerRefused, UploadRefused
from clawrl.types import Version

log = logging.getLogger("clawrl.trainer")
LOCK = TRAINER_LOCK


def memory_probe(
    config: Config, store: Store | None, model: torch.nn.Module, base: Path, group: RankGroup
) -> Callable[[Version], None] | None:
    """The retirement probe run after servable versions (clawrl/train/memory_probe.py), or None: memory
    off (`memory.enabled`: nothing is injected, so nothing to retire), `memory.probe` off, not the rank
    with the store, or a lockstep group (its forwards are collectives)."""
    if not (config.memory.enabled and config.memory.probe) or store is None or group.lockstep:
        return None
    renderer = ChatRenderer(transformers.AutoTokenizer.from_pretrained(base))
    return MemoryProbe(store, model, renderer, config.memory).after_publish


class TrainerLocked(FolderLocked):
    """Another trainer holds the run folder."""


def hold_lock(run_dir: Path) -> IO[str]:
    """Take `<run_dir>/trainer.lock` for this process's life (clawrl/store/locks.py); TrainerLocked
    if another has it."""
    try:
        return hold(run_dir, LOCK, "trainer")
    except FolderLocked as exc:
        raise TrainerLocked(
            f"another trainer (pid {exc.pid or 'unknown'}) is training {run_dir}", exc.pid
        ) from None


def run_trainer(
    config: Config,
    parent_pid: int | None = None,
    launch: str = "auto",
    in_group: bool = False,
    steps: int | None = None,
    server: str | None = None,
) -> int:
    """`clawrl train`: launch a group of ranks (`launch`), or train in this process (alone or as a rank).

    `launch`: "accelerate" starts `train.distributed.num_processes` ranks (`train/launch.py`);
    "none" trains here; "auto" (the default) launches when num_processes > 1, unless this process
    already is a rank (started by `accelerate launch` or torchrun). `in_group`: a rank of our own
    launcher, which holds the trainer lock. `steps`: stop after publishing that many versions.
    `server`: a gateway's URL; the store is reached through its API (clawrl/train/remote/), with
    the admin key `server.api_key`, and never opened here.
    """
    cfg = config.train
    if refused := strategy_refusal(cfg.distributed):
        log.error("%s", refused)
        return 2
    transformers.utils.logging.disable_progress_bar()  # a log, not a terminal animation
    warnings.filterwarnings("ignore", category=FutureWarning)
    world = launched_world_size()
    if launch == "accelerate" or (launch == "auto" and cfg.distributed.num_processes > 1 and world == 1):
        return _launcher(config, parent_pid, steps, server)
    group = open_group(cfg.distributed, world, config.model.device)
    lock = None
    try:
        if group.is_main and not in_group:  # our launcher holds the lock for its ranks
            lock = hold_lock(config.run_dir)
    except TrainerLocked as exc:
        log.error("%s", exc)
        group.close()
        return 3
    if not in_group:
        _be_nice(cfg.nice)
    torch.set_num_threads(max(1, (cfg.threads or max(1, (os.cpu_count() or 2) // 2)) // group.world))
    try:
        return _train(config, group, parent_pid=parent_pid, steps=steps, server=server)
    finally:
        group.close()
        if lock is not None:
            lock.close()


def trained_users(config: Config) -> frozenset[str] | None:
    """Whose samples are trained: with `server.users`, the users in the file and `default` (the admin
    key's and the rows from before); None (every user's) without it. Read at start, as `clawrl serve`
    reads it, so a user removed from the file is no longer trained on after a restart."""
    return None if config.server.users is None else config.server.user_names


def _launcher(config: Config, parent_pid: int | None, steps: int | None, server: str | None) -> int:
    from clawrl.train.launch import launch_group

    try:
        lock = hold_lock(config.run_dir)
    except TrainerLocked as exc:
        log.error("%s", exc)
        return 3
    _be_nice(config.train.nice)  # the ranks inherit it
    try:
        return launch_group(config, parent_pid, steps, server)
    finally:
        lock.close()


def _train(
    config: Config, group: RankGroup, *, parent_pid: int | None, steps: int | None, server: str | None = None
) -> int:
    if config.train.batch_size < group.world:  # a rank without a sample could not join the reduction
        log.error("train.batch_size %d < the group's %d ranks", config.train.batch_size, group.world)
        return 2
    store: Store | RemoteStore | None = None
    try:
        base = model_folder(config.model.path, config.cache_dir())
        if group.is_main:  # rank 0 alone reads and writes the store
            store = open_store(config, server)
    except (StoreError, ModelNotFound, TrainerRefused) as exc:
        log.error("%s", exc)
        return 2
    except TrainerBusy as exc:
        log.error("%s", exc)
        return 3
    loop = None
    try:
        m = config.model
        context = served_context(m.path, m.max_context)
        device = group.device if group.world > 1 else (config.train.device or m.device)
        if (gpu := cuda_index(device, torch.cuda.is_available())) is not None:
            # its share of the memory budget (a rank's: train.distributed.gpu_shares)
            cap_process(f"cuda:{gpu}", config.train.gpu_share_of(group.rank, group.world))
        # Rank 0 checks and publishes; under FSDP every rank runs the canary's passes with it.
        guarded = config.guard.enabled and (group.is_main or group.lockstep)
        policy = build_policy(
            base_dir=base,
            cfg=config.train,
            device=device,
            max_context=context,
            rope_scaling=m.rope_scaling,
            group=group,
            keep_base=guarded,
            scale_rope=m.scale_rope,
        )
        # The group is its launcher's pid: the pid a rank is told to exit with.
        launcher = parent_pid if parent_pid is not None else os.getppid()
        status = RankStatus(config.run_dir, group.rank, launcher) if group.world > 1 else None
        loggers = StepLoggers(config.train.loggers if group.is_main else [], config.run_dir)
        canary, on_hold = trainer_hooks(config, store, policy, base, check=guarded, group=group)
        per_user = config.per_user_adapters
        # The retirement probe measures experiences on the one policy; with an adapter per user it
        # would judge one user's experiences on another's adapter: not run (docs/users.md).
        probe = (
            None
            if per_user or server is not None
            else memory_probe(config=config, store=store, model=policy.model, base=base, group=group)
        )
        users = trained_users(config)
        loop = TrainLoop(
            store=store,
            policy=policy,
            run_dir=config.run_dir,
            group=group,
            status=status,
            loggers=loggers,
            canary=canary,
            on_hold=on_hold,
            after_publish=probe,
            users=users,
            per_user=per_user,
            baseline="none" if config.method == "grpo" else config.train.reward_baseline,
            fetch=store.fetch if isinstance(store, RemoteStore) else None,
        )
        loop.resume()
        loop.run(exit_watch(parent_pid) if parent_pid is not None else lambda: False, steps)
        log.info("stopping" if steps is not None else "the server is gone; stopping")
    except KeyboardInterrupt:
        log.info("stopped")
    except TrainerBusy as exc:  # a remote trainer whose lease another took while it was cut off
        log.error("%s; stopping", exc)
        return 3
    except UploadRefused as exc:  # sent twice, garbled twice: the network or a disk is at fault
        log.error("%s; stopping", exc)
        return 1
    finally:
        if loop is not None:
            loop.loggers.close()
        if store is not None:
            store.close()
    return 0


def open_store(config: Config, server: str | None) -> Store | RemoteStore:
    """The run folder's store, or with `server` its gateway's, through the API (the lease taken)."""
    if server is None:
        return Store.open(config.run_dir / "clawrl.db")
    key = config.server.api_key.get_secret_value() if config.server.api_key else None
    return RemoteStore.connect(server, key, config.run_dir)


def _be_nice(level: int) -> None:
    """Run at niceness `level` (never lower than it is: an unprivileged process cannot)."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, max(current, level))
