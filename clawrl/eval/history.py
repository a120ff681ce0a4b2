"""A run folder's training history, read-only: versions, judgments, samples; and its summary.

`read_history` opens `<run>/clawrl.db` read-only through the store's public API (safe
while the server runs). Each main turn counts with its latest judgment, the one that
decides its samples. The rest is pure: `hint_rates` gives the share of judgments with an
accepted hint in each interval between two published versions, and `summary` the text
`clawrl report` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawrl.store.training import STATUSES


@dataclass(frozen=True)
class VersionPoint:
    """One published version and the metrics of the step that made it (None for v0)."""

    name: str
    step: int
    created_at: float
    mean_reward: float | None = None
    loss: float | None = None
    samples: int | None = None


@dataclass(frozen=True)
class JudgmentPoint:
    created_at: float
    score: int | None
    has_hint: bool


@dataclass(frozen=True)
class HintRate:
    """Hint acceptance among the judgments made while `version` was the newest version."""

    version: str
    minutes: float  # the interval's end, in minutes since the first judgment
    rate: float
    judgments: int


@dataclass
class RunHistory:
    versions: list[VersionPoint]
    judgments: list[JudgmentPoint]
    samples: dict[str, int] = field(default_factory=dict)  # status -> count
    method: str | None = None


def read_history(run_dir: Path) -> RunHistory:
    """The history of the run in `run_dir`; StoreError when there is no clawrl database."""
    from clawrl.store.db import Store

    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        versions = [_version_point(v) for v in store.versions()]
        judgments = []
        for turn in store.turns():
            j = store.latest_judgment(turn.id) if turn.turn_type == "main" else None
            if j is not None:
                judgments.append(JudgmentPoint(j.created_at, j.score, j.hint is not None))
        samples = {status: store.count_samples(status=status) for status in sorted(STATUSES)}
    judgments.sort(key=lambda j: j.created_at)
    return RunHistory(versions, judgments, samples, _method(run_dir))


def _version_point(v: Any) -> VersionPoint:
    m = v.metrics
    return VersionPoint(
        name=v.name,
        step=v.step,
        created_at=v.created_at,
        mean_reward=m.get("mean_reward"),
        loss=m.get("loss"),
        samples=m.get("samples"),
    )


def _method(run_dir: Path) -> str | None:
    import json

    path = run_dir / "config.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("method")
    except ValueError:
        return None


def hint_rates(history: RunHistory) -> list[HintRate]:
    """Hint acceptance per interval between published versions (empty intervals left out)."""
    if not history.judgments:
        return []
    first = history.judgments[0].created_at
    ordered = sorted(history.versions, key=lambda v: v.created_at)
    ends = [(v.created_at, prev.name) for prev, v in zip(ordered, ordered[1:], strict=False)]
    ends.append((float("inf"), ordered[-1].name if ordered else "v0"))
    rates, i = [], 0
    for end, version in ends:
        chunk = []
        while i < len(history.judgments) and history.judgments[i].created_at < end:
            chunk.append(history.judgments[i])
            i += 1
        if chunk:
            rate = sum(j.has_hint for j in chunk) / len(chunk)
            until = min(end, chunk[-1].created_at) if end == float("inf") else end
            rates.append(HintRate(version, (until - first) / 60.0, rate, len(chunk)))
    return rates


def summary(history: RunHistory, eval_entry: dict[str, Any] | None) -> str:
    """A few lines for the terminal: versions with their rewards, judgments, samples, eval scores."""
    trained = [v for v in history.versions if v.step > 0]
    lines = [
        f"method {history.method or '?'}: {len(trained)} training steps, {len(history.versions)} versions"
    ]
    for v in trained:
        reward = "-" if v.mean_reward is None else f"{v.mean_reward:+.2f}"
        loss = "-" if v.loss is None else f"{v.loss:.4f}"
        lines.append(f"  {v.name:<5} step {v.step:<3} samples {v.samples}  mean reward {reward}  loss {loss}")
    judged = history.judgments
    if judged:
        hinted = sum(j.has_hint for j in judged)
        lines.append(
            f"judgments: {len(judged)}, with an accepted hint: {hinted} ({hinted / len(judged):.0%})"
        )
    else:
        lines.append("judgments: none")
    counts = ", ".join(f"{status} {n}" for status, n in history.samples.items() if n)
    lines.append(f"samples: {counts or 'none'}")
    if eval_entry:
        shown = ", ".join(
            f"{v} {s:.3f}" for v, s in zip(eval_entry["versions"], eval_entry["scores"], strict=True)
        )
        lines.append(f"eval scores: {shown}")
    return "\n".join(lines)
