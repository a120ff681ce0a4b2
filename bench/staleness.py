"""Re-reads a recorded run's stale samples by lineage: how many of those the trainer marked stale
(counting version numbers, held versions included) were within `train.max_staleness` training
steps of the version they were checked against, along the versions' parents
(clawrl/train/lineage.py, the rule the trainer uses now).

    .venv/bin/python bench/staleness.py RUN_DIR [--max-staleness N]

Each stale sample's reason names the version that made it and the one it was checked against
("made by v1, 3 versions behind v4"). The store is opened read-only (a store from before the
newest migrations too); `train.max_staleness` is the run's config.json's unless given. The
count is of each sample at the moment it was marked: a rerun under the lineage rule would train
some of them, and its later batches and versions would differ, so this bounds the change rather
than replaying the run. Pure Python, exact counts.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clawrl.train.lineage import steps_behind  # noqa: E402
from clawrl.types import Version  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--max-staleness", type=int, default=None)
    args = parser.parse_args()
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
