"""The report of `clawrl envs train` and `clawrl envs eval`: report.json, report.md, episodes.jsonl.

report.json:

    {"mode": "train" | "eval", "env": "calculator", "tasks": "calculator train split (400 rows)",
     "versions": [{"version": "v0", "episodes": 24, "dropped": 0, "success_rate": 0.375,
                   "mean_reward": 0.375, "mean_turns": 2.0, "mean_tool_calls": 2.0,
                   "mean_tokens": 41.5, "reasons": {"done": 22, "turn_limit": 2},
                   "groups": 6, "groups_used": 4, "groups_dropped": 2}, ...],
     "totals": {... the same figures over the run, "unanswered", "groups_open",
                "groups_unposted", "group_drop_reasons", "post_errors"},
     "settings": {...}, "command": "clawrl envs ...", "wall_s": 812.4,
     train only: "start": "v0", "versions_made": 4, "stopped": "done", "config" or "base_url"}

The figures are clawrl/envs/stats.py's. episodes.jsonl has one line per episode: its
session, group, task, first version, reward, how it ended, turns, tool calls, tokens.
Pure functions except `write_report`, which writes the files and the PNG (plot.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clawrl.envs.episode import EpisodeResult
from clawrl.envs.groups import GroupResult
from clawrl.envs.stats import by_version, totals

COLUMNS = (
    ("version", "version", "{}"),
    ("episodes", "episodes", "{}"),
    ("success", "success_rate", "{:.1%}"),
    ("mean reward", "mean_reward", "{:.3f}"),
    ("dropped", "dropped", "{}"),
    ("groups used / dropped", None, ""),
    ("turns", "mean_turns", "{:.2f}"),
    ("tool calls", "mean_tool_calls", "{:.2f}"),
    ("tokens", "mean_tokens", "{:.1f}"),
)


def build_report(
    mode: str,
    env: str,
    tasks: str,
    groups: list[GroupResult],
    settings: dict[str, Any],
    command: str,
    wall_s: float,
    **extra: Any,
) -> dict[str, Any]:
    """The report.json data of a run's groups (an eval's episodes are groups of one, not posted)."""
    episodes = [e for g in groups for e in g.episodes]
    return {
        "mode": mode,
        "env": env,
        "tasks": tasks,
        "versions": by_version(episodes, groups),
        "totals": totals(episodes, groups),
        "settings": settings,
        "command": command,
        "wall_s": round(wall_s, 1),
        **extra,
    }


def episode_lines(groups: list[GroupResult]) -> list[dict[str, Any]]:
    """One JSON object per episode, for episodes.jsonl."""
    return [episode_line(e, g.id) for g in groups for e in g.episodes]


def episode_line(e: EpisodeResult, group: str) -> dict[str, Any]:
    return {
        "session_id": e.session_id,
        "group_id": group,
        "task": e.task,
        "version": e.version,
        "reward": e.reward,
        "reason": e.reason,
        "turns": e.turns,
        "tool_calls": e.tool_calls,
        "tool_errors": e.tool_errors,
        "tokens": e.tokens,
        "seconds": round(e.seconds, 3),
    }


def markdown(report: dict[str, Any]) -> str:
    """report.md: what ran, and one row per version."""
    t = report["totals"]
    lines = [
        f"# clawrl envs {report['mode']}: `{report['env']}`",
        "",
        f"- tasks: {report['tasks']}",
        f"- command: `{report['command']}`",
        f"- episodes: {t['episodes']} answered ({t['dropped']} dropped), {t['unanswered']} never answered",
        f"- wall time: {report['wall_s']:.0f} s",
    ]
    if report["mode"] == "train":
        lines.append(
            f"- versions made: {report['versions_made']} after {report['start']} "
            f"(stopped: {report['stopped']}); "
            f"groups: {t['groups_used']} used, {t['groups_dropped']} dropped, {t['groups_open']} open"
        )
        if t["group_drop_reasons"]:
            shown = ", ".join(f"{reason} ({n})" for reason, n in t["group_drop_reasons"].items())
            lines.append(f"- why groups were dropped: {shown}")
    how = "greedy, one episode per task" if report["mode"] == "eval" else "sampled"
    lines += ["", f"Per policy version ({how}; an episode counts for the version of its first answer):", ""]
    lines += _table(report["versions"], with_groups=report["mode"] == "train")
    return "\n".join(lines) + "\n"


def _table(rows: list[dict[str, Any]], with_groups: bool) -> list[str]:
    columns = [c for c in COLUMNS if with_groups or c[1] is not None]
    lines = [
        "| " + " | ".join(c[0] for c in columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
    ]
    for row in rows:
        cells = []
        for _, key, fmt in columns:
            if key is None:
                cells.append(f"{row['groups_used']} / {row['groups_dropped']}")
            else:
                cells.append("-" if row[key] is None else fmt.format(row[key]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_report(report: dict[str, Any], groups: list[GroupResult], out: Path) -> list[Path]:
    """report.json, report.md, episodes.jsonl and report.png in `out`; the paths written."""
    from clawrl.envs.plot import plot_report

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    with open(out / "episodes.jsonl", "w", encoding="utf-8") as f:
        for line in episode_lines(groups):
            f.write(json.dumps(line) + "\n")
    return [
        out / "report.json",
        out / "report.md",
        out / "episodes.jsonl",
        plot_report(report, out / "report.png"),
    ]
