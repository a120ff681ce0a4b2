"""A sample's age: the training steps between the version that made it and the one trained from.

The age is counted along the versions' lineage (each version names its parent), by their steps:
a version the trainer publishes is its parent's step + 1, and a rollback copies its source's step
(the same weights). A held version is never served and never trained from, so it is on no
servable version's line and ages nothing: after two canary holds (v2 and v3 held, v4 trained
from v1) a sample made by v1 is one step behind v4, not three version numbers.

Between versions on two branches (a rollback left the newer one behind) the age is the steps
from each up to their last common ancestor, summed: the weights differ by both. A version the
store does not list (an old store, a hand-made test) is aged by its number, as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from clawrl.types import Version
from clawrl.version_folder import version_number


def steps_behind(lineage: Mapping[str, Version], made_by: str, current: str) -> int:
    """Training steps between `made_by` and `current` along `lineage` (every version, by name)."""
    if made_by == current:
        return 0
    if made_by not in lineage or current not in lineage:
        return version_number(current) - version_number(made_by)
    line = {v.name for v in _up(lineage, current)}
    common = next((v for v in _up(lineage, made_by) if v.name in line), None)
    if common is None:  # two roots: should not happen (every line starts at v0)
        return version_number(current) - version_number(made_by)
    return (lineage[made_by].step - common.step) + (lineage[current].step - common.step)


def _up(lineage: Mapping[str, Version], name: str | None) -> Iterator[Version]:
    """`name`, its parent, its parent's parent... as far as the lineage goes (a loop is cut)."""
    seen: set[str] = set()
    while name is not None and name in lineage and name not in seen:
        seen.add(name)
        yield lineage[name]
        name = lineage[name].parent
