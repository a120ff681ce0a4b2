"""The store's calls a remote trainer may make, and their JSON: exactly what the trainer loop
(`train/loop.py`), the canary gate (`guard/gate.py`) and the wiring call, nothing that reads
conversations or writes anything else. Pure: no sockets, no files.

A call is `POST /v1/trainer/store/{name}` with its arguments as a JSON object, checked against its
model (`Call`: typed, nothing more); the answer is `{"result": ...}`. Samples and versions travel
as their dataclasses' fields; sets of users as lists; the reasons of `leave_out_samples` keyed by
the sample id as text (JSON's keys are).
Publishing is not a call: a version travels as a folder (folders.py, `PUT /v1/trainer/versions`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from clawrl.types import DEFAULT_USER, Sample, Version


def version_json(v: Version) -> dict[str, Any]:
    return dataclasses.asdict(v)


def version_of(d: dict[str, Any]) -> Version:
    return Version(**d)


def sample_json(s: Sample) -> dict[str, Any]:
    return dataclasses.asdict(s)


def sample_of(d: dict[str, Any]) -> Sample:
    return Sample(**d)


Id = Annotated[int, Field(ge=0, lt=1 << 63)]  # what SQLite's INTEGER holds
Count = Annotated[int, Field(ge=0, lt=1 << 63)]


class Call(BaseModel):
    """A call's arguments: typed, and nothing else (a 400 otherwise)."""

    model_config = ConfigDict(extra="forbid")


class OfUser(Call):
    user: str | None = DEFAULT_USER


class Ids(Call):
    ids: list[Id]


class SomeIds(Call):
    ids: list[Id] | None = None  # None: every claimed sample


class Failed(Call):
    ids: list[Id]
    reason: str
    limit: Count


class Ready(Call):
    limit: Count | None = None
    user: str | None = None
    users: list[str] | None = None
    untried: bool = False


class Counted(Call):
    status: str | None = None
    kind: str | None = None
    users: list[str] | None = None


class OfUsers(Call):
    users: list[str] | None = None


class LeftOut(Call):
    reasons: dict[Id, str]
    status: Literal["stale", "skipped"]


class Recent(Call):
    limit: Count
    user: str | None = None


def _users(users: list[str] | None) -> frozenset[str] | None:
    return None if users is None else frozenset(users)


# name -> (its arguments, what the gateway runs on its store with them -> JSON)
CALLS: dict[str, tuple[type[Call], Callable[[Any, Any], Any]]] = {
    "versions": (OfUser, lambda s, a: [version_json(v) for v in s.versions(a.user)]),
    "latest_version": (OfUser, lambda s, a: version_json(s.latest_version(a.user or DEFAULT_USER))),
    "served_version": (OfUser, lambda s, a: s.served_version(a.user)),
    "claim_samples": (Ids, lambda s, a: s.claim_samples(a.ids)),
    "release_samples": (SomeIds, lambda s, a: s.release_samples(a.ids)),
    "fail_samples": (Failed, lambda s, a: s.fail_samples(a.ids, a.reason, a.limit)),
    "ready_samples": (
        Ready,
        lambda s, a: [
            sample_json(x)
            for x in s.ready_samples(limit=a.limit, user=a.user, users=_users(a.users), untried=a.untried)
        ],
    ),
    "count_samples": (Counted, lambda s, a: s.count_samples(a.status, a.kind, _users(a.users))),
    "ready_counts": (OfUsers, lambda s, a: s.ready_counts(_users(a.users))),
    "leave_out_samples": (LeftOut, lambda s, a: s.leave_out_samples(a.reasons, a.status)),
    "recent_token_ids": (Recent, lambda s, a: [list(pair) for pair in s.recent_token_ids(a.limit, a.user)]),
}
