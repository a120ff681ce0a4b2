"""The canary gate: every version the trainer makes is checked before it is served.

- `general.py`, `general.jsonl`: the general capability set (canary and replay halves);
- `measure.py`: reference log-likelihoods, greedy answers and the forward KL(base || new), in torch;
- `verdict.py`: the pure rule that holds a version;
- `gate.py`: the check the trainer runs after each step;
- `replay.py`: `train.replay_fraction`, KL-anchored replay of the general set;
- `recheck.py`: `clawrl canary`, the same check on published versions, read-only.

`trainer_hooks` is the trainer process's one call into this package. What the
server does with a held version is in `clawrl/api/versions.py` (never served,
`/healthz` `guard`); the store keeps each version's status and figures
(`clawrl/store/versions.py`, migration m006).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from clawrl.config import Config
from clawrl.store.db import Store
from clawrl.types import Version

log = logging.getLogger("clawrl.trainer")


def trainer_hooks(
    config: Config, store: Store, policy: Any, tokenizer: Any
) -> tuple[Callable[[Any], tuple[str, dict]] | None, Callable[[Version], object] | None]:
    """(canary check, what to do after a hold) for `TrainLoop`; (None, None) when the gate is off."""
    if not config.guard.enabled:
        return None, None
    from clawrl.guard.gate import Canary

    canary = Canary.build(store, tokenizer, config.guard, config.train.micro_batch_tokens)
    if config.guard.on_hold != "rollback":
        return canary.check, None

    def publish_rollback(target: Version) -> None:
        from clawrl.train.publish import rollback

        version = rollback(store, config, target.name)
        log.warning("published %s, a rollback to %s, after a held version", version.name, target.name)

    return canary.check, publish_rollback
