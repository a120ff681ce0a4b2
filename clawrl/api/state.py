"""The pipeline at a glance: one snapshot that the dashboard polls and /metrics exposes.

`PipelineState.snapshot()` gathers what the server knows in memory (the served
version and its swaps, the engine's counters, the judge's votes, the trainer
process) and what the store knows (running totals, rewards by version and by
minute, the latest versions and sessions). The store part is read through a
read-only connection of its own, in a worker thread: the dashboard never takes
the writer's lock or thread, and every query is bounded (`store/stats.py`).
A snapshot is reused for `ttl` seconds, so ten open tabs and a scraper cost
what one does.

A snapshot is a typed `Snapshot` (each service's part is the type it reports:
`EngineStats`, `JudgeHealth`, `TrainerHealth`); /metrics reads its attributes.
It becomes JSON only at the edge, through `to_json`: /healthz (api/health.py),
/dashboard/state.json and the session page (api/dashboard.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field, fields, is_dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from clawrl.api.per_user import UserRow, user_rows
from clawrl.engine.base import Engine, EngineStats
from clawrl.judge.worker import JudgeHealth, JudgeLoop
from clawrl.store.db import Store
from clawrl.train.supervisor import TrainerHealth, TrainerSupervisor
from clawrl.types import Turn

RECENT_VERSIONS = 100  # versions listed (and charted) on the dashboard
RECENT_SESSIONS = 20
RECENT_GROUPS = 20  # episode groups on the dashboard (Track 2)
RECENT_EXPERIENCES = 50  # memory's experiences on the dashboard, last seen first
SESSION_TURNS = 200  # turns shown on one session's page
REWARD_WINDOW_S = 24 * 3600.0  # reward over time: the last day, by minute
TRAIN_KEYS = (
    "loss",
    "pg_loss",
    "kl",
    "entropy",
    "grad_norm",
    "mean_reward",
    "tokens_per_s",
    "processed_tokens_per_s",
    "mismatch",
    "mismatch_exact",
    "mismatch_stale",
    "mismatch_processed",
    "mismatch_conditioned",
    "is_weight_mean",
    "is_weight_min",
    "is_truncated_frac",
    "is_truncated_samples",
    "opd_gap_p05",
    "opd_gap_p50",
    "opd_gap_p95",
    "opd_gap_clipped",
    "opd_topk_kl",
)
OFF: dict[str, Any] = {"status": "off"}  # the JSON of a service this server does not run


@dataclass
class Served:
    """Which version the engine serves, since when, and how its swaps went."""

    version: str
    since: float = field(default_factory=time.time)
    swaps: int = 0
    last_swap_s: float | None = None


@dataclass(frozen=True)
class Trained:
    """The newest version with training figures: which, and the figures of its step (`TRAIN_KEYS`)."""

    version: str
    step: int
    created_at: float
    loss: float | None = None
    pg_loss: float | None = None
    kl: float | None = None
    entropy: float | None = None
    grad_norm: float | None = None
    mean_reward: float | None = None
    tokens_per_s: float | None = None  # answer tokens: what the loss trains
    processed_tokens_per_s: float | None = None  # what the gradient pass ran, prompts included
    mismatch: float | None = None  # mean |logp_train - mu| over the step's weighted tokens
    # ... by cause (train/importance.py); exact: same version, untruncated, unpenalised: numerics
    mismatch_exact: float | None = None
    mismatch_stale: float | None = None
    mismatch_processed: float | None = None
    mismatch_conditioned: float | None = None
    is_weight_mean: float | None = None  # the truncated importance weights (train/importance.py)
    is_weight_min: float | None = None
    is_truncated_frac: float | None = None  # share of tokens whose weight was cut at train.is_cap
    is_truncated_samples: int | None = None  # samples with a truncated token
    opd_gap_p05: float | None = None  # the OPD gap's quantiles (nats), before the clip
    opd_gap_p50: float | None = None
    opd_gap_p95: float | None = None
    opd_gap_clipped: float | None = None  # share of opd tokens the clip cut
    opd_topk_kl: float | None = None  # the top-k distillation term (train/topk.py), 0 when off


@dataclass(frozen=True)
class TrainerState:
    """The trainer's part of a snapshot: its process, the batch size it trains on, its latest step."""

    health: TrainerHealth | None  # None: no trainer process in this server
    batch_size: int | None
    latest: Trained | None


