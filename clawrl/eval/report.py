"""The evaluation report: `report.json` data and its `report.md` table (pure functions).

report.json:

    {"persona": "brief",
     "persona_file": {"path": ".../clawrl/eval/personas/brief.toml", "sha256": "94fc...", "tasks": "math"},
     "judge": "feedback", "feedback": true,
     "signal": "explicit ratings and comments (POST /v1/feedback); judge backend 'feedback'",
     "methods": {"rl": {"scores": [v0, after step 1, ...], "versions": ["v0", "v1", ...],
                        "steps": [0, 1, ...], "elapsed_s": [...], "task_scores": [[...], ...],
                        "wall_s": 812.4, "conversations": 40, "answers": 96, "stopped": "done",
                        "judge": "feedback", "run_dir": "...",
                        "sessions_passed": [false, true, ...], "session_versions": ["v0", ...],
                        "sessions_to_effect": 14, "base_passed": [3, 5],
                        "sessions": [0, 12, ...], "scores_memory": [null, ...],
                        "experiences": [{"active": 2, "distilled": 0, "retired": 0}, ...]}},
     "held_out": ["m03", ...], "settings": {...}, "command": "clawrl eval ...", "config": {...}}

`scores[i]` is the mean persona score of the first answers to the held-out tasks at
`versions[i]`, which is `steps[i]` versions past the start. `sessions_passed[n]` is whether
training session n+1's first answer passed the persona's checks (rated +1), and
`sessions_to_effect` the first of `STABLE_SESSIONS` consecutive sessions that did, each answered
by a version past the start (`session_versions`; the base passes by chance; with memory on every
session counts), None: never: the reference's "sessions until a stable effect" (OpenClaw-RL issue
#113). `base_passed` is [passed, of] for the sessions the start version answered. `sessions[i]` is
how many training sessions had been opened at point i. On a server with memory on,
`scores[i]` is the bare policy's (the memory block refused) and `scores_memory[i]` the same
tasks answered with it (null with memory off); a server with no trainer and memory on
(memory only) has a point every `settings.points_every` sessions, all at v0.

`persona_file` names the file the persona was read from and its sha256, so a figure can be
reproduced with the same preference. A method whose first point already meets every check on every
held-out task (`nothing_to_learn`) has no gain to show: report.md says "nothing to learn" instead.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from clawrl.eval.panel import collapse_panel, collapse_rows, limits_json, limits_of
from clawrl.eval.scenario import Outcome, Settings


def mean(values: list[float]) -> float:
    """The arithmetic mean; ValueError for no values."""
    if not values:
        raise ValueError("the mean of no values")
    return sum(values) / len(values)


def method_entry(outcome: Outcome, run_dir: str | None) -> dict[str, Any]:
    """One method's part of report.json."""
    points = outcome.points
    start = points[0].version if points else ""
    learned = learnt(outcome.session_versions, start, memory=any(p.score_memory is not None for p in points))
    return {
        "scores": [round(p.score, 4) for p in points],
        "versions": [p.version for p in points],
        "steps": [p.step for p in points],
        "elapsed_s": [round(p.elapsed_s, 1) for p in points],
        "task_scores": [[round(s, 4) for s in p.scores] for p in points],
        "answer_versions": [p.answer_versions for p in points],
        "self_rouge_l": [None if p.self_rouge_l is None else round(p.self_rouge_l, 4) for p in points],
        "sessions": [p.sessions for p in points],
        "scores_memory": [None if p.score_memory is None else round(p.score_memory, 4) for p in points],
        "experiences": [p.experiences for p in points],
        "wall_s": round(outcome.wall_s, 1),
        "conversations": outcome.conversations,
        "answers": outcome.answers,
        "stopped": outcome.stopped,
        "held": outcome.held,
        "judge": outcome.judge,
        "sessions_passed": outcome.sessions,
        "session_versions": outcome.session_versions,
        "sessions_to_effect": sessions_to_effect(outcome.sessions, learned),
        "base_passed": base_passed(outcome.sessions, outcome.session_versions, start),
        "unanswered": outcome.unanswered,
        "nothing_to_learn": bool(points) and nothing_to_learn(points[0].scores),
        "run_dir": run_dir,
    }


def nothing_to_learn(task_scores: list[float]) -> bool:
    """Whether the first answers already meet every check on every held-out task (all score 1):
    a persona such a model has nothing to learn from, whose later scores are no gain."""
    return bool(task_scores) and min(task_scores) >= 1.0


VIA = {"api": "through the bare API", "openclaw": "through the OpenClaw agent (`--via openclaw`)"}
STABLE_SESSIONS = 3  # consecutive sessions whose first answer passes: a stable effect


