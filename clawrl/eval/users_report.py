"""The report of several simulated users on one server (`clawrl eval --users`): pure functions.

report.json:

    {"users": {"brief": {<report.method_entry> , "persona": "brief", "line": "brief",
                         "persona_file": {"path": "...", "sha256": "...", "tasks": "math"},
                         "canary": [...], "collapse": [...]},
               "stepwise": {..., "line": "stepwise"}},
     "adapters": "per_user", "method": "combine", "judge": "...", "feedback": false, "signal": "...",
     "held_out": [...], "collapse_limits": {...}, "settings": {...}, "command": "...", "config": {...},
     "run_dir": "..."}

Each user's `scores[i]` is their persona's mean score of the first answers to the held-out tasks at
`versions[i]`, a version of their line: their own (`brief/v1`) with an adapter per user
(`adapters` "per_user"), the shared policy's (`v1`) with "shared". `line` names it (`default`: the
shared one). report.md has a step x user table of them and each user's gain ("nothing to learn"
for a user whose first point already met every check); the canary and collapse tables are per
line. `persona_file` names each user's persona file and its sha256.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clawrl.eval.panel import collapse_panel, collapse_rows, limits_json, limits_of
from clawrl.eval.report import VIA, canary_tables, change_text, score_table, signal
from clawrl.eval.scenario import Settings

ADAPTERS = {
    "per_user": "an adapter per user: each user's own line of versions (`brief/v1`, ...)",
    "shared": "one shared policy, trained on every user's samples (`v1`, ...)",
}


def build_users_report(
    users: dict[str, dict[str, Any]],
    method: str,
    adapters: str,
    settings: Settings,
    held_out: list[str],
    command: str,
    config: dict[str, Any],
    run_dir: str | None,
) -> dict[str, Any]:
    """The whole report.json; `users` maps a user's name to their `method_entry` with `persona`,
    `line` and (when the run's store could be read) `canary` rows; the collapse rows are added."""
    limits = limits_of(config)
    users = {name: entry | {"collapse": collapse_rows(entry, limits)} for name, entry in users.items()}
    judges = sorted({e["judge"] for e in users.values()})
    judge = ",".join(judges)
    return {
        "users": users,
        "adapters": adapters,
        "method": method,
        "judge": judge,
        "feedback": settings.feedback,
        "signal": signal(judge, settings.feedback),
        "held_out": held_out,
        "collapse_limits": limits_json(config),
        "settings": dataclasses.asdict(settings),
        "command": command,
        "config": config,
        "run_dir": run_dir,
    }


def per_line(report: dict[str, Any]) -> dict[str, Any]:
    """The report as report.py's tables read it: one entry per line of versions (users on one line,
    as with a shared policy, share its canary and collapse figures), named by their users; a shared
    line's held-out self-ROUGE-L is its first user's answers'."""
    lines: dict[str, list[str]] = {}
    for name, entry in report["users"].items():
        lines.setdefault(entry["line"], []).append(name)
    methods = {", ".join(names): report["users"][names[0]] for names in lines.values()}
    return {"methods": methods, "collapse_limits": report.get("collapse_limits")}


def users_markdown(report: dict[str, Any]) -> str:
    """report.md: what was run, a step x user table of held-out scores, each user's gain."""
    names = list(report["users"])
    lines = [
        f"# clawrl eval: users {', '.join(f'`{n}`' for n in names)} on one server",
        "",
        f"- versions: {ADAPTERS.get(report['adapters'], report['adapters'])} (`train.adapters`)",
        f"- method: `{report['method']}`; signal: {report['signal']}",
        f"- held-out tasks: {len(report['held_out'])} ({', '.join(report['held_out'])})",
        f"- the users talked {VIA[report['settings'].get('via', 'api')]}, each under their own key",
        f"- command: `{report['command']}`",
        *_persona_files(report),
        "",
        "Each user's persona's mean score of the first answer to each held-out task (greedy), on each",
        "of the versions that user is served, per training step of that user's line:",
        "",
        *score_table(report["users"]),
        "",
        *_user_table(report),
        *canary_tables(per_line(report)),
        *collapse_panel(per_line(report)),
    ]
    return "\n".join(lines) + "\n"


def _user_table(report: dict[str, Any]) -> list[str]:
    lines = [
        "| user | line | change | held | sessions to a stable effect | conversations | training answers "
        "| stopped |",
        "| --- " * 8 + "|",
    ]
    for name, e in report["users"].items():
        effect = e["sessions_to_effect"]
        lines.append(
            f"| {name} | {e['line']} | {change_text(e)} | "
            f"{', '.join(e['held']) or '-'} | {'-' if effect is None else effect} "
            f"(of {len(e['sessions_passed'])}) | {e['conversations']} | {e['answers']} | {e['stopped']} |"
        )
    return lines


def _persona_files(report: dict[str, Any]) -> list[str]:
    """A line per user naming their persona file and its sha256 (none in older reports)."""
    return [
        f"- `{name}`'s persona file: `{e['persona_file']['path']}` (sha256 `{e['persona_file']['sha256']}`)"
        for name, e in report["users"].items()
        if e.get("persona_file")
    ]