@dataclass(frozen=True)
class Counts:
    """The store's running totals (m005): sessions, turns by type, judged turns, samples by status."""

    sessions: int
    turns: int  # main + side
    main: int
    side: int
    next_state: int  # turns whose next state arrived
    judged: int
    hinted: int  # judged turns whose judgment accepted a hint
    samples: dict[str, int]  # status -> samples
    episodes: int = 0  # Track 2: episodes posted (m009)
    episodes_dropped: int = 0  # ... with no reward (their reason says why)
    groups: dict[str, int] = field(default_factory=dict)  # closed groups by status: used, dropped, eval
    skipped: dict[str, int] = field(default_factory=dict)  # skipped samples by reason (train/trainer.py)
    memory_injected: int = 0  # turns whose prompt carried a memory block (m013)
    memory_dropped: int = 0  # ... whose block was dropped to keep the prompt in the window
    memory_samples: int = 0  # memory distillation samples made (m014)
    memory_distilled: int = 0  # experiences the retirement probe marked distilled (m014)
    memory_reactivated: int = 0  # ... and distilled ones it made active again

    def samples_error(self) -> str | None:
        """Why nothing trains although samples came in: every one of them was skipped (None: not so)."""
        s = self.samples
        if not s.get("skipped") or s.get("trained") or s.get("ready") or s.get("stale"):
            return None
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items(), key=lambda kv: -kv[1]))
        why = reasons or s["skipped"]
        return f"every sample so far was skipped ({why}): the trainer has nothing to train on"


@dataclass(frozen=True)
class Stored:
    """The store's part of a snapshot; the rows are the page's tables, as the store gives them."""

    counts: Counts
    versions: list[dict[str, Any]]  # the newest `RECENT_VERSIONS`, newest first
    version_count: int
    reward_by_version: dict[str, dict[str, Any]]
    reward_over_time: list[dict[str, Any]]  # by minute, over the last `REWARD_WINDOW_S`
    sessions: list[dict[str, Any]]  # the newest `RECENT_SESSIONS`
    groups: list[dict[str, Any]] = field(default_factory=list)  # Track 2: the newest `RECENT_GROUPS`
    experiences: list[dict[str, Any]] = field(default_factory=list)  # memory: `RECENT_EXPERIENCES`
    users: list[UserRow] = field(default_factory=list)  # with `server.users`: per user, busiest first


@dataclass(frozen=True)
class Snapshot:
    """The pipeline at one moment (see the module); `dashboard.state_json` is its JSON."""

    now: float
    model: str
    method: str
    served: Served
    engine: EngineStats
    max_batch_size: int
    judge: JudgeHealth | None  # None: no judge in this server
    trainer: TrainerState
    store: Stored | None  # None: no store (nothing collected)

    @property
    def fingerprint(self) -> str:
        """The `system_fingerprint` answers carry now."""
        return f"{self.model}-{self.served.version}"


