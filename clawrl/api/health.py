"""GET /healthz: what each service says of itself, gathered into one answer.

200 while the engine can serve; 503 (same body) while it cannot, e.g. vLLM restarting.
A service that is off (no judge, no trainer, no canary gate) shows `{"status": "off"}`;
no store shows `"store": null`; `memory` says whether prompts get the memory block. Each
service reports a typed object (`EngineStats`, `WriterHealth`, `JudgeHealth`, `TrainerHealth`,
`GuardHealth`); the body is made of them here, by `to_json`, NaN and infinities as null.
`disk` is what the version folders hold: bytes per folder and in all (`train.keep_versions`
prunes them, `clawrl/train/prune.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawrl.api.state import OFF, PipelineState, to_json
from clawrl.collect.collector import Collector
from clawrl.config import GuardConfig
from clawrl.engine.base import Engine
from clawrl.engine.watcher import VersionWatcher
from clawrl.judge.worker import JudgeLoop
from clawrl.train.remote.desk import TrainerDesk
from clawrl.train.supervisor import TrainerSupervisor
from clawrl.types import DEFAULT_USER
from clawrl.version_folder import folder_bytes


@dataclass
class HealthReport:
    engine: Engine
    model: str
    collector: Collector | None = None
    judge: JudgeLoop | None = None
    trainer: TrainerSupervisor | None = None
    watcher: VersionWatcher | None = None
    guard: GuardConfig | None = None
    pipeline: PipelineState | None = None  # the store's counters (samples by status and skip reason)
    run_dir: Path | None = None  # whose checkpoints/ `disk` measures
    memory: bool = False  # memory.enabled: main turns get the memory block (docs/memory.md)
    desk: TrainerDesk | None = None  # train.enabled false: a remote trainer's lease (train/remote/)

    async def body(self, detailed: bool = True, user: str = DEFAULT_USER) -> tuple[dict[str, Any], int]:
        """The /healthz body and its status code; not `detailed`: the status, model and version only
        (what a user's key gets on a server with users, docs/users.md: the version `user` is served)."""
        store = self.collector.writer.health() if self.collector else None
        engine = self.engine.stats()
        status = "degraded" if store is not None and not store.ok else "ok"
        if engine.status != "ok":
            status = f"engine {engine.status}"
        code = 200 if engine.status == "ok" else 503
        if not detailed:
            return {"status": status, "model": self.model, "version": self.engine.version_of(user)}, code
        body = {
            "status": status,
            "model": self.model,
            "version": self.engine.version,
            "engine": engine,
            "open_sessions": len(self.collector.tracker) if self.collector else None,
            "store": store,
            "judge": self.judge.health() if self.judge is not None else OFF,
            "trainer": self._trainer(),
            "guard": self._guard(),
            "memory": {"status": "on" if self.memory else "off"},
            "samples": await self._samples(),
            "disk": await self._disk(),
        }
        return to_json(body), code

    def _trainer(self) -> Any:
        """The trainer process this server supervises, or the remote trainer holding its lease."""
        if self.trainer is not None:
            return self.trainer.health()
        return self.desk.health() if self.desk is not None else OFF

    async def _samples(self) -> dict[str, Any] | None:
        """Samples by status, the skipped ones by reason, and an error when every one was skipped."""
        c = await self.pipeline.counts() if self.pipeline is not None else None
        if c is None:
            return None
        return dict(c.samples) | {"skipped_by_reason": c.skipped, "error": c.samples_error()}

    async def _disk(self) -> dict[str, Any] | None:
        """Bytes of each version folder (v1 first) and their total; stat calls, off the event loop."""
        if self.run_dir is None:
            return None
        versions = await asyncio.to_thread(folder_bytes, self.run_dir)
        return {"total_bytes": sum(versions.values()), "versions": versions}

    def _guard(self) -> dict[str, Any]:
        """The canary gate (run by the trainer): its limits, the held versions, the newest check."""
        if self.watcher is None or self.guard is None:  # nothing collected, nothing trained here
            return OFF
        limits = self.guard.model_dump(
            include={"max_drop", "max_accuracy_drop", "max_kl", "hold_on_collapse"}
            | {"collapse_min_entropy_ratio", "collapse_max_entropy_ratio", "collapse_max_self_rouge_l"}
            | {"collapse_max_drift"}
        )
        return {"status": "on" if self.guard.enabled else "off"} | limits | to_json(self.watcher.guard())
