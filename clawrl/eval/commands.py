"""`clawrl eval` and `clawrl report`: argument parsing only (the work is imported when run).

    clawrl eval --persona brief --method rl,combine --steps 8 --out eval-out --train.batch-size 8
    clawrl eval --persona my-user.toml --method combine --steps 4 --out mine
    clawrl eval --base-url http://127.0.0.1:8000 --persona student --steps 4
    clawrl eval --users brief,stepwise --method combine --train.adapters per_user --steps 4 --out two
    clawrl report --run-dir eval-out/runs/rl

`eval` goes through `clawrl.cli.main`'s config path: its dotted options are checked and
merged into the base config of the servers it starts (`--config`, by default the empty
`clawrl/eval/eval.toml`, so no run folder's config.json is picked up by accident).
`report` needs no config.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

EVAL_CONFIG = Path(__file__).with_name("eval.toml")

EVAL_DESCRIPTION = """\
Prove that the server learns. Measure a simulated user's score of the first answer to
each held-out task at v0, then let simulated users hold training conversations (and rate
each answer through POST /v1/feedback) until the server publishes a new version, measure
again, and so on for --steps versions. Each method in --method starts from the same
point: a fresh server in a fresh run folder. Extra --section.key VALUE options override
the started servers' config, e.g. --train.batch-size 8 --train.lr 5e-4 --judge.backend feedback.
With --base-url, the running server's own config counts; give its --train.batch-size so the
users are paced to it, and --server.api-key (or $CLAWRL_API_KEY) if it needs a key.