class PipelineState:
    """The snapshot behind /dashboard/state.json and /metrics, and one session's page."""

    def __init__(
        self,
        engine: Engine,
        *,
        model: str,
        method: str,
        max_batch_size: int,
        batch_size: int | None,
        store_path: Path | None = None,
        judge: JudgeLoop | None = None,
        trainer: TrainerSupervisor | None = None,
        users: frozenset[str] | None = None,
        ttl: float = 1.0,
    ) -> None:
        self.engine, self.judge, self.trainer = engine, judge, trainer
        self.users = users  # `server.users`' names (None: users off, no per-user figures)
        self.model, self.method = model, method
        self.max_batch_size, self.batch_size = max_batch_size, batch_size
        self.served = Served(engine.version)
        self._store_path = store_path
        self._reader: Store | None = None
        self._ttl = ttl
        self._cached: tuple[float, Snapshot] | None = None
        self._lock = asyncio.Lock()

    def swapped(self, version: str, seconds: float) -> None:
        """Called by the version watcher once `version` is served (`seconds` from finding it)."""
        self.served = Served(version, time.time(), self.served.swaps + 1, seconds)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    async def snapshot(self) -> Snapshot:
        """The current state (reused for `ttl` seconds: shared, do not change it)."""
        async with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= self._ttl:
                stored = await asyncio.to_thread(self._read_store) if self._store_path else None
                self._cached = (time.monotonic(), self._build(stored))
            return self._cached[1]

    async def snapshot_for(self, user: str) -> Snapshot:
        """The snapshot as `user` sees it (docs/users.md): their own sessions and experiences only."""
        snap = await self.snapshot()
        if snap.store is None:
            return snap
        async with self._lock:  # the reader connection is shared with `snapshot`
            sessions, experiences = await asyncio.to_thread(self._read_own, user)
        own = [row for row in snap.store.users if row.user == user]  # another user's figures: the admin's
        return dataclasses.replace(
            snap, store=dataclasses.replace(snap.store, sessions=sessions, experiences=experiences, users=own)
        )

    def _read_own(self, user: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        r = self._open_reader()
        experiences = r.recent_experiences(RECENT_EXPERIENCES, owner=user)
        return r.recent_sessions(RECENT_SESSIONS, user=user), [dataclasses.asdict(e) for e in experiences]

    async def counts(self) -> Counts | None:
        """The store's running totals now (a few counter rows, not a snapshot); None without a store."""
        if self._store_path is None:
            return None
        async with self._lock:  # the reader connection is shared with `snapshot`
            return await asyncio.to_thread(lambda: _counts(self._open_reader().counters(), None))

    async def session(self, session_id: str, user: str | None = None) -> dict[str, Any] | None:
        """One session for its page: its row and up to `SESSION_TURNS` turns with their judgments;
        None when there is no such session, or it is not `user`'s (None: anyone's)."""
        if self._store_path is None:
            return None
        async with self._lock:  # the reader connection is shared with `snapshot`
            return await asyncio.to_thread(self._read_session, session_id, user)

    def _read_session(self, session_id: str, user: str | None) -> dict[str, Any] | None:
        r = self._open_reader()
        row = r.session_row(session_id)
        if row is None or (user is not None and row["user"] != user):
            return None
        turns = list(islice(r.turns(session_id), SESSION_TURNS))
        return row | {"turns": [turn_view(t, r.judgment_for(t.id)) for t in turns]}

    def _open_reader(self) -> Store:
        if self._reader is None:
            assert self._store_path is not None
            self._reader = Store.open(self._store_path, readonly=True)
        return self._reader

    def _build(self, stored: Stored | None) -> Snapshot:
        stats = self.engine.stats()
        if self.served.version != self.engine.version:  # swapped by someone else than the watcher
            self.served = Served(self.engine.version, time.time(), self.served.swaps)
        return Snapshot(
            now=time.time(),
            model=self.model,
            method=self.method,
            served=self.served,  # replaced on a swap, never changed in place
            engine=stats,
            max_batch_size=self.max_batch_size,
            judge=self.judge.health() if self.judge is not None else None,
            trainer=self._trainer(stored),
            store=stored,
        )

    def _trainer(self, stored: Stored | None) -> TrainerState:
        health = self.trainer.health() if self.trainer is not None else None
        versions = stored.versions if stored is not None else []
        latest = next((v for v in versions if v["metrics"].get("loss") is not None), None)
        trained = None
        if latest is not None:
            m = latest["metrics"]
            figures = {key: m.get(key) for key in TRAIN_KEYS}
            trained = Trained(latest["name"], latest["step"], latest["created_at"], **figures)
        return TrainerState(health, self.batch_size, trained)

    def _read_store(self) -> Stored:
        """The store's part of a snapshot (runs in a worker thread)."""
        r = self._open_reader()
        counters = r.counters()
        by_version = r.reward_by_version()
        return Stored(
            counts=_counts(counters, by_version),
            versions=[_version(v, by_version.get(v["name"])) for v in r.recent_versions(RECENT_VERSIONS)],
            version_count=r.version_count(),
            reward_by_version={name: _rates(row) for name, row in by_version.items()},
            reward_over_time=[
                {"t": row["minute"] * 60} | _rates(row)
                for row in r.reward_by_minute(time.time() - REWARD_WINDOW_S)
            ],
            sessions=r.recent_sessions(RECENT_SESSIONS),
            groups=[dataclasses.asdict(g) for g in r.recent_groups(RECENT_GROUPS)],
            experiences=[dataclasses.asdict(e) for e in r.recent_experiences(RECENT_EXPERIENCES, owner=None)],
            users=[] if self.users is None else user_rows(self.users, r.per_user(), self.engine.version_of),
        )


def _counts(counters: dict[str, int], by_version: dict[str, dict[str, int]] | None) -> Counts:
    """The totals from the counters; `by_version` (None: not read) gives the judged and hinted turns."""
    by_version = by_version or {}
    samples = {k.removeprefix("samples:"): n for k, n in counters.items() if k.startswith("samples:")}
    return Counts(
        sessions=counters.get("sessions", 0),
        turns=counters.get("turns:main", 0) + counters.get("turns:side", 0),
        main=counters.get("turns:main", 0),
        side=counters.get("turns:side", 0),
        next_state=counters.get("turns:next_state", 0),
        judged=sum(row["judged"] for row in by_version.values()),
        hinted=sum(row["hinted"] for row in by_version.values()),
        samples=samples,
        episodes=counters.get("episodes", 0),
        episodes_dropped=counters.get("episodes:dropped", 0),
        groups={k.removeprefix("groups:"): n for k, n in counters.items() if k.startswith("groups:")},
        skipped={k.removeprefix("skipped:"): n for k, n in counters.items() if k.startswith("skipped:") if n},
        memory_injected=counters.get("memory:injected", 0),
        memory_dropped=counters.get("memory:dropped", 0),
        memory_samples=counters.get("memory:samples", 0),
        memory_distilled=counters.get("memory:distilled", 0),
        memory_reactivated=counters.get("memory:reactivated", 0),
    )


def _rates(row: dict[str, int]) -> dict[str, Any]:
    """Judged-turn totals with their means: mean score of the scored turns, share with a hint."""
    mean = row["score_sum"] / row["scored"] if row["scored"] else None
    hint_rate = row["hinted"] / row["judged"] if row["judged"] else None
    return dict(row) | {"mean_score": mean, "hint_rate": hint_rate}


def _version(v: dict[str, Any], served: dict[str, int] | None) -> dict[str, Any]:
    """A version row for the page: its own metrics, and how the turns it served were judged."""
    status = v.get("status") or v["metrics"].get("status") or "published"
    canary = v.get("canary")  # a canary gate's figures (JSON text), where the store has them
    if isinstance(canary, str):
        canary = json.loads(canary)
    return v | {"status": status, "canary": canary, "served": None if served is None else _rates(served)}


def turn_view(t: Turn, judgment: dict[str, Any] | None) -> dict[str, Any]:
    """A turn as its session's page shows it: what was new in the request, the answer, the judgment."""
    last_answer = max((i for i, m in enumerate(t.messages) if m.get("role") == "assistant"), default=-1)
    return {
        "id": t.id,
        "index": t.index,
        "type": t.turn_type,
        "created_at": t.created_at,
        "versions": t.versions,
        "finish_reason": t.finish_reason,
        "new_messages": t.messages[last_answer + 1 :],
        "response": t.response_text,
        "tool_calls": t.tool_calls,
        "next_state": t.next_state,
        "next_state_match": t.next_state_match,
        "judgment": judgment,
    }


def to_json(value: Any) -> Any:
    """`value` as JSON data, built anew: a dataclass becomes a dict of its fields, in their order (a
    field whose metadata says `omit_if_none` is left out while None); tuples become lists; NaN and
    infinities become None."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in fields(value):
            v = getattr(value, f.name)
            if v is not None or not f.metadata.get("omit_if_none"):
                out[f.name] = to_json(v)
        return out
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return finite(value)


def finite(value: Any) -> Any:
    """`value` with NaN and infinities replaced by None, so it is valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
