"""Memory at the gateway: the experiences a request gets, and the owner's view of them (docs/memory.md).

`MemoryBook` reads and writes the store on the collector's store thread. `recall` picks a
request's block (`clawrl.memory.block.recall`) from the owner's active experiences the store
offers (`Store.recall_candidates`); a store that fails there is logged and the request is
served without memory: memory never blocks serving. `experiences` and `forget` are
GET /v1/memory and DELETE /v1/memory/{id} (and `clawrl memory list|forget` read the same store).

The owner is the request's user (docs/users.md): `default` on a server without users. A request
reads and teaches its own user's experiences; listing and erasing take an owner too, None for the
admin key, which sees every user's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from clawrl.collect.collector import Collector
from clawrl.collect.errors import NotRecorded, RecordingRefused
from clawrl.config import MemoryConfig
from clawrl.memory import Recalled, recall
from clawrl.memory.block import request_text
from clawrl.store.errors import StoreError
from clawrl.store.writer import TRANSIENT
from clawrl.types import DEFAULT_OWNER, Experience, Message

log = logging.getLogger(__name__)


class MemoryBook:
    def __init__(self, collector: Collector, config: MemoryConfig, count: Callable[[str], int]) -> None:
        self.collector, self.store, self.config = collector, collector.store, config
        self.count = count  # tokens of a text, as the served model's tokenizer counts them
        self.failures = 0  # requests served without memory because the store failed to offer it

    async def recall(
        self, messages: list[Message], session_id: str, owner: str = DEFAULT_OWNER
    ) -> Recalled | None:
        """The block for this request of `owner`'s (None: nothing to add, or the store failed: logged)."""
        c = self.config
        try:
            found = await self.collector.db(self.store.recall_candidates, request_text(messages), owner)
        except StoreError as exc:
            self.failures += 1
            log.warning("serving without memory: %s", exc)
            return None
        return recall(
            experiences=found,
            messages=messages,
            session_id=session_id,
            budget=c.max_tokens,
            count=self.count,
            max_items=c.max_items,
        )

    async def experiences(
        self, state: str | None = None, owner: str | None = DEFAULT_OWNER
    ) -> list[Experience]:
        """The owner's experiences (None: every owner's), last seen first."""
        return await self.collector.db(self.store.experiences, owner, state)

    async def forget(self, experience_id: int, owner: str | None = DEFAULT_OWNER) -> Experience:
        """Retire the owner's (None: anyone's) experience now; NotRecorded for an id the owner has
        none of."""
        self.collector.admit()
        try:
            gone = await self.collector.db(self.store.forget, experience_id, time.time(), owner)
        except TRANSIENT as exc:  # the reply must say it is gone: never kept for later
            raise RecordingRefused(f"the store cannot erase now: {exc}", code="store_unavailable") from exc
        if gone is None:
            raise NotRecorded(f"no experience {experience_id} in your memory", param="id", code="not_found")
        return gone
