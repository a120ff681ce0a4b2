"""The store's exceptions, in one place so every store module can raise them.

    StoreError           base (a RuntimeError): no clawrl database there, schema too old, ...
    ├── StoreUnwritable  the file or its folder cannot be written (read-only, disk full)
    ├── StoreBusy        another connection held the database lock past the busy timeout
    ├── StoreOnNetwork   opened for writing on a network file system (NFS, SMB, ...): refused
    ├── UnknownTurn      feedback, a judgment or a sample for a turn that was never recorded
    ├── UnknownSession   an episode for a session that was never recorded
    └── EpisodeConflict  an episode posted twice, or a group posted with two sizes

`clawrl.store` and `clawrl.store.db` re-export them.
"""

from __future__ import annotations


class StoreError(RuntimeError):
    """A store operation failed."""


class StoreUnwritable(StoreError):
    """The database file or its folder cannot be written."""


class StoreBusy(StoreError):
    """Another connection (another process) held the database's write lock for too long."""


class StoreOnNetwork(StoreError):
    """The database file is on a network file system, where SQLite's WAL mode does not work
    (clawrl/store/filesystem.py); not a passing refusal: the run folder must move."""


class UnknownTurn(StoreError):
    """A row referred to a turn id that the store never recorded."""


class UnknownSession(StoreError):
    """An episode named a session id that the store never recorded."""


class EpisodeConflict(StoreError):
    """The session's episode was already recorded, or its group was recorded with another size."""
