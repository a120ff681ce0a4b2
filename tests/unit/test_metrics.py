"""The Prometheus families /metrics builds from a pipeline snapshot (a hand-written one here), and the
JSON the snapshot and the services' health become at the edge (/dashboard/state.json, /healthz)."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from clawrl.api.dashboard import state_json
from clawrl.api.metrics import Metrics
from clawrl.api.state import Served, Snapshot, Trained, TrainerState, finite, to_json
from clawrl.engine.base import EngineStats
from clawrl.engine.watcher import CanaryCheck, GuardHealth, HeldVersion
from clawrl.judge.worker import JudgeHealth
from clawrl.train.supervisor import TrainerHealth

CACHE = {"lookups": 5, "hits": 2, "hit_tokens": 300, "entries": 1, "bytes": 1024}
ENGINE = EngineStats(
    active=3,
    waiting=1,
    tokens_generated=120,
    requests_finished=7,
    requests_cancelled=1,
    steps=40,
    batch_rows=90,
    extra={"prefix_cache": CACHE},
)
SERVED = Served("v3", since=1700000000.0, swaps=3, last_swap_s=0.2)
RESTARTING = TrainerHealth("restarting", None, restarts=2, last_exit=1, last_error="boom", restart_in_s=1.5)
LATEST = Trained(
    "v3",
    3,
    1700000000.0,
    loss=0.5,
    kl=0.01,
    tokens_per_s=40.0,
    processed_tokens_per_s=900.0,
    mismatch=0.2,
    mismatch_exact=0.004,
    mismatch_stale=0.3,
    is_weight_mean=0.97,
    is_truncated_frac=0.01,
    mean_reward=None,
)
TRAINER = TrainerState(RESTARTING, batch_size=8, latest=LATEST)
JUDGE = JudgeHealth(
    status="degraded",
    judge="scripted",
    method="combine",
    queued=2,
    judged=5,
    failed_votes=3,
    votes={"hint:positive": 3, "prm:failed": 3, "prm:negative": 3},
    in_flight=1,
    latency_s=0.5,
    vote_seconds=4.5,
    last_error="timeout after 1s",
    lessons=4,
    memory_failures=1,
)


def snapshot(judge=None, trainer=TRAINER, engine=ENGINE) -> Snapshot:
    return Snapshot(1700000100.0, "clawrl", "combine", SERVED, engine, 4, judge, trainer, None)


class FixedState:
    """Implements the one method `Metrics` calls: `snapshot()`."""

    def __init__(self, snapshot):
        self._snapshot = snapshot

    async def snapshot(self):
        return self._snapshot

    def swapped(self, version, seconds):
        pass


def scrape(snapshot) -> dict[tuple[str, tuple], float]:
    text = asyncio.run(Metrics(FixedState(snapshot)).scrape()).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_trainer_engine_and_prefix_cache_figures():
    m = scrape(snapshot())
    assert m["clawrl_trainer_restarts_total", ()] == 2
    assert m["clawrl_trainer_status", (("status", "restarting"),)] == 1
    assert m["clawrl_train_loss", ()] == 0.5 and m["clawrl_train_step", ()] == 3
    assert ("clawrl_train_mean_reward", ()) not in m  # unknown is left out, not reported as 0
    assert (
        m["clawrl_train_tokens_per_s", ()] == 40.0 and m["clawrl_train_processed_tokens_per_s", ()] == 900.0
    )
    assert m["clawrl_train_mismatch", ()] == 0.2 and m["clawrl_train_mismatch_exact", ()] == 0.004
    assert m["clawrl_train_mismatch_stale", ()] == 0.3 and ("clawrl_train_mismatch_processed", ()) not in m
    assert m["clawrl_train_is_weight_mean", ()] == 0.97 and m["clawrl_train_is_truncated_frac", ()] == 0.01
    assert not any(name in ("clawrl_train_clip_frac", "clawrl_train_dual_frac") for name, _ in m)
    assert m["clawrl_engine_batch_occupancy", ()] == 0.75
    assert m["clawrl_engine_batch_rows_total", ()] == 90 and m["clawrl_engine_steps_total", ()] == 40
    assert m["clawrl_prefix_cache_hits_total", ()] == 2 and m["clawrl_prefix_cache_lookups_total", ()] == 5
    assert m["clawrl_prefix_cache_bytes", ()] == 1024  # a gauge: it goes down too
    assert (
        m["clawrl_served_version", (("version", "v3"),)] == 1 and m["clawrl_served_version_number", ()] == 3
    )
    assert not any(name.startswith("clawrl_judge") for name, _ in m)  # judge off: no judge families


def test_without_a_trainer_or_store_only_serving_figures_show():
    m = scrape(snapshot(trainer=TrainerState(None, None, None)))
    assert not any(name.startswith(("clawrl_train", "clawrl_samples", "clawrl_turns")) for name, _ in m)
    assert ("clawrl_http_requests_total", ()) not in m


def test_judge_votes_by_kind_and_outcome():
    m = scrape(snapshot(judge=JUDGE))
    assert m["clawrl_judge_votes_total", (("kind", "prm"), ("outcome", "failed"))] == 3
    assert m["clawrl_judge_votes_total", (("kind", "hint"), ("outcome", "positive"))] == 3
    assert m["clawrl_judge_vote_duration_seconds_count", ()] == 9
    assert m["clawrl_judge_vote_duration_seconds_sum", ()] == 4.5
    assert m["clawrl_judge_degraded", ()] == 1 and m["clawrl_judge_queued", ()] == 2
    assert m["clawrl_memory_lessons_total", ()] == 4 and m["clawrl_memory_failures_total", ()] == 1


def test_a_nan_figure_is_left_out_of_metrics():
    nan_loss = TrainerState(RESTARTING, 8, Trained("v3", 3, 1700000000.0, loss=float("nan")))
    m = scrape(snapshot(trainer=nan_loss))
    assert ("clawrl_train_loss", ()) not in m and m["clawrl_train_step", ()] == 3


def test_snapshots_are_valid_json_even_with_a_nan_loss():
    assert finite({"a": [float("nan"), 1.0], "b": {"c": float("inf")}, "d": "x"}) == {
        "a": [None, 1.0],
        "b": {"c": None},
        "d": "x",
    }


def test_state_json_keeps_the_shape_the_page_reads():
    engine = EngineStats(active=1, extra={"x": float("nan")})
    off = state_json(snapshot(trainer=TrainerState(None, 8, None), engine=engine))
    assert list(off) == ["now", "model", "method", "served", "engine", "judge", "trainer", "store"]
    assert off["served"] == {
        "version": "v3",
        "since": 1700000000.0,
        "swaps": 3,
        "last_swap_s": 0.2,
        "fingerprint": "clawrl-v3",
    }
    assert off["engine"]["max_batch_size"] == 4 and off["engine"]["extra"] == {"x": None}
    assert off["judge"] == {"status": "off"} and off["store"] is None
    assert off["trainer"] == {"status": "off", "batch_size": 8, "latest": None}

    on = state_json(snapshot(judge=JUDGE))
    assert on["judge"] == to_json(JUDGE) and on["judge"]["votes"]["prm:negative"] == 3
    assert on["trainer"] == {
        "status": "restarting",
        "pid": None,
        "restarts": 2,
        "last_exit": 1,
        "last_error": "boom",
        "restart_in_s": 1.5,
        "batch_size": 8,
        "latest": {
            "version": "v3",
            "step": 3,
            "created_at": 1700000000.0,
            "loss": 0.5,
            "pg_loss": None,
            "kl": 0.01,
            "entropy": None,
            "grad_norm": None,
            "mean_reward": None,
            "tokens_per_s": 40.0,
            "processed_tokens_per_s": 900.0,
            "mismatch": 0.2,
            "mismatch_exact": 0.004,
            "mismatch_stale": 0.3,
            "mismatch_processed": None,
            "mismatch_conditioned": None,
            "is_weight_mean": 0.97,
            "is_weight_min": None,
            "is_truncated_frac": 0.01,
            "is_truncated_samples": None,
            "opd_gap_p05": None,
            "opd_gap_p50": None,
            "opd_gap_p95": None,
            "opd_gap_clipped": None,
            "opd_topk_kl": None,
        },
    }


def test_health_json_leaves_out_group_fields_with_one_rank():
    one = to_json(RESTARTING)
    assert list(one) == ["status", "pid", "restarts", "last_exit", "last_error", "restart_in_s"]
    group = TrainerHealth("running", 42, 0, None, None, None, num_processes=2, ranks=[{"rank": 0}])
    assert to_json(group)["num_processes"] == 2 and to_json(group)["ranks"] == [{"rank": 0}]
    guard = GuardHealth(1, HeldVersion("v2", "too bad"), CanaryCheck("v2", "held", drop=0.3))
    assert to_json(guard) == {
        "held_versions": 1,
        "last_held": {"version": "v2", "reason": "too bad"},
        "last_check": {
            "version": "v2",
            "status": "held",
            "score": None,
            "base_score": None,
            "drop": 0.3,
            "accuracy": None,
            "base_accuracy": None,
            "accuracy_drop": None,
            "kl": None,
            "seconds": None,
        },
    }