Writes OUT/report.json, OUT/report.md and OUT/scores.png; run folders go to OUT/runs/METHOD.
--users brief,stepwise runs several simulated users on one server instead (docs/evaluation.md,
"Several users on one server"): its run folder is OUT/runs/METHOD-ADAPTERS."""


def add_eval_parsers(sub: Any) -> None:
    """Register `eval` and `report` on the `clawrl` subcommands."""
    _eval_parser(sub)
    report = sub.add_parser(
        "report",
        help="plot a run's rewards, hint acceptance and eval scores",
        description="Read a run folder's store (read-only: safe while the server runs), print a "
        "summary and write training.png: mean reward per step, share of judgments with a hint "
        "over time, and the eval scores per version when an eval report.json is found.",
    )
    report.add_argument("--run-dir", type=Path, default=Path("clawrl-run"), help="default ./clawrl-run")
    report.add_argument("--out", type=Path, help="folder for training.png (default: the run folder)")
    report.add_argument("--eval", type=Path, help="an eval report.json (default: RUN_DIR/report.json)")
    report.set_defaults(direct=cmd_report)


def _eval_parser(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="prove it learns: held-out scores of simulated users, step by step",
        description=EVAL_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--persona",
        help="a shipped persona (student | teacher | brief | pirate | direct | autograde | stepwise | "
        "finish; default student) or a persona file, FILE.toml (docs/evaluation.md, 'Persona files')",
    )
    p.add_argument(
        "--users",
        help="several simulated users on one server, e.g. brief,stepwise or brief,mine.toml: one persona "
        "(a name or a file) each, under its own "
        "key, all at once; each measured on their own versions (train.adapters per_user: brief/v1, ...; "
        "shared: v1, ...). One method; --concurrency is per user",
    )
    p.add_argument("--persona-base-url", help="play the persona with the model at this OpenAI-compatible URL")
    p.add_argument("--persona-model", help="the persona model's name (with --persona-base-url)")
    p.add_argument("--persona-api-key", help="the persona endpoint's key (with --persona-base-url)")
    p.add_argument("--steps", type=int, default=4, help="training steps (versions) to measure (default 4)")
    p.add_argument("--method", help="comma list of rl, opd, combine (default: the config's method)")
    p.add_argument("--held-out", type=int, default=8, help="held-out tasks (default 8)")
    p.add_argument(
        "--tasks", help="a shipped task set (default: the persona file's tasks; math for the shipped ones)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the task split and order (default 0)")
    p.add_argument("--max-tokens", type=int, default=128, help="longest answer (default 128)")
    p.add_argument("--max-turns", type=int, default=3, help="answers per training conversation (default 3)")
    p.add_argument("--concurrency", type=int, default=4, help="simulated users at once (default 4)")
    p.add_argument("--no-feedback", action="store_true", help="no POST /v1/feedback: the judge alone teaches")
    p.add_argument(
        "--via",
        choices=("api", "openclaw"),
        default="api",
        help="api: the users send bare chat requests (default); openclaw: through the real OpenClaw agent "
        "(scripts/setup-openclaw), its lean profile and its own sampling",
    )
    p.add_argument(
        "--samples-per-step",
        type=int,
        help="pace the users to this many samples per step (default train.batch-size)",
    )
    p.add_argument(
        "--points-every",
        type=int,
        default=4,
        help="with no trainer and memory on (memory only: --train.enabled false --memory.enabled true), "
        "a point every this many sessions (default 4); --steps points in all",
    )
    p.add_argument("--stall-s", type=float, default=120.0, help="paced users go on after this wait (120)")
    p.add_argument("--max-wall-s", type=float, default=7200.0, help="stop a method after this (default 7200)")
    p.add_argument(
        "--out", type=Path, default=Path("clawrl-eval"), help="report folder (default ./clawrl-eval)"
    )
    p.add_argument("--base-url", help="evaluate this running server instead of starting fresh ones")
    p.add_argument("--config", type=Path, default=EVAL_CONFIG, help="base config of the started servers")
    p.add_argument("--run-dir", type=Path, help="where the fresh run folders go (default OUT/runs)")
    p.add_argument(
        "--model", help="local Hugging Face model folder (default: embedded SmolLM2-135M-Instruct)"
    )
    p.set_defaults(run=cmd_eval)


def _fail(message: str) -> int:
    print(f"clawrl: error: {message}", file=sys.stderr)
    return 2


def cmd_eval(config: Any, args: argparse.Namespace) -> int:
    """`clawrl eval`: run the experiment, write the report, print where it is."""
    import logging

    from clawrl.eval.client import EvalError
    from clawrl.eval.run import run_eval
    from clawrl.eval.run_users import run_users_eval
    from clawrl.launcher import LaunchError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # SIGTERM unwinds like Ctrl-C, so the servers eval started are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        report = run_users_eval(config, args) if args.users is not None else run_eval(config, args)
    except (ValueError, EvalError, LaunchError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:  # Ctrl-C: what was measured is in the report already (run_eval)
        print("clawrl eval: interrupted", file=sys.stderr)
        return 130
    for method, entry in (report.get("methods") or report["users"]).items():
        scores = " -> ".join(f"{s:.3f}" for s in entry["scores"])
        nothing = "; nothing to learn: v0 meets every check" if entry.get("nothing_to_learn") else ""
        print(f"clawrl eval: {method}: {scores} ({entry['wall_s']:.0f} s, {entry['stopped']}{nothing})")
    print(f"clawrl eval: signal: {report['signal']}")
    print(f"clawrl eval: wrote {args.out / 'report.json'}, report.md and scores.png")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """`clawrl report`: summary on stdout, training.png in --out."""
    from clawrl.eval.history import read_history, summary
    from clawrl.eval.plot import plot_history
    from clawrl.eval.report import eval_entry_for
    from clawrl.store.db import StoreError

    if not (args.run_dir / "clawrl.db").is_file():
        return _fail(f"no clawrl.db in {args.run_dir} (is it a clawrl run folder?)")
    try:
        history = read_history(args.run_dir)
        entry = eval_entry_for(
            args.eval or args.run_dir / "report.json", history.method, required=bool(args.eval)
        )
        out = args.out or args.run_dir
        out.mkdir(parents=True, exist_ok=True)
        path = plot_history(history, entry, out / "training.png")
    except (StoreError, ValueError, OSError) as exc:
        return _fail(str(exc))
    print(summary(history, entry))
    print(f"wrote {path}")
    return 0
