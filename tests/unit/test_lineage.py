"""A sample's age along the lineage of versions (clawrl/train/lineage.py): held versions age nothing."""

from __future__ import annotations

from clawrl.config import TrainConfig
from clawrl.train.lineage import steps_behind
from clawrl.train.trainer import triage
from clawrl.types import HELD, PASSED, Sample, Version


def lineage(*versions: Version) -> dict[str, Version]:
    return {v.name: v for v in (Version("v0", 0), *versions)}


TWO_HOLDS = lineage(
    Version("v1", 1, parent="v0", status=PASSED),
    Version("v2", 2, parent="v1", status=HELD),
    Version("v3", 2, parent="v1", status=HELD),
    Version("v4", 2, parent="v1", status=PASSED),  # trained from v1 again after the holds
)


def test_two_holds_leave_a_sample_one_step_behind_and_not_stale():
    assert steps_behind(TWO_HOLDS, "v1", "v4") == 1  # by numbers: 3
    assert steps_behind(TWO_HOLDS, "v0", "v4") == 2
    made = [Sample(f"t{i}", "rl", [1], [2], [-1.0], "v1", 1.0) for i in range(3)]
    t = triage(made, "v4", TrainConfig(max_staleness=2), lineage=TWO_HOLDS)
    assert t.usable == made and t.stale == []
    strict = triage(made, "v4", TrainConfig(max_staleness=0), lineage=TWO_HOLDS)
    assert [why for _, why in strict.stale] == ["made by v1, 1 training steps behind v4"] * 3
    # Without the lineage (a bare call), by number as before: the figure the issue measured.
    assert [why for _, why in triage(made, "v4", TrainConfig(max_staleness=2)).stale] == [
        "made by v1, 3 training steps behind v4"
    ] * 3


def test_a_rollback_counts_the_steps_of_both_branches():
    # v1..v3 trained in a line; v4 is a rollback to v1 (the same step, the same weights); v5 from it.
    line = lineage(
        Version("v1", 1, parent="v0"),
        Version("v2", 2, parent="v1"),
        Version("v3", 3, parent="v2"),
        Version("v4", 1, parent="v1", metrics={"rollback_of": "v1"}),
        Version("v5", 2, parent="v4"),
    )
    assert steps_behind(line, "v1", "v4") == 0  # a copy of it
    assert steps_behind(line, "v1", "v5") == 1
    assert steps_behind(line, "v3", "v5") == 3  # v3 -> v1 (2 steps), v1 -> v5 (1 step)
    assert steps_behind(line, "v3", "v3") == 0


def test_a_version_the_lineage_does_not_know_is_aged_by_its_number():
    assert steps_behind(TWO_HOLDS, "v1", "v9") == 8
    assert steps_behind({}, "alice/v1", "alice/v3") == 2
