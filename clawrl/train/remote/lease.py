"""Which remote trainer holds the gateway's samples, and until when: a pure state machine.

One trainer trains a store at a time (a local one holds `trainer.lock`). A remote trainer holds
the gateway's lease instead: each of its requests, and a heartbeat every third of the lease, renew
it. A trainer that is not heard from for `lease_s` seconds (killed, its host gone, the network cut)
loses it: `expired` names it once, and the gateway hands its claimed samples back. A gateway that
starts holds a lease for an unknown trainer (`UNKNOWN`): samples claimed before the restart come
back after `lease_s` unless a trainer comes back first. Another trainer may take the lease only
once it is free.
"""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN = ""  # the trainer whose claims a starting gateway found: any trainer may take its lease


@dataclass
class Lease:
    lease_s: float
    holder: str | None = None  # the trainer's id (client.py: host, pid, a random part); None: free
    seen: float = 0.0  # when it was last heard from (a monotonic clock)

    def take(self, trainer: str, now: float) -> float | None:
        """Renew `trainer`'s lease, or give it a free one; None. If another trainer holds a live
        lease: how long ago that one was heard from, and nothing changes."""
        if self.holder not in (None, UNKNOWN, trainer) and now - self.seen <= self.lease_s:
            return now - self.seen
        self.holder, self.seen = trainer, now
        return None

    def expired(self, now: float) -> str | None:
        """The holder whose lease ran out (the lease is free from now), once; None otherwise."""
        if self.holder is None or now - self.seen <= self.lease_s:
            return None
        gone, self.holder = self.holder, None
        return gone
