"""`clawrl serve --dry-run [--gpus 8x80]`: print the placement plan (what runs on which GPU, each
share and why: clawrl/model/placement.py) and exit, starting nothing and writing no run folder.
`--gpus` describes a machine that is not this one (eight GPUs of 80 GiB); without it the plan is
made on this machine's GPUs. A plan that cannot fit exits 2 with the arithmetic, as a start would.
"""

from __future__ import annotations

import argparse
from typing import Any

from clawrl.cli.common import fail


def add_dry_run_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--dry-run",
        action="store_true",
        help="print the placement plan (each process's GPU, share and why) and exit; starts nothing",
    )
    serve.add_argument(
        "--gpus",
        metavar="COUNTxGIB",
        help="with --dry-run: plan for GPUs described, not this machine's, e.g. 8x80 (eight of 80 GiB)",
    )


def cmd_dry_run(config: Any, args: argparse.Namespace) -> int:
    """Print the plan; 0, or 2 with the reason where it cannot fit or the input is wrong."""
    from clawrl.model.placement import parse_gpus

    try:
        gpus = None if args.gpus is None else parse_gpus(args.gpus)
    except ValueError as exc:
        return fail(str(exc))
    from clawrl.model.load import ModelNotFound
    from clawrl.wiring.layout import StartRefused, dry_run  # torch is imported here

    try:
        text = dry_run(config, gpus)
    except (StartRefused, ModelNotFound) as exc:
        return fail(str(exc))
    print(text)
    return 0