def sessions_to_effect(
    passed: list[bool], learned: list[bool] | None = None, stable: int = STABLE_SESSIONS
) -> int | None:
    """Sessions until a stable effect (docs/evaluation.md): the 1-based number of the first of
    `stable` consecutive training sessions whose first answer passed the persona's checks and came
    from a policy that had learnt something (`learned[n]`; None: every session may show it); None if
    no such run. Sessions count in the order they were opened."""
    run = 0
    for number, ok in enumerate(passed, start=1):
        shows = ok and (learned is None or learned[number - 1])
        run = run + 1 if shows else 0
        if run == stable:
            return number - stable + 1
    return None


def learnt(versions: list[str], start: str, memory: bool) -> list[bool] | None:
    """Which sessions' first answers came from a policy that had learnt something: a version past
    `start` (the base answers by chance, however often it passes). With memory on, the block can act
    from the next session on, so every session may show the effect (None); so too for sessions
    recorded without their versions (reports written before they were)."""
    if memory or not versions:
        return None
    return [v != start for v in versions]


def base_passed(passed: list[bool], versions: list[str], start: str) -> list[int]:
    """[passed, of]: how many sessions the start version answered, and how many of those passed:
    the chance level a stable effect is read against."""
    if not versions:  # not recorded (an outcome built without them): nothing to say
        return [0, 0]
    base = [ok for ok, v in zip(passed, versions, strict=True) if v == start]
    return [sum(base), len(base)]


def signal(judge: str, feedback: bool) -> str:
    """Which signal taught the model, in words."""
    parts = ["explicit ratings and comments (POST /v1/feedback)"] if feedback else []
    if judge != "feedback":
        parts.append(f"the {judge} judge reading the users' next messages")
    taught = " and ".join(parts) if parts else "nothing (judge backend 'feedback' but no feedback sent)"
    return f"{taught}; judge backend {judge!r}"


