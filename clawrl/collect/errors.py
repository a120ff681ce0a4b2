"""Errors the collect loop raises; the API turns them into HTTP answers (`clawrl/api/errors.py`).

CollectError     base: a message, and the request field and code it is about
├── UnknownTurn  no recorded answer (or session) has that id      -> 404
├── Conflict     an episode posted twice, a group posted with two sizes -> 409
└── StoreBusy    the store cannot record this now (disk full, locked; the backlog is full) -> 503
"""

from __future__ import annotations


class CollectError(Exception):
    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


class UnknownTurn(CollectError):
    """No answer or session with that id was recorded."""


class Conflict(CollectError):
    """The request contradicts what was recorded before (an episode posted twice, ...)."""


class StoreBusy(CollectError):
    """The store refuses writes now; the request can be tried again later."""
