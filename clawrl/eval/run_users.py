"""`clawrl eval --users brief,stepwise`: several simulated users on one fresh server.

One method (`--method`, one name, or the config's), one server in `<run-root>/<method>-<adapters>`
(`adapters`: per_user or shared, from `train.adapters` as the server resolves it with users on),
started with a users file eval writes there (`clawrl.eval.users`: one generated key per user) and
the admin key (`server.api_key`, or a generated one). The users talk at once, each under their own
key (`clawrl.eval.together`); the report folder gets report.json, report.md and scores.png
(`clawrl.eval.users_report`), one line per user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from clawrl.eval.client import EvalClient
from clawrl.eval.personas import PERSONAS, FilePersona, get_persona
from clawrl.eval.plot import plot_scores
from clawrl.eval.report import canary_rows, method_entry
from clawrl.eval.run import make_settings, parse_methods
from clawrl.eval.scenario import Outcome, Settings
from clawrl.eval.tasks import Task, load_tasks, split
from clawrl.eval.together import SimUser, run_together
from clawrl.eval.users import check_user_names, line_of, new_key, parse_users, write_users_file
from clawrl.eval.users_report import build_users_report, users_markdown
from clawrl.store.db import Store, StoreError
from clawrl.types import DEFAULT_USER

# Options of the one-persona path that --users does not take (each user is a scripted persona).
_NOT_WITH_USERS = {
    "base_url": "--base-url (eval starts the server, with a users file of its own)",
    "persona_base_url": "--persona-base-url",
}


def check_users_args(args: Namespace) -> None:
    """ValueError naming an option that does not go with --users."""
    for name, shown in _NOT_WITH_USERS.items():
        if getattr(args, name, None) is not None:
            raise ValueError(f"--users does not go with {shown}")
    if args.persona is not None:
        raise ValueError("--users names the personas, one per user: leave --persona out")
    if args.via != "api":
        raise ValueError("--users talks through the bare API only (no --via openclaw)")


def run_users_eval(config: Any, args: Namespace) -> dict[str, Any]:
    """Run the experiment with several users; returns the report, also written to --out."""
    check_users_args(args)
    personas = user_personas(parse_users(args.users, list(PERSONAS)), args.max_turns)
    names = list(personas)
    sources = {name: persona.source.as_json() for name, persona in personas.items()}
    method = parse_methods(args.method, config.method, remote=False)
    if len(method) != 1:
        raise ValueError("--users runs one method: give one --method")
    settings = make_settings(config, args)
    train, held_out = split(users_tasks(personas, args.tasks), args.held_out, seed=args.seed)
    if not held_out or not train:
        raise ValueError("--held-out must leave at least one held-out and one training task")
    keys = {name: new_key(name) for name in names}
    cfg = users_config(
        config, method[0], keys, args.run_dir if args.run_dir is not None else args.out / "runs"
    )
    adapters = "per_user" if cfg.per_user_adapters else "shared"
    seen: dict[str, Outcome] = {}

    def report_of(outcomes: dict[str, Outcome]) -> dict[str, Any]:
        lines = {name: line_of(name, cfg.per_user_adapters) for name in outcomes}
        entries = {
            name: user_entry(outcomes[name], name, lines[name]) | {"persona_file": sources[name]}
            for name in outcomes
        }
        with contextlib.suppress(StoreError):  # unreadable: the canary column stays out
            _add_canary(entries, cfg.run_dir / "clawrl.db")
        command = shlex.join(["clawrl", *sys.argv[1:]])
        held = [t.id for t in held_out]
        return build_users_report(
            users=entries,
            method=method[0],
            adapters=adapters,
            settings=settings,
            held_out=held,
            command=command,
            config=cfg.dump(),
            run_dir=str(cfg.run_dir),
        )

    try:
        outcomes = _serve(
            cfg=cfg,
            keys=keys,
            personas=personas,
            train=train,
            held_out=held_out,
            settings=settings,
            seen=seen,
        )
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM: keep what was measured
        if any(o.points for o in seen.values()):  # each user not done is marked "interrupted"
            write_users_report(report_of(seen), args.out)
            written = args.out / "report.json"
            print(f"clawrl eval: interrupted; wrote {written} with what was measured", flush=True)
        raise
    report = report_of(outcomes)
    write_users_report(report, args.out)
    return report


def user_personas(items: list[str], max_turns: int) -> dict[str, FilePersona]:
    """Each user's persona (a shipped name or a persona file), by the persona's name, which names
    the user; ValueError for two alike or a name no user can have."""
    personas = [get_persona(item, max_turns=max_turns) for item in items]
    check_user_names([p.name for p in personas])
    return {p.name: p for p in personas}


def users_tasks(personas: dict[str, FilePersona], tasks: str | None) -> list[Task]:
    """--tasks when given; else the personas' own tasks, which must then be the same for all (the
    users share one split of held-out and training tasks)."""
    if tasks is not None:
        return load_tasks(tasks)
    first, *rest = personas.values()
    differ = [p.name for p in rest if p.tasks != first.tasks]
    if differ:
        raise ValueError(
            f"--users: the personas {first.name} and {', '.join(differ)} bring different tasks; "
            "give one set with --tasks"
        )
    return first.tasks


def users_config(config: Any, method: str, keys: dict[str, str], run_root: Path) -> Any:
    """The served config: `method`, the users file with `keys` in a fresh run folder named after the
    method and the adapters, and an admin key (the config's, or a generated one)."""
    probe = config.model_copy(
        update={"server": config.server.model_copy(update={"users": Path("users.json")})}
    )
    adapters = "per_user" if probe.per_user_adapters else "shared"
    run_dir = run_root / f"{method}-{adapters}"
    if (run_dir / "clawrl.db").exists():
        raise ValueError(f"{run_dir} holds a run already; give another --out or --run-dir")
    admin = config.server.api_key or SecretStr(new_key(DEFAULT_USER))
    server = config.server.model_copy(update={"users": write_users_file(run_dir, keys), "api_key": admin})
    return config.model_copy(update={"method": method, "run_dir": run_dir, "server": server}, deep=True)


def user_entry(outcome: Outcome, persona: str, line: str) -> dict[str, Any]:
    """One user's part of report.json: their `method_entry`, persona and line of versions."""
    return method_entry(outcome, None) | {"persona": persona, "line": line}


def _serve(
    cfg: Any,
    keys: dict[str, str],
    personas: dict[str, FilePersona],
    train: list[Task],
    held_out: list[Task],
    settings: Settings,
    seen: dict[str, Outcome],
) -> dict[str, Outcome]:
    """Start the server, let every user talk under their own key, stop it; each user's outcome
    (`seen`: each one as soon as it is made, what an interrupted run reports)."""
    from clawrl.launcher import ServerProcess

    print(f"clawrl eval: users {', '.join(keys)}: starting a server in {cfg.run_dir}", flush=True)
    with ServerProcess.from_config(cfg, fresh=True) as server:
        return asyncio.run(
            _together(
                url=server.url,
                cfg=cfg,
                keys=keys,
                personas=personas,
                train=train,
                held_out=held_out,
                settings=settings,
                seen=seen,
            )
        )


async def _together(
    url: str,
    cfg: Any,
    keys: dict[str, str],
    personas: dict[str, FilePersona],
    train: list[Task],
    held_out: list[Task],
    settings: Settings,
    seen: dict[str, Outcome],
) -> dict[str, Outcome]:
    async with contextlib.AsyncExitStack() as stack:
        admin = await stack.enter_async_context(EvalClient(url, cfg.server.api_key.get_secret_value()))
        users = []
        for name, key in keys.items():
            client = await stack.enter_async_context(EvalClient(url, key))
            users.append(SimUser(name, personas[name], client, line_of(name, cfg.per_user_adapters)))
        return await run_together(
            admin=admin, users=users, train=train, held_out=held_out, settings=settings, seen=seen
        )


def _add_canary(entries: dict[str, dict[str, Any]], db: Path) -> None:
    """Each user's line's canary rows, from the run's store."""
    with Store.open(db, readonly=True) as store:
        for entry in entries.values():
            entry["canary"] = canary_rows(store.versions(entry["line"]))


def write_users_report(report: dict[str, Any], out: Path) -> None:
    """report.json, report.md and scores.png (one line per user) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(users_markdown(report))
    view = {
        "methods": report["users"],
        "persona": ", ".join(report["users"]),
        "signal": f"{report['adapters']}: {report['signal']}",
    }
    plot_scores(view, out / "scores.png")
