"""The figures of a run's episodes and groups, per policy version (pure functions).

An episode counts for the version that made its first answer (`system_fingerprint`);
a group for the version of its earliest answer. Per version:

    episodes       episodes that got at least one answer
    dropped        of those, dropped (reward null: a reward that was not a number, a tool
                   schedule the task does not offer, a request the server refused, ...)
    success_rate   share of the scored (not dropped) episodes whose reward is >= 1
                   (the shipped environments give 1 for a right answer, 0 otherwise)
    mean_reward    over the scored episodes
    mean_turns, mean_tool_calls, mean_tokens   episode length, over all of them
    reasons        how they ended: answered, done, turn_limit, token_limit, or the drop reason
    groups, groups_used, groups_dropped        the server's verdict on the version's groups

Episodes that never got an answer (the row did not fit `reset`, the environment could not
be built) belong to no version: `totals` counts them as `unanswered`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from clawrl.envs.episode import EpisodeResult
from clawrl.envs.groups import GroupResult
from clawrl.version_folder import version_rank

SUCCESS = 1.0  # a reward at least this counts as a success


@dataclass
class Figures:
    version: str
    episodes: int = 0
    dropped: int = 0
    success_rate: float | None = None
    mean_reward: float | None = None
    mean_turns: float | None = None
    mean_tool_calls: float | None = None
    mean_tokens: float | None = None
    reasons: dict[str, int] = field(default_factory=dict)
    groups: int = 0
    groups_used: int = 0
    groups_dropped: int = 0


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def figures(version: str, episodes: list[EpisodeResult], groups: Iterable[GroupResult] = ()) -> Figures:
    """The figures of `episodes` (all of one version) and of that version's `groups`."""
    scored = [e.reward for e in episodes if e.reward is not None]
    out = Figures(version, episodes=len(episodes), dropped=len(episodes) - len(scored))
    if scored:
        out.success_rate = round(sum(r >= SUCCESS for r in scored) / len(scored), 4)
        out.mean_reward = _mean(scored)
    out.mean_turns = _mean([e.turns for e in episodes])
    out.mean_tool_calls = _mean([e.tool_calls for e in episodes])
    out.mean_tokens = _mean([e.tokens for e in episodes])
    out.reasons = dict(Counter(short_reason(e) for e in episodes).most_common())
    statuses = Counter(g.status for g in groups)
    out.groups = sum(statuses.values())
    out.groups_used, out.groups_dropped = statuses["used"], statuses["dropped"]
    return out


def short_reason(episode: EpisodeResult) -> str:
    """How an episode ended, or "dropped: <first clause of the reason>" (a key to count by)."""
    if not episode.dropped:
        return episode.reason
    return "dropped: " + episode.reason.split(":")[0]


def by_version(episodes: list[EpisodeResult], groups: Iterable[GroupResult] = ()) -> list[dict[str, Any]]:
    """One `Figures` (as a dict) per version that answered, in version order."""
    groups = list(groups)
    versions = sorted({e.version for e in episodes if e.version is not None}, key=version_rank)
    rows = []
    for version in versions:
        mine = [e for e in episodes if e.version == version]
        rows.append(asdict(figures(version, mine, [g for g in groups if g.version == version])))
    return rows


def totals(episodes: list[EpisodeResult], groups: Iterable[GroupResult] = ()) -> dict[str, Any]:
    """The whole run's figures, plus unanswered episodes, unposted ones, and why groups were dropped."""
    groups = list(groups)
    answered = [e for e in episodes if e.version is not None]
    out = asdict(figures("all", answered, groups))
    out["unanswered"] = len(episodes) - len(answered)
    out["unanswered_reasons"] = dict(Counter(e.reason for e in episodes if e.version is None).most_common(5))
    out["groups_open"] = sum(g.status == "open" for g in groups)
    out["groups_unposted"] = sum(g.status is None for g in groups)
    out["group_drop_reasons"] = dict(Counter(g.reason for g in groups if g.status == "dropped").most_common())
    out["post_errors"] = [error for g in groups for error in g.post_errors][:20]
    return out
