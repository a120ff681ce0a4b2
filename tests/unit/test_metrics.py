"""The Prometheus families /metrics builds from a pipeline snapshot (a hand-written one here)."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from clawrl.api.metrics import Metrics
from clawrl.api.state import finite

ENGINE = {
    "active": 3,
    "waiting": 1,
    "max_batch_size": 4,
    "tokens_generated": 120,
    "requests_finished": 7,
    "requests_cancelled": 1,
    "steps": 40,
    "batch_rows": 90,
    "extra": {"prefix_cache": {"lookups": 5, "hits": 2, "hit_tokens": 300, "entries": 1, "bytes": 1024}},
}
SERVED = {"version": "v3", "since": 1700000000.0, "swaps": 3, "last_swap_s": 0.2}
TRAINER = {
    "status": "restarting",
    "restarts": 2,
    "latest": {
        "step": 3,
        "loss": 0.5,
        "kl": 0.01,
        "clip_frac": 0.1,
        "tokens_per_s": 40.0,
        "mean_reward": None,
    },
}


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
    snap = {"engine": ENGINE, "served": SERVED, "judge": {"status": "off"}, "trainer": TRAINER, "store": None}
    m = scrape(snap)
    assert m["clawrl_trainer_restarts_total", ()] == 2
    assert m["clawrl_trainer_status", (("status", "restarting"),)] == 1
    assert m["clawrl_train_loss", ()] == 0.5 and m["clawrl_train_step", ()] == 3
    assert ("clawrl_train_mean_reward", ()) not in m  # unknown is left out, not reported as 0
    assert m["clawrl_engine_batch_occupancy", ()] == 0.75
    assert m["clawrl_engine_batch_rows_total", ()] == 90 and m["clawrl_engine_steps_total", ()] == 40
    assert m["clawrl_prefix_cache_hits_total", ()] == 2 and m["clawrl_prefix_cache_lookups_total", ()] == 5
    assert m["clawrl_prefix_cache_bytes", ()] == 1024  # a gauge: it goes down too
    assert (
        m["clawrl_served_version", (("version", "v3"),)] == 1 and m["clawrl_served_version_number", ()] == 3
    )
    assert not any(name.startswith("clawrl_judge") for name, _ in m)  # judge off: no judge families


def test_without_a_trainer_or_store_only_serving_figures_show():
    snap = {"engine": ENGINE, "served": SERVED, "judge": {"status": "off"}, "trainer": {"status": "off"}}
    m = scrape(snap | {"store": None})
    assert not any(name.startswith(("clawrl_train", "clawrl_samples", "clawrl_turns")) for name, _ in m)
    assert ("clawrl_http_requests_total", ()) not in m


def test_snapshots_are_valid_json_even_with_a_nan_loss():
    assert finite({"a": [float("nan"), 1.0], "b": {"c": float("inf")}, "d": "x"}) == {
        "a": [None, 1.0],
        "b": {"c": None},
        "d": "x",
    }
