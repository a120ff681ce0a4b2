"""Experiment logs: each training step's metrics, written where the usual tools read them.

`train.loggers` picks them (default `["jsonl"]`):

- `jsonl`: one JSON object per published step appended to `<run_dir>/metrics.jsonl`
  (`time`, `version`, `step`, `parent`, then the step's metrics: loss, pg_loss, kl,
  entropy, grad_norm, mean_reward, samples, tokens, tokens_per_s, processed_tokens_per_s,
  mismatch_exact, ...).
  Appended and flushed per line, never truncated: a restarted trainer goes on in the same file.
- `tensorboard`: the same numbers as scalars `train/<name>` at global step `step`, in
  `<run_dir>/tensorboard/` (`tensorboard --logdir <run_dir>/tensorboard`). Needs the
  `tensorboard` package (`pip install 'clawrl[tensorboard]'`); without it the trainer logs
  one error and goes on with the other loggers: a missing viewer never stops training.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Protocol

from clawrl.types import Version

log = logging.getLogger("clawrl.trainer")
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


class StepLogger(Protocol):
    def step(self, version: Version) -> None: ...

    def close(self) -> None: ...


class JsonlLogger:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")

    def step(self, version: Version) -> None:
        line = {"time": time.time(), "version": version.name, "step": version.step, "parent": version.parent}
        line |= {k: _finite(v) for k, v in version.metrics.items()}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardLogger:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # ImportError without the tensorboard package

        self._writer = SummaryWriter(log_dir=str(Path(run_dir) / TENSORBOARD_DIR))

    def step(self, version: Version) -> None:
        for key, value in version.metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._writer.add_scalar(f"train/{key}", value, version.step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class StepLoggers:
    """The configured loggers as one."""

    def __init__(self, names: list[str], run_dir: Path) -> None:
        self.loggers: list[StepLogger] = []
        for name in dict.fromkeys(names):
            if name == "jsonl":
                self.loggers.append(JsonlLogger(run_dir))
            elif name == "tensorboard":
                try:
                    self.loggers.append(TensorBoardLogger(run_dir))
                except ImportError as exc:  # degrade on purpose: see the module docstring
                    log.error("not logging to TensorBoard: %s (pip install tensorboard)", exc)

    def step(self, version: Version) -> None:
        for logger in self.loggers:
            logger.step(version)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value
