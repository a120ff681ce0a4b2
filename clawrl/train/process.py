"""`clawrl train`: the trainer as a process of its own.

`clawrl serve` starts it beside the server (see `train/supervisor.py`) so that
a Python-heavy training step never stalls serving; it can also run alone
against a run folder. Either way:

- one trainer per run folder: an exclusive `flock` on `<run_dir>/trainer.lock`
  (held for the process's life, released by the OS even on SIGKILL); a second
  trainer exits with code 3 and says who holds it;
- it runs at `train.nice` niceness (serving keeps the CPU first) with
  `train.threads` torch threads, by default half the cores: two OpenMP teams
  each spinning on every core slow both down many times over;
- started by a server (`--exit-with-parent PID`), it exits when that server is
  gone, so a SIGKILLed server leaves no trainer behind.

Exit codes: 0 stopped (Ctrl-C, parent gone), 2 bad setup (no store, no
model), 3 another trainer holds the run folder. A crash is a traceback and
exit 1; the supervisor restarts it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import warnings
from pathlib import Path

import torch
import transformers

from clawrl.config import Config
from clawrl.engine.models import ModelNotFound, model_folder, served_context
from clawrl.store.db import Store, StoreError
from clawrl.train.loggers import StepLoggers
from clawrl.train.loop import TrainLoop
from clawrl.train.policy import build_policy

log = logging.getLogger("clawrl.trainer")
LOCK = "trainer.lock"


class TrainerLocked(RuntimeError):
    """Another trainer holds the run folder."""


def hold_lock(run_dir: Path):
    """Take `<run_dir>/trainer.lock` for this process's life; TrainerLocked if another has it."""
    handle = open(run_dir / LOCK, "a+")  # noqa: SIM115 -- kept open: closing it would drop the lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise TrainerLocked(f"another trainer (pid {owner}) is training {run_dir}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def run_trainer(config: Config, parent_pid: int | None = None) -> int:
    cfg = config.train
    transformers.utils.logging.disable_progress_bar()  # a log, not a terminal animation
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        lock = hold_lock(config.run_dir)
    except TrainerLocked as exc:
        log.error("%s", exc)
        return 3
    os.nice(cfg.nice)
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 2) // 2))
    try:
        store = Store.open(config.run_dir / "clawrl.db")
        base = model_folder(config.model.path, config.cache_dir())
    except (StoreError, ModelNotFound) as exc:
        log.error("%s", exc)
        return 2
    loop = None
    try:
        m = config.model
        context = served_context(m.path, m.max_context)
        policy = build_policy(base, cfg, m.device, context, m.rope_scaling)
        loop = TrainLoop(store, policy, config.run_dir, StepLoggers(cfg.loggers, config.run_dir))
        loop.resume()
        loop.run(lambda: parent_pid is not None and os.getppid() != parent_pid)
        log.info("the server is gone; stopping")
    except KeyboardInterrupt:
        log.info("stopped")
    finally:
        if loop is not None:
            loop.loggers.close()
        store.close()
        lock.close()
    return 0
