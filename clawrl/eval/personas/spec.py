"""Reading a persona file: TOML into typed, validated values, or a `PersonaFileError` naming the spot.

The format (docs/evaluation.md, "Persona files"):

    name = "numbered"                    # a user's name: a-z, 0-9, _ and -, at most 32
    description = "..."                  # the preference in words (what an LLM persona plays)
    openings = ["{question}", ...]       # first messages; one picked per task
    thanks = ["..."]                     # said when every check is met (optional)
    give_up = "..."                      # added to the last complaint (optional)
    tasks = "math"                       # a shipped task set, or a JSONL path relative to the file

    [[checks]]                           # one or more
    kind = "min_lines_matching"          # clawrl.eval.personas.checks.KINDS
    pattern = '^\\s*\\d+[.)]\\s+\\S'     # the kind's parameters: words, text, pattern, count
    count = 3
    partial = true                       # optional: graded credit where the kind defines it
    complaints = ["..."]                 # one or more each
    hints = ["..."]

Texts are `str.format` templates: openings may use {question}, {answer} and {student} (a scripted
student's answer), complaints and hints those and {words} (the reply's word count) and {found} (what
a matches / not_matches pattern found); write a literal brace as {{ or }}. Every error names the
file, and the line where it can be found (TOML's own errors carry one; a check's error is placed at
its `[[checks]]` header) or the check by its index and kind. Unknown keys are errors.
"""

from __future__ import annotations

import re
import string
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawrl.eval.personas.checks import KINDS, PARAMS, Rule

OPENING_FIELDS = frozenset({"question", "answer", "student"})
CHECK_FIELDS = OPENING_FIELDS | {"words", "found"}
ANSWER_FIELDS = frozenset({"answer", "student"})  # texts that need each task's answer


class PersonaFileError(ValueError):
    """A persona file that cannot be used; the message names the file and the spot."""


class CheckSpec(BaseModel):
    """One `[[checks]]` table as written."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    kind: str = Field(description="the check kind (clawrl.eval.personas.checks.KINDS)")
    complaints: list[str] = Field(min_length=1, description="what the user says when it is missed")
    hints: list[str] = Field(min_length=1, description="the same as a short instruction")
    partial: bool = Field(False, description="graded credit where the kind defines it")
    words: int | None = Field(None, ge=1, description="max_words / min_words: the limit")
    text: str | None = Field(None, min_length=1, description="starts_with / ends_with / contains")
    pattern: str | None = Field(None, description="a Python regex, searched with no flags")
    count: int | None = Field(None, ge=1, description="*_matching: how many lines or sentences")


class PersonaSpec(BaseModel):
    """A persona file as written."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str = Field(pattern=r"^[a-z0-9_-]{1,32}$", description="the persona's (and user's) name")
    description: str = Field(min_length=1, description="the preference, in words")
    openings: list[str] = Field(min_length=1, description="first-message templates")
    thanks: list[str] = Field(
        ["Thanks, that's perfect.", "Great, that's exactly what I needed."],
        min_length=1,
        description="what the user says when every check is met",
    )
    give_up: str = Field("Never mind, I'll sort it out myself.", description="the last complaint's end")
    tasks: str = Field("math", min_length=1, description="a shipped task set, or a JSONL path")
    checks: list[CheckSpec] = Field(min_length=1, description="the preference, one check a table")


