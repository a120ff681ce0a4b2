"""GET /metrics: the server in Prometheus' text format, through `prometheus_client`.

Two kinds of figures, in one registry per app:

- observed per request by `MetricsMiddleware`, a plain ASGI middleware (no
  per-request task; a counter and a histogram updated in place): requests by
  route template and status, their latency, and for chat completions the time
  to the first token and the tokens in and out; the version watcher observes
  each swap's duration;
- read at scrape time from the pipeline snapshot (`api/state.py`: a typed
  `Snapshot`, cached for a second, its store part from the m005 running totals): the engine's counters,
  batch occupancy and prefix cache, judge votes by outcome, turns, samples by
  status, versions, the served version, the trainer's restarts and its latest
  step; with `server.users`, `clawrl_user_*` gauges labelled `user` for the
  `per_user.TOP_USERS` busiest users (by turns), the rest summed as `user="other"`
  (bounded cardinality, docs/users.md). Nothing of this costs the serving path anything between scrapes.

Behind the API key when one is set (`Authorization: Bearer <key>`). Scrape it with a job
`{job_name: clawrl, static_configs: [{targets: ['127.0.0.1:8000']}]}` (see docs/evaluation.md).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.process_collector import ProcessCollector

from clawrl.api.auth import Keys, bearer_guard
from clawrl.api.per_user import UserRow, top_users
from clawrl.api.state import PipelineState, Served, Snapshot, Stored, TrainerState
from clawrl.engine.base import EngineStats
from clawrl.judge.worker import JudgeHealth
from clawrl.types import SKIP_REASONS

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
SWAP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
CHAT_ROUTE = "/v1/chat/completions"
_NAME = re.compile(r"[^a-zA-Z0-9_]")
# The prefix cache's numbers that only ever grow (Prometheus counters); the rest are gauges.
_CACHE_COUNTERS = ("lookups", "hits", "hit_tokens", "looked_up_tokens", "inserted", "evicted", "cleared")


class Metrics:
    """The app's registry: request metrics observed live, pipeline metrics collected on scrape."""

    def __init__(self, state: PipelineState) -> None:
        self.state = state
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "clawrl_http_requests",
            "HTTP requests by route template and status.",
            ["route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "clawrl_http_request_duration_seconds",
            "Request latency, to the last byte of the response (a stream's end).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "clawrl_time_to_first_token_seconds",
            "Chat completions: from the request's arrival to the engine's first token.",
            ["stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("clawrl_prompt_tokens", "Prompt tokens of chat completions.", registry=r)
        self.completion_tokens = Counter(
            "clawrl_completion_tokens", "Tokens generated for chat completions.", registry=r
        )
        self.swap = Histogram(
            "clawrl_swap_duration_seconds",
            "From finding a published version to serving it (checkpoint read + swap between steps).",
            buckets=SWAP_BUCKETS,
            registry=r,
        )
        ProcessCollector(registry=r)
        r.register(_PipelineCollector(self))
        self.snapshot: Snapshot | None = None

    def swapped(self, version: str, seconds: float) -> None:
        """The version watcher's report of a swap: observed, and shown as the served version (the default
        user's: a user's own version, `alice/v3`, is in that user's answers, docs/users.md)."""
        self.swap.observe(seconds)
        if "/" not in version:
            self.state.swapped(version, seconds)

    def request(self, scope: dict[str, Any], status: int, started: float, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", "unmatched")  # the template: bounded label values
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)
        prep = scope.get("state", {}).get("chat")  # set by the chat route (`request.state.chat`)
        if route != CHAT_ROUTE or prep is None:
            return
        self.prompt_tokens.inc(len(prep.completion.prompt_ids))
        self.completion_tokens.inc(len(prep.completion.tokens))
        if prep.first_token_at is not None:
            self.ttft.labels(str(bool(prep.request.stream)).lower()).observe(
                max(0.0, prep.first_token_at - started)
            )

    async def scrape(self) -> bytes:
        self.snapshot = await self.state.snapshot()
        return generate_latest(self.registry)


def metrics_router(keys: Keys) -> APIRouter:
    """/metrics: every user's totals, so with users on the admin key's alone (docs/users.md)."""
    router = APIRouter(dependencies=[Depends(bearer_guard(keys, admin_only=True))])

    @router.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        body = await request.app.state.metrics.scrape()
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return router


class MetricsMiddleware:
    """Counts and times every HTTP request; a stream is timed to its last chunk."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, t0 = time.time(), time.perf_counter()
        status = 0

        async def send_and_note(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:  # 499: the client left before any answer (nginx's name for it)
            self.metrics.request(scope, status or 499, started, time.perf_counter() - t0)


class _PipelineCollector:
    """Prometheus families from the snapshot `Metrics.scrape` has just taken."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self.metrics.snapshot
        if snap is None:
            return
        yield from _engine(snap.engine, snap.max_batch_size)
        yield from _served(snap.served)
        if snap.judge is not None:
            yield from _judge(snap.judge)
        yield from _trainer(snap.trainer)
        if snap.store is not None:
            yield from _store(snap.store)
            if snap.store.users:
                yield from _users(top_users(snap.store.users))


def _gauge(name: str, doc: str, value: Any) -> Iterator[Metric]:
    """A gauge of a known value: None, NaN or infinite (unknown) is left out, not reported."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        yield GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> Metric:
    return CounterMetricFamily(name, doc, value=value)


def _engine(e: EngineStats, max_batch_size: int) -> Iterator[Metric]:
    yield from _gauge("clawrl_engine_active_requests", "Sequences in the decoding batch now.", e.active)
    yield from _gauge("clawrl_engine_waiting_requests", "Requests waiting to join the batch.", e.waiting)
    occupancy = e.active / max_batch_size if max_batch_size else 0.0
    yield from _gauge(
        "clawrl_engine_batch_occupancy", "Active sequences / engine.max_batch_size, now.", occupancy
    )
    yield _counter(
        "clawrl_engine_batch_rows",
        "Sequences summed over decoding steps: rate(batch_rows) / rate(steps) is the mean batch size.",
        e.batch_rows,
    )
    yield _counter("clawrl_engine_steps", "Decoding steps run.", e.steps)
    yield _counter("clawrl_engine_generated_tokens", "Tokens the engine sampled.", e.tokens_generated)
    yield _counter("clawrl_engine_requests_finished", "Engine requests finished.", e.requests_finished)
    yield _counter("clawrl_engine_requests_cancelled", "Engine requests cancelled.", e.requests_cancelled)
    extra = dict(e.extra)  # engine-specific figures: a dict by design
    cache = extra.pop("prefix_cache", None)
    if cache is not None:
        for key, value in cache.items():
            name, doc = f"clawrl_prefix_cache_{key}", f"Prefix cache: {key.replace('_', ' ')}."
            yield _counter(name, doc, value) if key in _CACHE_COUNTERS else _gauge_of(name, doc, value)
    for key, value in _flat(extra):
        yield from _gauge(f"clawrl_engine_{key}", f"Engine statistic {key!r} (EngineStats.extra).", value)


def _gauge_of(name: str, doc: str, value: float) -> Metric:
    return GaugeMetricFamily(name, doc, value=value)


def _flat(extra: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested `extra` values as `a_b` names, only the characters Prometheus allows."""
    for key, value in extra.items():
        name = _NAME.sub("_", f"{prefix}{key}")
        if isinstance(value, dict):
            yield from _flat(value, name + "_")
        else:
            yield name, value


def _served(s: Served) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "clawrl_served_version", "The version served now (1, labelled).", labels=["version"]
    )
    info.add_metric([s.version], 1)
    yield info
    yield from _gauge("clawrl_served_version_number", "N of the served version vN.", _number(s.version))
    yield from _gauge("clawrl_served_since_seconds", "Unix time the served version was swapped in.", s.since)
    yield _counter("clawrl_swaps", "Versions swapped in by this server.", s.swaps)


def _judge(j: JudgeHealth) -> Iterator[Metric]:
    votes = CounterMetricFamily(
        "clawrl_judge_votes", "Judge votes by kind and outcome.", labels=["kind", "outcome"]
    )
    for kind_outcome, n in j.votes.items():  # "prm:negative" -> labels kind="prm", outcome="negative"
        votes.add_metric(kind_outcome.split(":", 1), n)
    yield votes
    duration = SummaryMetricFamily(
        "clawrl_judge_vote_duration_seconds",
        "Judge calls: how long each vote took.",
        count_value=sum(j.votes.values()),
        sum_value=j.vote_seconds,
    )
    yield duration
    yield _counter("clawrl_judge_judged", "Turns judged by this server.", j.judged)
    yield from _gauge("clawrl_judge_in_flight", "Judge calls waiting for their backend.", j.in_flight)
    yield from _gauge("clawrl_judge_queued", "Turns queued for judging.", j.queued)
    yield from _gauge("clawrl_judge_degraded", "1 while most recent votes fail.", int(j.status == "degraded"))
    yield _counter("clawrl_memory_lessons", "Lessons found in hints and comments.", j.lessons)
    yield _counter("clawrl_memory_failures", "Judged turns memory failed to learn from.", j.memory_failures)


def _trainer(t: TrainerState) -> Iterator[Metric]:
    if t.health is None:  # no trainer process in this server
        return
    yield _counter("clawrl_trainer_restarts", "Times the trainer process was restarted.", t.health.restarts)
    up = GaugeMetricFamily(
        "clawrl_trainer_status", "The trainer process's state (1, labelled).", labels=["status"]
    )
    up.add_metric([t.health.status], 1)
    yield up
    keys = ("step", "loss", "kl", "tokens_per_s", "processed_tokens_per_s", "mean_reward")
    causes = ("mismatch", "mismatch_exact", "mismatch_stale", "mismatch_processed", "mismatch_conditioned")
    weights = ("is_weight_mean", "is_weight_min", "is_truncated_frac", "is_truncated_samples")
    for key in (*keys, *causes, *weights, "opd_gap_p05", "opd_gap_p50", "opd_gap_p95", "opd_gap_clipped"):
        value = None if t.latest is None else getattr(t.latest, key)
        yield from _gauge(f"clawrl_train_{key}", f"The latest published step's {key}.", value)


def _store(s: Stored) -> Iterator[Metric]:
    c = s.counts
    turns = CounterMetricFamily("clawrl_turns", "Turns recorded, by type.", labels=["type"])
    turns.add_metric(["main"], c.main)
    turns.add_metric(["side"], c.side)
    yield turns
    yield _counter("clawrl_turns_with_next_state", "Turns whose next state arrived.", c.next_state)
    yield _counter("clawrl_turns_judged", "Turns with a judgment.", c.judged)
    yield _counter("clawrl_turns_hinted", "Judged turns whose judgment accepted a hint.", c.hinted)
    yield _counter("clawrl_sessions", "Sessions recorded.", c.sessions)
    samples = GaugeMetricFamily("clawrl_samples", "Training samples by status.", labels=["status"])
    for status, n in sorted(c.samples.items()):
        samples.add_metric([status], n)
    yield samples
    skipped = CounterMetricFamily(
        "clawrl_samples_skipped", "Samples the trainer skipped, by reason.", labels=["reason"]
    )
    for reason in sorted({*SKIP_REASONS, *c.skipped}):
        skipped.add_metric([reason], c.skipped.get(reason, 0))
    yield skipped
    yield _counter("clawrl_episodes", "Episodes posted to /v1/episodes (Track 2).", c.episodes)
    yield _counter("clawrl_episodes_dropped", "Episodes posted with no reward.", c.episodes_dropped)
    groups = CounterMetricFamily("clawrl_groups", "Episode groups closed, by status.", labels=["status"])
    for status in ("used", "dropped", "eval"):
        groups.add_metric([status], c.groups.get(status, 0))
    yield groups
    memory = CounterMetricFamily(
        "clawrl_memory_prompts", "Prompts that got a memory block, or had it dropped.", labels=["outcome"]
    )
    memory.add_metric(["injected"], c.memory_injected)
    memory.add_metric(["dropped"], c.memory_dropped)
    yield memory
    yield _counter("clawrl_memory_samples", "Memory distillation samples made.", c.memory_samples)
    states = CounterMetricFamily(
        "clawrl_memory_probed", "Experiences the retirement probe moved, by new state.", labels=["state"]
    )
    states.add_metric(["distilled"], c.memory_distilled)
    states.add_metric(["active"], c.memory_reactivated)
    yield states
    yield _counter("clawrl_versions_published", "Versions published after v0.", s.version_count - 1)


def _users(rows: list[UserRow]) -> Iterator[Metric]:
    """Per-user gauges: one label value a row (`top_users`: at most TOP_USERS + `other`)."""
    served = GaugeMetricFamily(
        "clawrl_user_served_version",
        "The version a user's requests get (1, labelled).",
        labels=["user", "version"],
    )
    samples = GaugeMetricFamily(
        "clawrl_user_samples", "A user's samples by status.", labels=["user", "status"]
    )
    plain = {
        "turns": GaugeMetricFamily("clawrl_user_turns", "Turns a user's sessions recorded.", labels=["user"]),
        "versions": GaugeMetricFamily(
            "clawrl_user_versions", "Versions published on a user's line.", labels=["user"]
        ),
        "held": GaugeMetricFamily("clawrl_user_versions_held", "A user's versions held.", labels=["user"]),
        "memory": GaugeMetricFamily(
            "clawrl_user_memory_items", "A user's live experiences.", labels=["user"]
        ),
    }
    for row in rows:
        if row.served:
            served.add_metric([row.user, row.served], 1)
        for status in ("ready", "trained", "skipped"):
            samples.add_metric([row.user, status], getattr(row, status))
        for key, family in plain.items():
            family.add_metric([row.user], getattr(row, key))
    yield from (served, samples, *plain.values())


def _number(version: str) -> int | None:
    digits = version.removeprefix("v")
    return int(digits) if digits.isdigit() else None
