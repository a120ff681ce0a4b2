"""The run's durable store: SQLite schema and migrations, queries, and the JSONL export.

db.py          Store: sessions, turns, feedback over one WAL-mode SQLite file
training.py    judgments and training samples (mixed into Store)
episodes.py    Track 2's episodes and GRPO groups (mixed into Store)
memory.py      memory's experiences: learnt, merged, recalled, retired (mixed into Store)
errors.py      StoreError and its subclasses
writer.py      StoreWriter: the server's store thread; refused writes kept in order and retried
migrations.py  append-only, named schema migrations
rows.py        Turn, Judgment, Sample <-> row mapping and the longer SQL statements
records.py     one JSON line per turn (`clawrl records export`) and a readable view (`show`)
"""

from clawrl.store.db import OpenSession, Store, StoreBusy, StoreError, StoreUnwritable, UnknownTurn

__all__ = ["OpenSession", "Store", "StoreBusy", "StoreError", "StoreUnwritable", "UnknownTurn"]
