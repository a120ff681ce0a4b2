"""The commands that read a run folder: `clawrl versions`, `records`, `memory` and `canary`.

Each opens the store (read-only unless it writes: `memory forget`) through `with_store`, so it
is safe while the server runs; heavy imports stay inside the command.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from clawrl.cli.common import fail, with_store
from clawrl.types import DEFAULT_USER


def cmd_canary(config: Any, args: argparse.Namespace) -> int:
    from clawrl.guard.recheck import recheck

    def act(store: Any) -> int:
        try:
            for row in recheck(config, store, args.versions):
                print(json.dumps(row) if args.json else _canary_line(row), flush=True)
        except ValueError as exc:
            return fail(str(exc))
        return 0

    return with_store(config.run_dir, act)


def _canary_line(r: dict[str, Any]) -> str:
    from clawrl.types import canary_reason

    kl = "-" if r["kl"] is None else f"{r['kl']:.4f}"
    line = f"{r['version']:<5} step {r['step']:<4} canary {r['score']:.4f} ({-r['drop']:+.1%} vs base "
    line += f"{r['base_score']:.4f}), right {r['accuracy']:.1%} (base {r['base_accuracy']:.1%}), KL {kl} "
    line += f"on {r['kl_tokens']} tokens: {r['now']} (recorded {r['recorded']})"
    if r.get("collapse"):
        from clawrl.guard.collapse import describe

        line += f"; {describe(r['collapse'])}"
    return line + canary_reason(r)


def cmd_records(args: argparse.Namespace) -> int:
    """`clawrl records export|show|episodes`: one JSON line per turn, one session for a human, or
    the latest episodes."""

    def act(store: Any) -> int:
        if args.session is not None and not store.session_exists(args.session):
            return fail(f"no session {args.session!r} in {args.run_dir / 'clawrl.db'}")
        try:
            _records_action(store, args)
        except OSError as exc:  # the --out file
            return fail(f"cannot write {args.out}: {exc}")
        return 0

    return with_store(args.run_dir, act)


def cmd_memory(args: argparse.Namespace) -> int:
    """`clawrl memory list|forget`: every user's experiences (a user's other than `default` shown
    before the text), or one retired now (the store is written)."""
    import dataclasses
    import time

    def act(store: Any) -> int:
        if args.action == "forget":
            gone = store.forget(args.id, time.time(), owner=None)
            if gone is None:
                return fail(f"no experience {args.id} in {args.run_dir / 'clawrl.db'}")
            print(f"#{gone.id} retired: {gone.text}")
            return 0
        for e in store.experiences(owner=None, state=args.state):
            if args.json:
                print(json.dumps(dataclasses.asdict(e), ensure_ascii=False))
            else:
                turns = ", ".join(e.turn_ids[-3:]) + (" ..." if len(e.turn_ids) > 3 else "")
                whose = f"[{e.owner}] " if e.owner != DEFAULT_USER else ""
                print(f"#{e.id:<4} {e.state:<9} seen {e.seen:<3} {whose}{e.text}  (from {turns})")
        return 0

    return with_store(args.run_dir, act, readonly=args.action == "list")


def cmd_versions(args: argparse.Namespace) -> int:
    """`clawrl versions`: one line per version: name, step, samples, metrics, checkpoint, canary."""

    def act(store: Any) -> None:
        for v in store.versions(None):  # every user's line (docs/users.md), the default user's first
            print(_version_line(v))

    return with_store(args.run_dir, act)


def _version_line(v: Any) -> str:
    m = v.metrics
    shown = " ".join(
        f"{k}={m[k]:.4g}"
        for k in ("loss", "kl", "mismatch_exact", "mean_reward", "tokens_per_s", "processed_tokens_per_s")
        if isinstance(m.get(k), int | float)
    )
    if m.get("rollback_of"):
        shown = f"rollback of {m['rollback_of']} {shown}".strip()
    where = v.path or "base model"
    line = f"{v.name:<5} step {v.step:<4} samples {m.get('samples', '-')!s:<4} {shown} {where}".rstrip()
    return line + _canary_text(v) + _pruned_text(v)


def _pruned_text(v: Any) -> str:
    """' | pruned optimizer.pt, adapter_model.safetensors: why' (and ' | adapter in bf16'), from the
    folder's pruned.json (clawrl/train/prune.py); '' for a version never pruned or without a folder."""
    from pathlib import Path

    from clawrl.version_folder import pruned_marker

    if v.path is None or not Path(v.path).is_dir():
        return ""
    marker = pruned_marker(Path(v.path))
    text = ""
    if marker.get("files"):
        why = f": {marker['why']}" if marker.get("why") else ""
        text += f" | pruned {', '.join(marker['files'])}{why}"
    if marker.get("bf16"):
        text += " | adapter in bf16"
    return text


def _canary_text(v: Any) -> str:
    """' | passed: canary 0.5123 (-0.4%), KL 0.0123', or ' | HELD: ...' with the reason; '' unchecked."""
    from clawrl.types import canary_figures, canary_reason

    c = v.canary
    if not c:
        return ""
    return f" | {'HELD' if v.held else v.status}: {canary_figures(c)}{canary_reason(c)}"


def _records_action(store: Any, args: argparse.Namespace) -> None:
    from clawrl.store.records import episodes, export, show

    if args.action == "show":
        show(store, args.session, sys.stdout)
    elif args.action == "episodes":
        episodes(store, sys.stdout, args.limit)
    elif args.out is None:
        export(store, sys.stdout, args.session, args.user)
    else:
        with open(args.out, "w", encoding="utf-8") as out:
            count = export(store, out, args.session, args.user)
        print(f"clawrl: wrote {count} turns to {args.out}", file=sys.stderr)
