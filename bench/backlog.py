"""Replays a backlog of ready samples through the trainer's triage, oldest first against newest
first, and prints how many samples each trains and leaves `stale`, and how far behind the
trained ones were (the staleness the importance weights must correct).

    .venv/bin/python bench/backlog.py [--steps 40] [--batch 8] [--max-staleness 2]

The trace (deterministic, no model): a trainer restart finds a backlog of 40 samples the last
version made; then each step, while the trainer trains one batch, the judge writes 6 to 12 new
samples (seeded), made by the version served one or two steps ago (judging takes a while).
Each step the real `clawrl.train.trainer.triage` sorts the ready samples read in the given
order (up to 4 batches, as the loop reads them), marks the stale ones, and the step trains the
first `batch` usable ones. Pure Python, a fraction of a second: the figures are exact counts,
not timings, so no baseline run is needed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clawrl.config import TrainConfig  # noqa: E402
from clawrl.train.trainer import triage  # noqa: E402
from clawrl.types import Sample  # noqa: E402


def trace(steps: int, seed: int = 0) -> list[list[int]]:
    """Per step, the producing version's lag (steps behind the trainer) of each new sample."""
    rng = random.Random(seed)
    return [[0] * 40] + [[rng.choice((1, 2)) for _ in range(rng.randint(6, 12))] for _ in range(steps - 1)]


def replay(arrivals: list[list[int]], batch: int, max_staleness: int, newest_first: bool) -> dict[str, float]:
    cfg = TrainConfig(batch_size=batch, max_staleness=max_staleness)
    ready: list[Sample] = []
    trained_behind: list[int] = []
    stale = 0
    next_id = 0
    for step, lags in enumerate(arrivals):
        for lag in lags:
            made = max(0, step - lag)
            ready.append(Sample(f"t{next_id}", "rl", [1], [2], [-1.0], f"v{made}", 1.0, id=next_id))
            next_id += 1
        view = sorted(ready, key=lambda s: s.id or 0, reverse=newest_first)[: 4 * batch]
        t = triage(view, f"v{step}", cfg)
        gone = {s.id for s, _ in t.stale} | {s.id for s in t.usable[:batch]}
        stale += len(t.stale)
        trained_behind += [step - int(s.version[1:]) for s in t.usable[:batch]]
        ready = [s for s in ready if s.id not in gone]
    # What is left ready at the end is neither trained nor stale yet.
    return {
        "trained": len(trained_behind),
        "stale": stale,
        "left": len(ready),
        "mean_behind": statistics.fmean(trained_behind) if trained_behind else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    print(f"{'seed':>4} {'order':>12} {'trained':>8} {'stale':>6} {'left':>5} {'versions behind (mean)':>24}")
    totals: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for seed in range(args.seeds):
        arrivals = trace(args.steps, seed)
        for newest in (False, True):
            r = replay(arrivals, args.batch, args.max_staleness, newest)
            totals[newest].append(r)
            name = "newest first" if newest else "oldest first"
            counts = f"{r['trained']:>8} {r['stale']:>6} {r['left']:>5}"
            print(f"{seed:>4} {name:>12} {counts} {r['mean_behind']:>24.2f}")
    old, new = (sum(r["stale"] for r in totals[k]) for k in (False, True))
    behind = [statistics.fmean(r["mean_behind"] for r in totals[k]) for k in (False, True)]
    print(f"stale: newest first / oldest first = {new}/{old} = {new / old if old else float('nan'):.2f}")
    print(f"versions behind a trained sample: {behind[1]:.2f} newest first, {behind[0]:.2f} oldest first")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
