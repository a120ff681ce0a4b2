"""Start the trainer as a group of ranks: accelerate's launcher (torch's elastic agent) in this process.

`clawrl train` with `train.distributed.num_processes` N > 1 (or `--launch
accelerate`) becomes the group's launcher. It

- holds the run folder's trainer lock for the group (the ranks are told so);
- sets `CUDA_VISIBLE_DEVICES` to the GPUs of `train.distributed.gpus` (the placement plan's,
  `clawrl/model/placement.py`) in rank order, so rank r's `cuda:LOCAL_RANK` is its planned GPU
  (never GPU 0, the server's, unless the plan put it there);
- writes the resolved config to `trainer-group/config.json` and empties the
  rank state files (`train/ranks.py`);
- runs `accelerate launch --multi_gpu --num_processes N -m clawrl train ...`
  through accelerate's own API, in-process: torch's elastic agent starts the N
  ranks as its children (gloo on a CPU, NCCL on GPUs) on a free port of
  127.0.0.1, with no restarts of its own (`--max_restarts 0`);
- returns when the group does: 0 when every rank stopped (its server is gone,
  `--steps` reached), 1 when a rank failed. The agent then has stopped every
  other rank, so one rank killed mid-step fails the whole step and nothing of
  it is published; `clawrl serve`'s supervisor restarts the group like any
  crashed trainer, and it resumes from the last published version.

Started by a server (`--exit-with-parent PID`), a thread watches the server
and, when it is gone, sends this process SIGTERM: the elastic agent's handler
stops the ranks.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path

from clawrl.config import Config
from clawrl.exit_watch import exit_watch
from clawrl.model.placement import visible_devices
from clawrl.train.ranks import reset_group_dir

log = logging.getLogger("clawrl.trainer")
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"


def rank_command(config_file: Path, run_dir: Path, steps: int | None, server: str | None = None) -> list[str]:
    """What each rank runs (after `python -m`): `clawrl train` as one rank of this launcher's group
    (`server`: a remote trainer's gateway, which rank 0 alone calls: train/remote/)."""
    args = ["clawrl", "train", "--config", str(config_file), "--run-dir", str(run_dir)]
    args += ["--launch", "none"]
    args += ["--in-group", "--exit-with-parent", str(os.getpid())]
    args += [] if server is None else ["--server", server]
    return args + ([] if steps is None else ["--steps", str(steps)])


def launch_group(config: Config, parent_pid: int | None, steps: int | None, server: str | None = None) -> int:
    """Run the group of `train.distributed.num_processes` ranks until it ends; the exit code."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    dist = config.train.distributed
    folder = reset_group_dir(config.run_dir)
    config_file = folder / "config.json"
    config_file.write_text(json.dumps(config.dump(), indent=2) + "\n")
    argv = [
        "--multi_gpu",  # torch's elastic launcher; on a machine without GPUs the ranks use gloo
        "--num_processes",
        str(dist.num_processes),
        "--num_machines",
        "1",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(dist.main_process_port),
        "--mixed_precision",
        "no",  # each rank's Accelerator sets train.distributed.mixed_precision, on a GPU only
        "--dynamo_backend",
        "no",
        "--max_restarts",
        "0",  # a failed rank fails the group; the server's supervisor restarts it
        "--monitor_interval",
        "0.2",
        "-m",
        *rank_command(config_file, config.run_dir, steps, server),
    ]
    if dist.gpus is not None:  # the ranks inherit it (this process allocates nothing on a GPU)
        os.environ[CUDA_VISIBLE] = visible_devices(tuple(dist.gpus), os.environ.get(CUDA_VISIBLE))
        log.info("the ranks take GPUs %s (%s=%s)", dist.gpus, CUDA_VISIBLE, os.environ[CUDA_VISIBLE])
    if parent_pid is not None:
        _stop_when_gone(parent_pid)
    log.info("launching %d trainer ranks (%s)", dist.num_processes, dist.strategy)
    try:
        launch_command(launch_command_parser().parse_args(argv))
    except ChildFailedError as exc:
        log.error("a trainer rank failed, the group is stopped: %s", _first_failure(exc))
        return 1
    except SignalException as exc:
        log.info("the trainer group was stopped (%s)", signal.Signals(exc.sigval).name)
        return 0
    return 0


def _first_failure(exc: Exception) -> str:
    """The rank that failed first; the agent's own SIGTERM to the others comes after it."""
    failures = getattr(exc, "failures", {}) or {}
    order = sorted(failures.items(), key=lambda kv: (kv[1].exitcode == -signal.SIGTERM, kv[1].timestamp))
    for rank, failure in order:
        code = failure.exitcode
        why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        return f"rank {rank} (pid {failure.pid}): {why}"
    return str(exc)


def _stop_when_gone(parent_pid: int, every_s: float = 0.5) -> None:
    """SIGTERM this process once the server `parent_pid` has exited."""
    gone = exit_watch(parent_pid)

    def watch() -> None:
        while not gone():
            threading.Event().wait(every_s)
        log.info("the server is gone; stopping the trainer group")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="clawrl-watch-server", daemon=True).start()
