"""Re-reads a recorded run's stale samples by lineage: how many of those the trainer marked stale
(counting version numbers, held versions included) were within `train.max_staleness` training
steps of the version they were checked against, along the versions' parents
(clawrl/train/lineage.py, the rule the trainer uses now).

    .venv/bin/python bench/staleness.py RUN_DIR [--max-staleness N]
    .venv/bin/python bench/staleness.py --replay [--holds 2,3] [--steps 12] [--batch 4]

Each stale sample's reason names the version that made it and the one it was checked against
("made by v1, 3 versions behind v4"). The store is opened read-only (a store from before the
newest migrations too); `train.max_staleness` is the run's config.json's unless given. The
count is of each sample at the moment it was marked: a rerun under the lineage rule would train
some of them, and its later batches and versions would differ, so this bounds the change rather
than replaying the run. Pure Python, exact counts.

`--replay` runs one synthetic trace (by default bench/backlog.py's: a backlog of 40 samples made
by v0, then 6 to 12 new samples a step made by the version served one or two steps before, seeded;
`--rate`, `--backlog`) through
the real `triage` twice, counting version numbers and along the lineage, with the canary holding
the versions `--holds` names (the trainer goes back to the last passed one, the server keeps
serving it); five seeds, each rule's stale samples of all made.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clawrl.config import TrainConfig  # noqa: E402
from clawrl.train.lineage import steps_behind  # noqa: E402
from clawrl.train.trainer import triage  # noqa: E402
from clawrl.types import HELD, PASSED, Sample, Version  # noqa: E402

REASON = re.compile(r"made by (\S+), \d+ (?:versions|training steps) behind (\S+)")


def reread(db: Path, max_staleness: int) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    lineage = {
        r["name"]: Version(r["name"], r["step"], parent=r["parent"], status=r["status"])
        for r in conn.execute("SELECT name, step, parent, status FROM versions")
    }
    samples = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
    stale = [r[0] for r in conn.execute("SELECT status_reason FROM samples WHERE status = 'stale'")]
    within = 0
    for reason in stale:
        match = REASON.match(reason or "")
        if match and steps_behind(lineage, match[1], match[2]) <= max_staleness:
            within += 1
    held = sum(v.held for v in lineage.values())
    return {"samples": samples, "stale": len(stale), "within": within, "held": held}


def replay(
    steps: int,
    batch: int,
    bound: int,
    holds: set[int],
    by_lineage: bool,
    seed: int,
    rate: tuple[int, int] = (6, 12),
    backlog: int = 40,
) -> tuple[int, int]:
    """(samples made, samples marked stale) of one seeded trace, under one staleness rule."""
    rng = random.Random(seed)
    cfg = TrainConfig(batch_size=batch, max_staleness=bound)
    lineage = {"v0": Version("v0", 0)}
    current, served, number = "v0", ["v0"], 0  # served: the version served after each step
    ready: list[Sample] = []
    made = stale = 0
    for step in range(steps):
        for lag in [0] * backlog if step == 0 else [rng.choice((1, 2)) for _ in range(rng.randint(*rate))]:
            version = served[max(0, len(served) - 1 - lag)]
            ready.append(Sample(f"t{made}", "rl", [1], [2], [-1.0], version, 1.0, id=made))
            made += 1
        t = triage(ready[: 4 * batch], current, cfg, lineage=lineage if by_lineage else None)
        stale += len(t.stale)
        gone = {s.id for s, _ in t.stale}
        if len(t.usable) >= batch:
            gone |= {s.id for s in t.usable[:batch]}
            number += 1
            name, held = f"v{number}", number in holds
            lineage[name] = Version(
                name, lineage[current].step + 1, parent=current, status=HELD if held else PASSED
            )
            current = current if held else name
        served.append(current)
        ready = [s for s in ready if s.id not in gone]
    return made, stale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, nargs="?")
    parser.add_argument("--max-staleness", type=int, default=None)
    parser.add_argument("--replay", action="store_true", help="a synthetic trace with held versions")
    parser.add_argument("--holds", default="2,3", help="the version numbers the canary holds")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rate", default="6,12", help="the fewest and most samples made a step")
    parser.add_argument("--backlog", type=int, default=40, help="samples made by v0 before the first step")
    args = parser.parse_args()
    if args.replay:
        holds = {int(n) for n in args.holds.split(",") if n}
        low, high = (int(n) for n in args.rate.split(","))
        bound = 2 if args.max_staleness is None else args.max_staleness
        print(
            f"holds {sorted(holds)}, {args.steps} steps, batch {args.batch}, max_staleness {bound}, "
            f"{low} to {high} samples a step, backlog {args.backlog}"
        )
        print(f"{'seed':>4} {'made':>5} {'stale (numbers)':>16} {'stale (lineage)':>16}")
        for seed in range(5):
            trace = {"rate": (low, high), "backlog": args.backlog}
            made, by_number = replay(args.steps, args.batch, bound, holds, False, seed, **trace)
            _, by_lineage = replay(args.steps, args.batch, bound, holds, True, seed, **trace)
            print(f"{seed:>4} {made:>5} {by_number:>16} {by_lineage:>16}")
        return
    if args.run_dir is None:
        parser.error("RUN_DIR, or --replay")
    config = args.run_dir / "config.json"
    bound = args.max_staleness
    if bound is None:
        bound = json.loads(config.read_text())["train"]["max_staleness"] if config.exists() else 2
    n = reread(args.run_dir / "clawrl.db", bound)
    print(f"{n['samples']} samples, {n['held']} held versions, max_staleness {bound}")
    print(f"marked stale (version numbers): {n['stale']}")
    print(f"stale by lineage when marked:   {n['stale'] - n['within']} ({n['within']} were within the bound)")


if __name__ == "__main__":
    main()
