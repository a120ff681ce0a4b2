"""A call that passes more than four arguments names them (docs/design.md's habits, issue 58).

An `ast` walk over clawrl/: any call with more than four positional arguments fails, named by
file:line. Past four, a reader (and a reviewer) cannot tell which value lands in which parameter
without opening the callee; `TrainLoop(..., canary, on_hold, probe, ...)` once put a memory probe
into `after_publish` by position alone.

Exempt, by the called name, are calls whose positional arguments are a list rather than a row of
parameters:
- logging's `%`-style arguments (`log.info(fmt, a, b, c, d)`): format values, in format order;
- torch's positional-only autograd API (`Function.apply`, `ctx.save_for_backward`);
- variadic helpers whose `*args` are one list: `documented_errors(*statuses)`,
  `pick(options, *keys)` and `stable_hash(*keys)` (hash inputs).
A call that spreads `*args` counts only its written positional arguments.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOST = 4
LOGGING = {"debug", "info", "warning", "error", "exception", "critical", "log"}
EXEMPT = LOGGING | {"apply", "save_for_backward", "documented_errors", "pick", "stable_hash"}


def _name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def positional_calls(source: str, most: int = MOST) -> list[tuple[int, str]]:
    """(line, callee) of each call in `source` passing more than `most` positional arguments."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or _name(node) in EXEMPT:
            continue
        written = [a for a in node.args if not isinstance(a, ast.Starred)]
        if len(written) > most:
            found.append((node.lineno, ast.unparse(node.func)))
    return sorted(found)


def test_no_call_in_clawrl_passes_more_than_four_positional_arguments():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {callee}(...) passes more than {MOST} positional arguments"
        for path in sorted((ROOT / "clawrl").rglob("*.py"))
        for line, callee in positional_calls(path.read_text())
    ]
    assert not offenders, "name the arguments:\n" + "\n".join(offenders)


def test_the_rule_catches_a_long_positional_call_and_spares_the_exempt():
    source = (
        "TrainLoop(store, policy, run_dir, group, status, probe)\n"
        "TrainLoop(store, policy, run_dir, group, status=status, after_publish=probe)\n"
        "log.info('%s %s %s %s %s', a, b, c, d, e)\n"
        "f(*rows, a, b)\n"
    )
    assert positional_calls(source) == [(1, "TrainLoop")]
