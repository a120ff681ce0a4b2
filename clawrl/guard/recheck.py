"""`clawrl canary`: measure the canary on a run folder's versions after the fact.

The trainer checks each version once, as it makes it. This re-runs the same
check (`Canary.check`, the run's own `guard` settings) on any published
versions: ones from before the gate, or all of a run to see its trajectory
(the figures docs/training.md's tables show). It reads the store and the checkpoint
folders, and changes nothing: a version's status stays what the gate decided
when it was published. The KL is read on the store's newest real turns, the
same ones for every version, so the versions compare on equal terms.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import transformers

from clawrl.config import Config
from clawrl.guard.gate import Canary
from clawrl.model.load import model_folder, served_context
from clawrl.store.db import Store
from clawrl.train.policy import build_policy
from clawrl.train.publish import require_weights
from clawrl.version_folder import weights_pruned


def recheck(config: Config, store: Store, names: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """(version, recorded status, figures) for each named version (default: all), oldest first."""
    versions = store.versions()
    if names:
        known = {v.name for v in versions}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"no version {', '.join(unknown)} in {config.run_dir}")
        versions = [require_weights(store, v) for v in versions if v.name in names]
    else:  # every version whose weights are still on disk (`train.keep_versions` prunes full weights)
        versions = [v for v in versions if v.path is None or not weights_pruned(Path(v.path))]
    m = config.model
    base = model_folder(m.path, config.cache_dir())
    context = served_context(m.path, m.max_context)
    policy = build_policy(
        base_dir=base,
        cfg=config.train,
        device=m.device,
        max_context=context,
        rope_scaling=m.rope_scaling,
        keep_base=True,
        scale_rope=m.scale_rope,
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    canary = Canary.build(store, tokenizer, config.guard, policy.cfg.micro_batch_tokens)
    for version in versions:
        policy.load(Path(version.path) if version.path else None)
        status, figures = canary.check(policy)
        yield {
            "version": version.name,
            "step": version.step,
            "recorded": version.status,
            "now": status,
        } | figures
