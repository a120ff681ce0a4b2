"""The collapse panel of an eval report: per version, signs that the answers are collapsing (pure).

Two sources, side by side (docs/evaluation.md, "The collapse panel"):

- the canary's figures, which the gate measured on every version it checked
  (`clawrl/guard/collapse.py`, kept in the version's canary figures): the
  entropy along its greedy answers to the general set's canary prompts against
  v0's, self-ROUGE-L between those answers, the logprob drift of v0's answers;
- the eval's own held-out answers (the greedy first answer to each held-out
  task): their self-ROUGE-L at each measured version, against v0's.

A version is marked with every limit it crosses: the canary's `crossed`, and
`held_out_self_rouge_l` when its held-out answers are more alike than the
limit and than the start's. The limits are the run config's `guard` ones
(defaults for a report of a running server, whose config is its own).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clawrl.guard.collapse import Limits, judge
from clawrl.version_folder import version_number

FIGURES = ("entropy", "base_entropy", "entropy_ratio", "self_rouge_l", "base_self_rouge_l", "drift")


def limits_of(config: dict[str, Any]) -> Limits:
    """The collapse limits of a report's config (its `guard` section), defaults where absent."""
    guard = config.get("guard") or {}
    default = Limits()
    return Limits(
        min_entropy_ratio=guard.get("collapse_min_entropy_ratio", default.min_entropy_ratio),
        max_self_rouge_l=guard.get("collapse_max_self_rouge_l", default.max_self_rouge_l),
        max_drift=guard.get("collapse_max_drift", default.max_drift),
        max_entropy_ratio=guard.get("collapse_max_entropy_ratio", default.max_entropy_ratio),
    )


def limits_json(config: dict[str, Any]) -> dict[str, Any]:
    """report.json's `collapse_limits`: the limits, and whether the gate held on them."""
    hold = bool((config.get("guard") or {}).get("hold_on_collapse", False))
    return dataclasses.asdict(limits_of(config)) | {"hold_on_collapse": hold}


def collapse_rows(entry: dict[str, Any], limits: Limits) -> list[dict[str, Any]]:
    """One row per version of a method's report entry (measured or checked), oldest first."""
    canary = {r["version"]: r for r in entry.get("canary") or [] if r.get("collapse")}
    held_out = dict(zip(entry["versions"], entry.get("self_rouge_l") or [], strict=False))
    start = entry["versions"][0] if entry["versions"] else None
    rows = []
    for version in sorted(set(canary) | set(entry["versions"]), key=version_number):
        figures = _figures(version, canary)
        rouge = held_out.get(version)
        crossed = list(figures.get("crossed") or [])
        if judge(
            entropy=None,
            base_entropy=None,
            rouge=rouge,
            base_rouge=held_out.get(start),
            drifted=None,
            limits=limits,
        ).crossed:
            crossed.append("held_out_self_rouge_l")
        status = canary[version]["status"] if version in canary else "served"
        rows.append(
            {"version": version, "status": status}
            | {k: figures.get(k) for k in FIGURES}
            | {
                "held_out_self_rouge_l": rouge,
                "crossed": crossed,
            }
        )
    return rows


def _figures(version: str, canary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The canary's collapse figures of `version`; v0's are the base's, which every check keeps."""
    if version in canary:
        return canary[version]["collapse"]
    if version != "v0" or not canary:
        return {}
    base = next(iter(canary.values()))["collapse"]
    entropy, rouge = base.get("base_entropy"), base.get("base_self_rouge_l")
    return {
        "entropy": entropy,
        "base_entropy": entropy,
        "entropy_ratio": None if entropy is None else 1.0,
        "self_rouge_l": rouge,
        "base_self_rouge_l": rouge,
        "drift": 0.0,
    }


def collapse_panel(report: dict[str, Any]) -> list[str]:
    """report.md's collapse panel: a table per method, each crossed limit marked."""
    limits = report.get("collapse_limits")
    if not limits:  # a report written before the panel
        return []
    hold = "holds" if limits.get("hold_on_collapse") else "marks, does not hold,"
    lines = [
        "",
        f"Collapse panel (limits: answer entropy at least {limits['min_entropy_ratio']:g} of v0's "
        f"and at most {limits.get('max_entropy_ratio', Limits().max_entropy_ratio):g}×, "
        f"self-ROUGE-L at most {limits['max_self_rouge_l']:g}, logprob drift at most "
        f"{limits['max_drift']:g} nats/token; the canary gate {hold} a version past one). Entropy, "
        "canary self-ROUGE-L and drift: the canary's, on its fixed prompts; held-out: between the "
        "answers to different held-out tasks.",
    ]
    for method, entry in report["methods"].items():
        lines += ["", f"`{method}`:", ""]
        rows = entry.get("collapse") or []
        if not any(r["entropy"] is not None for r in rows):
            lines += ["(no canary figures: the canary gate was off, or this was a running server's run)", ""]
        lines += [
            "| version | status | answer entropy (× v0) | self-ROUGE-L | held-out self-ROUGE-L | drift "
            "| collapse |",
            "| --- " * 7 + "|",
        ]
        lines += [_row(r) for r in rows]
    return lines


def _row(r: dict[str, Any]) -> str:
    ratio = "" if r["entropy_ratio"] is None else f" ({r['entropy_ratio']:.2f}×)"
    mark = "**" + ", ".join(r["crossed"]) + "**" if r["crossed"] else "-"
    return (
        f"| {r['version']} | {r['status']} | {_num(r['entropy'])}{ratio} | {_num(r['self_rouge_l'])} | "
        f"{_num(r['held_out_self_rouge_l'])} | {_num(r['drift'])} | {mark} |"
    )


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
