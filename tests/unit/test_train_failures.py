"""A failed training step (clawrl/train/failures.py): the skip reason, the batch rule that keeps
samples that failed before apart, and the store's count of failed steps (m020)."""

from __future__ import annotations

import torch

from clawrl.store.db import Store
from clawrl.testing import make_turn
from clawrl.train.batch import halves
from clawrl.train.failures import MAX_FAILURES, failure_reason, pick
from clawrl.types import Sample


def sample(i: int, attempts: int = 0) -> Sample:
    return Sample(f"t{i}", "rl", [1], [2], [-1.0], "v0", 1.0, id=i, attempts=attempts)


def test_a_batch_holds_at_most_one_sample_that_failed_before():
    usable = [sample(1, 1), sample(2, 1), sample(3), sample(4, 1), sample(5), sample(6)]
    assert [s.id for s in pick(usable, 4)] == [1, 3, 5, 6]
    assert [s.id for s in pick(usable[:4], 4)] == [1, 3]  # too few untried ones: the loop waits
    assert [s.id for s in pick([sample(i) for i in range(6)], 4)] == [0, 1, 2, 3]  # oldest first


def test_the_reason_names_the_exception_and_its_message_on_one_line():
    assert failure_reason(ValueError("bad\n  row")) == "failed step: ValueError: bad row"
    oom = failure_reason(torch.OutOfMemoryError("CUDA out of memory. " * 50))
    assert oom.startswith("failed step: OutOfMemoryError: CUDA out of memory.") and len(oom) < 360
    assert failure_reason(RuntimeError()) == "failed step: RuntimeError: (no message)"


def test_halves_split_each_micro_batch_in_two():
    assert halves([[0, 1, 2, 3], [4], [5, 6, 7]]) == [[0, 1], [2, 3], [4], [5], [6, 7]]


def test_failed_steps_are_counted_in_the_store_and_the_second_skips(tmp_path):
    path = tmp_path / "clawrl.db"
    with Store.open(path) as store:
        store.upsert_session("s", "header", 1.0)
        for i in range(3):
            store.insert_turn(make_turn(f"t{i}", "s", i, created_at=10.0 + i))
        ids = store.insert_samples([Sample(f"t{i}", "rl", [1], [2], [-1.0], "v0", 1.0) for i in range(3)])
        assert store.claim_samples(ids[:2]) == ids[:2]
        assert store.fail_samples(ids, "failed step: ValueError: boom", MAX_FAILURES) == []
        assert store.release_samples(ids[:2]) == 2
        # ids[2] was not claimed: a failed step did not hold it.
        assert [s.attempts for s in store.ready_samples()] == [1, 1, 0]
        assert [s.id for s in store.ready_samples(untried=True)] == [ids[2]]
    with Store.open(path) as store:  # a restarted trainer reads the same count
        assert [s.attempts for s in store.ready_samples()] == [1, 1, 0]
        store.claim_samples([ids[0]])
        assert store.fail_samples([ids[0]], "failed step: ValueError: boom", MAX_FAILURES) == [ids[0]]
        assert store.sample_status(ids[0]) == ("skipped", "failed step: ValueError: boom")
        assert store.counters()["skipped:failed step"] == 1
        (shown,) = [(s.attempts, why) for s, why in store.turn_samples("t0")]
        assert shown == (2, "failed step: ValueError: boom")
