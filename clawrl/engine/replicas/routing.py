"""Which replica a request goes to, and where it goes next if that one fails: a pure policy.

- **Affinity.** A request with a key (its session; its user's name when it has no session) goes
  to the key's replica by rendezvous hashing (highest random weight, Thaler and Ravishankar 1998):
  every replica gets the weight sha256(key, replica) and the heaviest live one wins. A session's
  turns so land where its prompt's prefix is cached. A replica that goes away moves only its own
  keys, each to its next in line, and gets them back when it returns; the others' keys stay put.
- **Bounded load.** A key's replica is passed over while taking the request would put it above
  `SLACK` times the mean load of the live replicas (in-flight requests, this one counted; rounded
  up): consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam 2018). The next
  in the key's line takes it, so a busy session spills to the same second replica each time. Below
  `FLOOR` requests a replica is never too busy for its own keys: vLLM batches them, and a few more
  rows cost less than a cold prefix's prefill elsewhere.
- **Load.** A request with no key (a judge call, a client that names no session and is not
  recorded) goes to the replica with the fewest requests in flight, the earlier listed on a tie.
- **Failover.** The order returned is the whole line: the first is tried, then the next live one
  if it fails before answering (clawrl/engine/replicas/engine.py).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

SLACK = 1.25  # a key's replica may carry up to 25 % more than the mean before the key spills
FLOOR = 4  # ... and always up to this many requests


def weight(key: str, replica: str) -> int:
    """The rendezvous weight of `replica` for `key`: stable across processes and restarts."""
    digest = hashlib.sha256(f"{key}\0{replica}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def by_affinity(key: str, replicas: Sequence[str]) -> list[str]:
    """`replicas` in `key`'s order of preference, heaviest first."""
    return sorted(replicas, key=lambda r: weight(key, r), reverse=True)


def by_load(replicas: Sequence[str], inflight: Mapping[str, int]) -> list[str]:
    """`replicas`, least in flight first; a tie keeps the listed order."""
    return sorted(replicas, key=lambda r: inflight.get(r, 0))


def capacity(live: Sequence[str], inflight: Mapping[str, int], slack: float = SLACK) -> int:
    """The most requests a key's replica may hold with this one added (the bounded-load cap)."""
    total = sum(inflight.get(r, 0) for r in live) + 1
    return max(FLOOR, math.ceil(slack * total / len(live)))


def route(
    key: str | None, live: Sequence[str], inflight: Mapping[str, int], slack: float = SLACK
) -> list[str]:
    """The live replicas in the order a request with `key` tries them (the module docstring)."""
    if not live:
        return []
    if key is None:
        return by_load(live, inflight)
    line = by_affinity(key, live)
    cap = capacity(live, inflight, slack)
    fits = [r for r in line if inflight.get(r, 0) + 1 <= cap]
    return fits + [r for r in line if r not in fits]


def affinity_key(session: str | None, user: str, default_user: str) -> str | None:
    """What a request is kept together by: its session, else its user (not the shared default)."""
    if session:
        return f"session:{session}"
    return None if user == default_user else f"user:{user}"
