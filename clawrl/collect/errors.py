"""Errors the collect loop raises; the API turns them into HTTP answers (`clawrl/api/errors.py`).

CollectError          base: a message, and the request field and code it is about
├── NotRecorded       no answer, session or group with that id was recorded          -> 404
├── Conflict          an episode posted twice, a group posted with two sizes         -> 409
└── RecordingRefused  the store cannot record this now (disk full, locked; the backlog is full) -> 503

The store's own errors (`clawrl/store/errors.py`: `UnknownTurn`, `StoreBusy`, ...) are what
the store raises; the collect loop catches them where a request caused them and raises these,
so one name means one thing.
"""

from __future__ import annotations


class CollectError(Exception):
    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


class NotRecorded(CollectError):
    """No answer, session or group with that id was recorded."""


class Conflict(CollectError):
    """The request contradicts what was recorded before (an episode posted twice, ...)."""


class RecordingRefused(CollectError):
    """The store refuses writes now; the request can be tried again later."""
