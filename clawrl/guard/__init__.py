"""The canary gate: every version the trainer makes is checked before it is served.

- `general.py`, `general.jsonl`: the general capability set (canary and replay halves);
- `measure.py`: reference log-likelihoods, greedy answers and the forward KL(base || new), in torch;
- `verdict.py`: the pure rule that holds a version;
- `collapse.py`: the collapse figures (entropy ratio, self-ROUGE-L, drift) and their limits, pure;
- `gate.py`: the check the trainer runs after each step;
- `replay.py`: `train.replay_fraction`, KL-anchored replay of the general set;
- `recheck.py`: `clawrl canary`, the same check on published versions, read-only.

`trainer_hooks` is the trainer process's one call into this package (replay
and the gate). What the server does with a held version is in
`clawrl/engine/watcher.py` (never served, `/healthz` `guard`); the store keeps
each version's status and figures (`clawrl/store/versions.py`, migration m006).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clawrl.config import Config
from clawrl.store.db import Store
from clawrl.types import DEFAULT_USER, Version

log = logging.getLogger("clawrl.trainer")


def trainer_hooks(
    config: Config, store: Store | None, policy: Any, base_dir: Path, check: bool, group: Any = None
) -> tuple[Callable[[Any], tuple[str, dict]] | None, Callable[..., object] | None]:
    """Give the policy's trainer replay (`train.replay_fraction` > 0), and return (canary check,
    what to do after a hold) for `TrainLoop`: (None, None) unless `check` (the gate is on and this
    process publishes, or is a rank of an FSDP `group`, which runs the canary with rank 0). The
    tokenizer (both render the general set) is loaded only if one is on."""
    if not check and config.train.replay_fraction <= 0:
        return None, None
    import transformers

    from clawrl.guard.replay import attach_replay

    tokenizer = transformers.AutoTokenizer.from_pretrained(base_dir)
    attach_replay(policy, tokenizer)
    if not check:
        return None, None
    lockstep = group is not None and group.lockstep
    assert store is not None or lockstep, "the process that checks versions publishes them: it has the store"
    from clawrl.guard.gate import Canary

    share = group.broadcast if lockstep else None
    canary = Canary.build(
        store=store, tokenizer=tokenizer, cfg=config.guard, budget=policy.cfg.micro_batch_tokens, share=share
    )
    if config.guard.on_hold != "rollback" or store is None:
        return canary.check, None

    def publish_rollback(target: Version, user: str = DEFAULT_USER) -> None:
        from clawrl.train.publish import rollback

        version = rollback(store, config, target.name, user)
        log.warning("published %s, a rollback to %s, after a held version", version.name, target.name)

    return canary.check, publish_rollback
