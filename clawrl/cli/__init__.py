"""Console entry point: `clawrl <command>`.

Only argparse and the standard library are imported before the arguments are
parsed, so `clawrl --help` answers at once; torch and transformers load inside
the command that needs them.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
from pathlib import Path
from typing import Any

from clawrl.cli.common import fail, with_store
from clawrl.cli.dry_run import add_dry_run_arguments, cmd_dry_run
from clawrl.cli.reading import cmd_canary, cmd_memory, cmd_records, cmd_versions
from clawrl.cli.tiny import add_tiny_model_parser
from clawrl.cli.users import add_users_parser
from clawrl.envs.commands import add_envs_parser  # argparse only; the work imports lazily
from clawrl.eval.commands import add_eval_parsers  # argparse only; the work imports lazily

DESCRIPTION = """\
Serve a self-hosted model through an OpenAI-compatible API, and train it on the
conversations it serves.

Any config field can be overridden with a dotted option, e.g.
  clawrl serve --server.port 30000 --server.api-key KEY --engine.max-batch-size 8
(see configs/example.toml for every field)."""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TOML config file (see configs/example.toml)")
    p.add_argument("--run-dir", type=Path, help="folder for everything clawrl writes (default ./clawrl-run)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clawrl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible server",
        description="Run the server. Extra --section.key VALUE options override the config.",
    )
    _common(serve)
    serve.add_argument(
        "--model", help="local Hugging Face model folder (default: embedded SmolLM2-135M-Instruct)"
    )
    add_dry_run_arguments(serve)
    serve.set_defaults(run=cmd_serve)
    _train_parsers(sub)
    _records_parser(sub)
    _memory_parser(sub)
    add_users_parser(sub)
    add_eval_parsers(sub)
    add_envs_parser(sub)
    add_tiny_model_parser(sub)
    return parser


def _train_parsers(sub: Any) -> None:
    """`train`, `rollback` and `export`: they read the run folder's config.json unless --config is given."""
    train = sub.add_parser(
        "train",
        help="run the trainer alone against a run folder",
        description="Train on the run folder's ready samples and publish versions until stopped. "
        "`clawrl serve` already runs one; only one trainer may hold a run folder.",
    )
    train.add_argument("--exit-with-parent", type=int, help=argparse.SUPPRESS)
    train.add_argument("--in-group", action="store_true", help=argparse.SUPPRESS)  # a rank of our launcher
    train.add_argument(
        "--launch",
        choices=("auto", "accelerate", "none"),
        default="auto",
        help="accelerate: start train.distributed.num_processes ranks through accelerate; none: train in "
        "this process (also as a rank under `accelerate launch -m clawrl train`); auto (default): "
        "accelerate when num_processes > 1",
    )
    train.add_argument("--steps", type=int, help="stop after publishing this many versions")
    train.add_argument(
        "--server",
        metavar="URL",
        help="train for the gateway at URL (`clawrl serve --train.enabled false`) through its API, on any "
        "host: the admin key from --server.api-key or $CLAWRL_API_KEY; --run-dir holds this trainer's "
        "own copies of the versions (docs/several-processes.md)",
    )
    train.set_defaults(run=cmd_train)
    rollback = sub.add_parser(
        "rollback",
        help="serve and train from an earlier version again",
        description="Publish a new version that is a copy of VERSION: the server swaps it in and the "
        "trainer continues from it, optimizer state included. Nothing is deleted.",
    )
    rollback.add_argument(
        "version", help="the version to go back to (v0 is the base model; alice/v2: a user's own version)"
    )
    rollback.set_defaults(run=cmd_rollback)
    export = sub.add_parser(
        "export",
        help="write a version as a standalone Hugging Face model folder",
        description="Write base model + adapter merged (or a full version) with the base's tokenizer.",
    )
    export.add_argument("--merged", type=Path, required=True, metavar="DIR", help="the folder to create")
    export.add_argument("--version", help="which version (default: the latest)")
    export.set_defaults(run=cmd_export)
    canary = sub.add_parser(
        "canary",
        help="measure the canary on published versions again",
        description="Re-run the canary gate's check (general-set score, KL to the base on recent turns) on "
        "the run's versions and print one line each. Read-only: statuses stay as the gate set them.",
    )
    canary.add_argument("versions", nargs="*", help="which versions (default: all)")
    canary.add_argument("--json", action="store_true", help="one JSON object per version")
    canary.set_defaults(run=cmd_canary)
    for p in (train, rollback, export, canary):
        _common(p)
        p.add_argument("--model", help="local Hugging Face model folder (default: the run's, else embedded)")