def parse(path: Path, text: str) -> tuple[PersonaSpec, list[Rule]]:
    """The persona in `text` (read from `path`) and its checks as `Rule`s; PersonaFileError otherwise."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message ends "(at line N, column M)"
        raise PersonaFileError(f"persona file {path}: not valid TOML: {exc}") from None
    lines = text.splitlines()
    try:
        spec = PersonaSpec.model_validate(data)
    except ValidationError as exc:
        raise PersonaFileError(_pydantic_message(path, lines, data, exc)) from None
    for n, opening in enumerate(spec.openings):
        _check_fields(opening, OPENING_FIELDS, f"persona file {path}: openings[{n}]")
    return spec, [_rule(path, lines, i, check) for i, check in enumerate(spec.checks)]


def _rule(path: Path, lines: list[str], index: int, check: CheckSpec) -> Rule:
    header = check_line(lines, index)
    where = f"persona file {path}{_line(header)}: checks[{index}] (kind {check.kind!r})"
    kind = KINDS.get(check.kind)
    if kind is None:
        raise PersonaFileError(f"{where}: unknown check kind; known kinds: {', '.join(KINDS)}")
    given = {p for p in PARAMS if getattr(check, p) is not None}
    missing = [p for p in kind.params if p not in given]
    if missing:
        raise PersonaFileError(f"{where}: missing its parameter {', '.join(missing)}")
    extra = sorted(given - set(kind.params))
    if extra:
        takes = ", ".join(kind.params) or "none"
        raise PersonaFileError(f"{where}: {', '.join(extra)} is not its parameter (it takes: {takes})")
    for field in ("complaints", "hints"):
        for n, template in enumerate(getattr(check, field)):
            _check_fields(template, CHECK_FIELDS, f"{where}: {field}[{n}]")
    try:
        pattern = re.compile(check.pattern) if check.pattern is not None else None
    except re.error as exc:
        line = key_line(lines, "pattern", header - 1) if header else None
        at = f"persona file {path}{_line(line or header)}: checks[{index}] (kind {check.kind!r})"
        raise PersonaFileError(f"{at}: pattern {check.pattern!r} does not compile: {exc}") from None
    return Rule(
        kind=check.kind,
        complaints=tuple(check.complaints),
        hints=tuple(check.hints),
        partial=check.partial,
        words=check.words,
        text=check.text,
        pattern=pattern,
        count=check.count,
    )


def fields_of(template: str) -> set[str]:
    """The `{field}`s a format template uses; ValueError for a malformed one."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def _check_fields(template: str, allowed: frozenset[str], where: str) -> None:
    try:
        used = fields_of(template)
    except ValueError as exc:
        braces = "write a literal brace as {{ or }}"
        raise PersonaFileError(f"{where}: {exc} in {template!r} ({braces})") from None
    unknown = sorted(used - allowed)
    if unknown:
        raise PersonaFileError(
            f"{where}: unknown field {{{unknown[0]}}} in {template!r}; known: {', '.join(sorted(allowed))}"
        )


def needs_answers(spec: PersonaSpec, rules: list[Rule]) -> str | None:
    """What in the persona needs each task's answer ("checks[2] (kind 'right_number')"); None: nothing."""
    for i, rule in enumerate(rules):
        texts = (*rule.complaints, *rule.hints)
        if KINDS[rule.kind].needs_answers or any(fields_of(t) & ANSWER_FIELDS for t in texts):
            return f"checks[{i}] (kind {rule.kind!r})"
    for n, opening in enumerate(spec.openings):
        if fields_of(opening) & ANSWER_FIELDS:
            return f"openings[{n}]"
    return None


def check_line(lines: list[str], index: int) -> int | None:
    """The line (1-based) of the `index`-th `[[checks]]` header; None when written inline."""
    headers = [n for n, line in enumerate(lines, start=1) if re.match(r"\s*\[\[\s*checks\s*\]\]", line)]
    return headers[index] if index < len(headers) else None


def key_line(lines: list[str], key: str, start: int = 0) -> int | None:
    """The line (1-based) of `key = ...` from line `start` on, before the next table header."""
    for n, line in enumerate(lines[start:], start=start + 1):
        if n > start + 1 and line.lstrip().startswith("["):
            return None
        if re.match(rf"\s*{re.escape(key)}\s*=", line):
            return n
    return None


def _line(n: int | None) -> str:
    return "" if n is None else f", line {n}"


def _pydantic_message(path: Path, lines: list[str], data: dict[str, Any], exc: ValidationError) -> str:
    """The first validation error (an unknown key before the rest), placed: `checks[1] (kind
    'matches'): count: ...` with its line."""
    error = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = list(error["loc"])
    what = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
    if loc[:1] == ["checks"] and len(loc) >= 2 and isinstance(loc[1], int):
        index = loc[1]
        header = check_line(lines, index)
        field = ".".join(map(str, loc[2:]))
        line = key_line(lines, str(loc[2]), header - 1) if header and len(loc) > 2 else header
        kind = data["checks"][index].get("kind") if isinstance(data["checks"][index], dict) else None
        said = f"{field}: {what}" if field else what
        return f"persona file {path}{_line(line or header)}: checks[{index}] (kind {kind!r}): {said}"
    field = ".".join(map(str, loc))
    line = key_line(lines, str(loc[0])) if loc else None
    if loc == ["checks"] and error["type"] in ("too_short", "missing"):
        what = "no checks: a persona needs at least one [[checks]] table"
    return f"persona file {path}{_line(line)}: {field}: {what}"