def build_report(
    persona: str,
    methods: dict[str, dict[str, Any]],
    settings: Settings,
    held_out: list[str],
    command: str,
    config: dict[str, Any],
    persona_file: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The whole report.json; `methods` maps a method name to its `method_entry` (with its
    `canary` rows, when its run had a store to read), to which its collapse panel is added;
    `persona_file` is where the persona came from (`FilePersona.source.as_json()`)."""
    limits = limits_of(config)
    methods = {name: entry | {"collapse": collapse_rows(entry, limits)} for name, entry in methods.items()}
    judges = sorted({entry["judge"] for entry in methods.values()})
    judge = judges[0] if len(judges) == 1 else ",".join(judges)
    return {
        "persona": persona,
        "persona_file": persona_file,
        "judge": judge,
        "feedback": settings.feedback,
        "signal": signal(judge, settings.feedback),
        "methods": methods,
        "held_out": held_out,
        "collapse_limits": limits_json(config),
        "settings": dataclasses.asdict(settings),
        "command": command,
        "config": config,
    }


def score_rows(report: dict[str, Any]) -> list[tuple[int, dict[str, tuple[float, str]]]]:
    """(step, {method: (score, version)}) for every step any method measured, in step order."""
    rows: dict[int, dict[str, tuple[float, str]]] = {}
    for method, entry in report["methods"].items():
        for step, score, version in zip(entry["steps"], entry["scores"], entry["versions"], strict=True):
            rows.setdefault(step, {})[method] = (score, version)
    return sorted(rows.items())


def change(entry: dict[str, Any]) -> float | None:
    """Last score minus the first (None with fewer than two measurements)."""
    scores = entry["scores"]
    return scores[-1] - scores[0] if len(scores) >= 2 else None


NOTHING_TO_LEARN = "nothing to learn (v0 meets every check)"


def change_text(entry: dict[str, Any]) -> str:
    """report.md's change cell: "+0.250", "-" (one point), or nothing to learn when the first point
    already met every check on every held-out task (read from `task_scores` in older reports)."""
    first = (entry.get("task_scores") or [[]])[0]
    if entry.get("nothing_to_learn") or nothing_to_learn(first):
        return NOTHING_TO_LEARN
    delta = change(entry)
    return "-" if delta is None else f"{delta:+.3f}"


def persona_line(report: dict[str, Any]) -> list[str]:
    """report.md's line naming the persona file and its sha256 (none in reports written before it)."""
    source = report.get("persona_file")
    if not source:
        return []
    return [f"- persona file: `{source['path']}` (sha256 `{source['sha256']}`, tasks `{source['tasks']}`)"]


def markdown(report: dict[str, Any]) -> str:
    """report.md: what was run, which signal taught, and a step x method table of scores."""
    lines = [
        f"# clawrl eval: persona `{report['persona']}`",
        "",
        *persona_line(report),
        f"- held-out tasks: {len(report['held_out'])} ({', '.join(report['held_out'])})",
        f"- signal: {report['signal']}",
        f"- the users talked {VIA[report.get('settings', {}).get('via', 'api')]}",
        f"- command: `{report['command']}`",
        "",
        "Mean persona score of the first answer to each held-out task (greedy), per training step:",
        "",
        *score_table(report["methods"]),
        "",
        *_method_table(report),
        *memory_table(report),
        *canary_tables(report),
        *collapse_panel(report),
    ]
    return "\n".join(lines) + "\n"


def memory_table(report: dict[str, Any]) -> list[str]:
    """report.md's memory table: per point, the bare policy's score and the score with the memory
    block, and the experiences by state; nothing for a run whose server had memory off."""
    lines: list[str] = []
    for method, entry in report["methods"].items():
        with_memory = entry.get("scores_memory") or []
        if not any(s is not None for s in with_memory):
            continue
        lines += ["", f"With memory, `{method}` (the held-out tasks answered twice at each point):", ""]
        lines += ["| step | version | sessions | bare policy | with memory | experiences |"]
        lines += ["| --- " * 6 + "|"]
        columns = ("steps", "versions", "sessions", "scores", "scores_memory", "experiences")
        for step, version, sessions, bare, memory, seen in zip(*(entry[c] for c in columns), strict=True):
            shown = "-" if memory is None else f"{memory:.3f}"
            states = ", ".join(f"{n} {state}" for state, n in (seen or {}).items() if n) or "none"
            lines.append(f"| {step} | {version} | {sessions} | {bare:.3f} | {shown} | {states} |")
    return lines


def canary_rows(versions: list[Any]) -> list[dict[str, Any]]:
    """What the canary gate measured on each version of a run (store `Version`s), for report.json."""
    keys = ("score", "base_score", "drop", "accuracy", "base_accuracy", "kl", "seconds", "reason", "collapse")
    return [
        {"version": v.name, "status": v.status} | {k: (v.canary or {}).get(k) for k in keys}
        for v in versions
        if v.canary
    ]


def canary_tables(report: dict[str, Any]) -> list[str]:
    """report.md's canary tables, one per entry of `report["methods"]` that has canary rows."""
    lines: list[str] = []
    for method, entry in report["methods"].items():
        rows = entry.get("canary") or []
        if not rows:
            continue
        lines += [
            "",
            f"Canary gate, `{method}` (base: score {rows[0]['base_score']:.4f}, "
            f"right answers {rows[0]['base_accuracy']:.1%}):",
            "",
        ]
        lines += [
            "| version | status | canary score | vs base | right answers | KL(base, version) | check |",
            "| --- " * 7 + "|",
        ]
        for r in rows:
            kl = "-" if r["kl"] is None else f"{r['kl']:.4f}"
            lines.append(
                f"| {r['version']} | {r['status']} | {r['score']:.4f} | {-r['drop']:+.1%} | "
                f"{r['accuracy']:.1%} | {kl} | {r['seconds']:.1f} s |"
            )
    return lines


def score_table(curves: dict[str, Any]) -> list[str]:
    """A step x curve table of scores (and the version measured), one column per method or user."""
    names = list(curves)
    lines = ["| step | " + " | ".join(names) + " |", "| --- | " + " | ".join("---" for _ in names) + " |"]
    for step, cells in score_rows({"methods": curves}):
        shown = [f"{cells[n][0]:.3f} ({cells[n][1]})" if n in cells else "-" for n in names]
        lines.append(f"| {step} | " + " | ".join(shown) + " |")
    return lines


def _method_table(report: dict[str, Any]) -> list[str]:
    lines = [
        "| method | change | sessions to a stable effect | wall time | conversations | training answers "
        "| stopped |",
        "| --- " * 7 + "|",
    ]
    for method, entry in report["methods"].items():
        shown = change_text(entry)
        effect = entry.get("sessions_to_effect")  # absent from reports written before it was
        passed = entry.get("sessions_passed") or []
        reached = "-" if effect is None else str(effect)
        base = entry.get("base_passed")
        chance = f"; the base passed {base[0]} of {base[1]}" if base and base[1] else ""
        lines.append(
            f"| {method} | {shown} | {reached} (of {len(passed)}{chance}) | {entry['wall_s']:.0f} s | "
            f"{entry['conversations']} | {entry['answers']} | {entry['stopped']} |"
        )
    return lines


def eval_entry_for(path: Path, method: str | None, required: bool = False) -> dict[str, Any] | None:
    """The eval scores of `method` in the report.json at `path`.

    The only method of a one-method report is taken whatever `method` is. None when the
    file is missing (ValueError then if `required`) or has no entry for `method`.
    """
    if not path.is_file():
        if required:
            raise ValueError(f"no eval report at {path}")
        return None
    try:
        methods = json.loads(path.read_text())["methods"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a clawrl eval report.json: {exc}") from exc
    if len(methods) == 1:
        return next(iter(methods.values()))
    return methods.get(method) if method else None