def _run_dir(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`p` with --run-dir (default ./clawrl-run): the store a reading command opens."""
    p.add_argument("--run-dir", type=Path, default=Path("clawrl-run"), help="default ./clawrl-run")
    return p


def _records_parser(sub: Any) -> None:
    records = sub.add_parser(
        "records",
        help="export or show the recorded turns",
        description="Read the run's store. Never writes it; safe while the server runs.",
    )
    actions = records.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="write one JSON line per turn")
    export.add_argument("--out", type=Path, help="output file (default: standard output)")
    export.add_argument("--session", help="only this session's turns")
    export.add_argument("--user", help="only this user's turns (server.users, docs/users.md)")
    show = actions.add_parser("show", help="print one session for a human")
    show.add_argument("--session", required=True, help="the session id")
    episodes = actions.add_parser("episodes", help="list the latest Track 2 episodes, one line each")
    episodes.add_argument("--limit", type=int, default=50, help="how many (default 50)")
    episodes.set_defaults(session=None)
    for p in (export, show, episodes):
        _run_dir(p).set_defaults(direct=cmd_records)
    versions = sub.add_parser("versions", help="list the published policy versions, one line each")
    _run_dir(versions).set_defaults(direct=cmd_versions)


def _memory_parser(sub: Any) -> None:
    memory = sub.add_parser(
        "memory",
        help="list or forget the experiences memory learnt (docs/memory.md)",
        description="The experiences learnt from hints and rating comments, with their provenance.",
    )
    actions = memory.add_subparsers(dest="action", required=True, metavar="ACTION")
    listed = actions.add_parser("list", help="one line per experience, last seen first (read-only)")
    listed.add_argument("--state", choices=("active", "distilled", "retired"), help="only this state")
    listed.add_argument("--json", action="store_true", help="one JSON object per experience")
    forget = actions.add_parser("forget", help="erase an experience: never injected again (kept as retired)")
    forget.add_argument("id", type=int, help="the experience's id (from `clawrl memory list`)")
    for p in (listed, forget):
        _run_dir(p).set_defaults(direct=cmd_memory)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "direct", None) is not None:  # commands that need no config
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return int(args.direct(args))
    from pydantic import ValidationError

    from clawrl.config import ConfigError, load_config, parse_overrides

    try:
        overrides = parse_overrides(extra)
        _shortcuts(args, overrides)
        config = load_config(_config_file(args), overrides)
    except (ConfigError, ValidationError) as exc:
        parser.error(str(exc))
    return int(args.run(config, args) or 0)


def _config_file(args: argparse.Namespace) -> Path | None:
    """--config, else (for commands working on an existing run) the run folder's resolved config.json."""
    if args.config is not None or args.command == "serve":
        return args.config
    resolved = (args.run_dir or Path("clawrl-run")) / "config.json"
    return resolved if resolved.is_file() else None


def _shortcuts(args: argparse.Namespace, overrides: dict[str, Any]) -> None:
    if getattr(args, "run_dir", None) is not None:
        overrides["run_dir"] = str(args.run_dir)
    if getattr(args, "model", None) is not None:
        overrides.setdefault("model", {})["path"] = args.model


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def prepare_run_dir(config: Any) -> Path:
    """Create the run folder and prove it is writable by writing the resolved config.

    A folder created here is private to its owner (0700): it holds every recorded conversation.
    An existing folder keeps the permissions it has."""
    config.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (config.run_dir / "logs").mkdir(exist_ok=True, mode=0o700)
    return config.write()


def setup_logging(level: str, logfile: Path, bare_console: bool = False) -> None:
    """Log to the console and `logfile`. `bare_console`: no time on the console (a supervisor adds it)."""
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    console = logging.StreamHandler()
    if bare_console:
        console.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handlers: list[logging.Handler] = [console, logging.FileHandler(logfile)]
    logging.basicConfig(level=level.upper(), format=fmt, handlers=handlers, force=True)


def cmd_serve(config: Any, args: argparse.Namespace | None = None) -> int:
    """`clawrl serve`. One server per run folder: it holds `<run_dir>/server.lock` for its life
    (clawrl/store/locks.py), and a second one exits 2 naming the holder's pid before it writes
    config.json or starts anything. `--dry-run` prints the placement plan and exits (cli/dry_run.py)."""
    if getattr(args, "dry_run", False):
        return cmd_dry_run(config, args)
    if getattr(args, "gpus", None) is not None:
        return fail("--gpus describes a machine for --dry-run only; a server runs on the GPUs it has")
    server = config.server
    if not _is_loopback(server.host) and server.api_key is None:
        return fail(
            f"refusing to bind {server.host} without an API key: anyone on the network could use "
            "(and train) this model. Set --server.api-key KEY or $CLAWRL_API_KEY, or bind 127.0.0.1."
        )
    from clawrl.config.users import users_refusal

    if server.users is not None and (refused := users_refusal(server)):
        return fail(refused)
    if config.collect.enabled and config.train.enabled:
        from clawrl.train.group import strategy_refusal

        if refused := strategy_refusal(config.train.distributed):
            return fail(refused)
    from clawrl.store.filesystem import network_refusal

    if config.collect.enabled and (refused := network_refusal(config.run_dir / "clawrl.db")):
        return fail(refused)  # before the lock and config.json: nothing is written there
    from clawrl.store.locks import SERVER_LOCK, FolderLocked, hold

    try:
        config.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = hold(config.run_dir, SERVER_LOCK, "clawrl serve")  # before config.json is written
    except FolderLocked as exc:
        return fail(f"{exc}: one server per run folder (stop it, or give another --run-dir)")
    except OSError as exc:
        return fail(f"cannot write the run folder {config.run_dir}: {exc}")
    try:
        try:
            prepare_run_dir(config)
        except OSError as exc:
            return fail(f"cannot write the run folder {config.run_dir}: {exc}")
        setup_logging(server.log_level, config.run_dir / "logs" / "server.log")
        from clawrl.wiring.server import run_server  # heavy imports (torch, transformers) start here

        return run_server(config)
    finally:
        lock.close()  # the process's end drops it too, however it ends


def cmd_train(config: Any, args: argparse.Namespace) -> int:
    """`clawrl train`: the trainer loop in this process, until stopped."""
    (config.run_dir / "logs").mkdir(parents=True, exist_ok=True)
    supervised = args.exit_with_parent is not None
    level, logfile = config.server.log_level, config.run_dir / "logs" / "trainer.log"
    rank = _rank()
    if rank > 0:  # rank 0 speaks for the group; the others log warnings and errors only
        level, logfile = "warning", logfile.with_name(f"trainer-rank{rank}.log")
    setup_logging(level, logfile, bare_console=supervised)
    from clawrl.wiring.trainer import run_trainer

    return run_trainer(
        config=config,
        parent_pid=args.exit_with_parent,
        launch=args.launch,
        in_group=args.in_group,
        steps=args.steps,
        server=args.server,
    )


def _rank() -> int:
    from clawrl.config import launched_rank

    return launched_rank()


def cmd_rollback(config: Any, args: argparse.Namespace) -> int:
    from clawrl.train.publish import rollback

    def act(store: Any) -> int:
        version = rollback(store, config, args.version)
        print(f"published {version.name}: a copy of {args.version}; the server and the trainer follow it")
        return 0

    return with_store(config.run_dir, act, readonly=False)


def cmd_export(config: Any, args: argparse.Namespace) -> int:
    from clawrl.train.publish import export

    def act(store: Any) -> int:
        out = export(store, config, args.version, args.merged)
        print(f"wrote {out}")
        return 0

    return with_store(config.run_dir, act)
