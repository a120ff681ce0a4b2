"""What every `clawrl` command shares: a one-line failure, the run folder's store opened for an action."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def fail(message: str) -> int:
    """Print `clawrl: error: message` and return exit status 2."""
    print(f"clawrl: error: {message}", file=sys.stderr)
    return 2


def with_store(run_dir: Path, action: Any, readonly: bool = True) -> int:
    """Open the run's store (read-only by default: safe while the server runs) and run `action(store)`.

    The errors a user can cause (an unknown version, an existing output folder) become one-line failures.
    """
    from clawrl.store.db import Store, StoreError

    db = run_dir / "clawrl.db"
    if not db.is_file():
        return fail(f"no clawrl.db in {run_dir} (is it a clawrl run folder?)")
    try:
        with Store.open(db, readonly=readonly) as store:
            return int(action(store) or 0)
    except (StoreError, ValueError, OSError) as exc:
        return fail(str(exc))
