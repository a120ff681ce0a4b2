"""One replica of a set: a vLLM engine and what the set keeps about it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clawrl.engine.vllm.engine import VLLMEngine


@dataclass(eq=False)
class Replica:
    engine: VLLMEngine
    # Holds every announced version. False when it was down at an announcement (or failed to load
    # one): no request goes to it until it has caught up (versions.py).
    synced: bool = True
    next_catch_up: float = 0.0  # monotonic seconds: after a failed catch-up, not tried again before
    inflight: int = 0  # requests and judge calls on it now (routing's load)
    answered: int = 0  # requests it finished
    moved: int = 0  # requests it failed, each moved on to another replica

    @property
    def url(self) -> str:
        return self.engine.server.url

    @property
    def live(self) -> bool:
        """Whether requests may go to it: its server answers and it serves what was announced."""
        return self.synced and self.engine.server.up

    def report(self) -> dict[str, Any]:
        health = self.engine.server.health
        return {
            "url": self.url,
            "status": health.status,
            "synced": self.synced,
            "version": self.engine.version,
            "inflight": self.inflight,
            "answered": self.answered,
            "moved": self.moved,
            "pid": health.pid,  # of a vLLM clawrl started (None: attached)
            "restarts": health.restarts,
            "last_error": health.last_error,
        }
