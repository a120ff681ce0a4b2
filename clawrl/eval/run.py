"""`clawrl eval`: run the experiment for each method and write the report folder.

Without `--base-url`, each method gets a fresh server (`clawrl serve` on the embedded
model or `--model`) in a fresh run folder `<run-root>/<method>`, from the same start,
with the base config (the eval default, `--config`, dotted overrides) and that method;
the server is stopped afterwards and the run folder kept for `clawrl report`. With
`--base-url`, the one method is the running server's own.

The report folder gets report.json, report.md and scores.png (clawrl.eval.report); each
run folder gets a copy of report.json, which `clawrl report --run-dir` picks up.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawrl.algo import METHODS
from clawrl.eval.client import EvalClient, EvalError
from clawrl.eval.experiment import check_learning, run_experiment
from clawrl.eval.personas import FilePersona, get_persona
from clawrl.eval.personas.base import Persona
from clawrl.eval.plot import plot_scores
from clawrl.eval.report import build_report, canary_rows, markdown, method_entry
from clawrl.eval.scenario import Outcome, Settings
from clawrl.eval.tasks import Task, load_tasks, split
from clawrl.store.db import Store, StoreError


@dataclass
class EvalPlan:
    """What `clawrl eval` will do, checked before any server starts."""

    persona: Persona
    methods: list[str | None]  # None: the running server's own method (--base-url)
    train: list[Task]
    held_out: list[Task]
    settings: Settings
    out: Path
    run_root: Path
    openclaw: Path | None = None  # the agent's launcher, with --via openclaw
    persona_file: dict[str, str] | None = None  # the persona file's path, sha256 and tasks, for the report


def make_plan(config: Any, args: Namespace) -> EvalPlan:
    """Check the options; ValueError with a message for the user when they do not fit."""
    if args.base_url is not None and args.model is not None:
        raise ValueError("--model is for the servers eval starts; --base-url evaluates a running one")
    scripted = get_persona(args.persona or "student", max_turns=args.max_turns)
    persona = make_persona(scripted, args)
    methods = parse_methods(args.method, config.method, remote=args.base_url is not None)
    train, held_out = split(persona_tasks(scripted, args.tasks), args.held_out, seed=args.seed)
    if not held_out:
        raise ValueError("--held-out must be at least 1: the score is measured on held-out tasks")
    if not train:
        raise ValueError("--held-out leaves no training tasks")
    run_root = args.run_dir if args.run_dir is not None else args.out / "runs"
    for method in methods:
        if method is not None and (run_root / method / "clawrl.db").exists():
            raise ValueError(f"{run_root / method} holds a run already; give another --out or --run-dir")
    openclaw = None
    if args.via == "openclaw":
        from clawrl.eval.via_openclaw import find_openclaw

        openclaw = find_openclaw(config.cache_dir())
    settings = make_settings(config, args)
    return EvalPlan(
        persona=persona,
        methods=methods,
        train=train,
        held_out=held_out,
        settings=settings,
        out=args.out,
        run_root=run_root,
        openclaw=openclaw,
        persona_file=scripted.source.as_json(),
    )


def make_settings(config: Any, args: Namespace) -> Settings:
    """The experiment settings; users are paced to train.batch_size samples per step by default."""
    for name in ("steps", "max_tokens", "concurrency", "points_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    per_step = args.samples_per_step if args.samples_per_step is not None else config.train.batch_size
    return Settings(
        steps=args.steps,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        feedback=not args.no_feedback,
        samples_per_step=per_step,
        stall_s=args.stall_s,
        max_wall_s=args.max_wall_s,
        seed=args.seed,
        via=args.via,
        points_every=args.points_every,
    )


def persona_tasks(persona: FilePersona, tasks: str | None) -> list[Task]:
    """--tasks, a shipped task set, when given (then every task has its answer); else the persona
    file's own tasks."""
    return persona.tasks if tasks is None else load_tasks(tasks)


def make_persona(persona: FilePersona, args: Namespace) -> Persona:
    """The scripted persona, or the same role played by a model at --persona-base-url."""
    if args.persona_base_url is None:
        return persona
    if not args.persona_model:
        raise ValueError("--persona-base-url needs --persona-model")
    from clawrl.eval.llm_persona import LLMPersona

    return LLMPersona(persona, args.persona_base_url, args.persona_model, api_key=args.persona_api_key)


def parse_methods(text: str | None, default: str, remote: bool) -> list[str | None]:
    """`rl,opd` -> ["rl", "opd"]; with a running server, only its own method (None)."""
    if remote:
        if text is not None and "," in text:
            raise ValueError(
                "--base-url evaluates the running server's one method; give one --method or none"
            )
        return [text]
    names = [m.strip() for m in (text or default).split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise ValueError(f"unknown method {','.join(unknown) or text!r}; known methods: {', '.join(METHODS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--method names a method twice: {text}")
    return list(names)


def run_eval(config: Any, args: Namespace) -> dict[str, Any]:
    """Run every method of the plan; returns the report, written to --out after each method."""
    plan = make_plan(config, args)
    api_key = config.server.api_key.get_secret_value() if config.server.api_key else None
    entries: dict[str, dict[str, Any]] = {}
    report: dict[str, Any] = {}
    try:
        for method in plan.methods:
            seen: list[Outcome] = []
            try:
                name, entry = _run_method(
                    config=config,
                    base_url=args.base_url,
                    method=method,
                    api_key=api_key,
                    plan=plan,
                    seen=seen,
                )
            except (KeyboardInterrupt, SystemExit):
                _report_interrupted(
                    config=config, base_url=args.base_url, plan=plan, entries=entries, seen=seen
                )
                raise
            entries[name] = entry
            report = _report(config, args.base_url, plan, entries)
            write_report(report, plan.out)  # a method that fails later loses none of these numbers
    finally:
        close = getattr(plan.persona, "close", None)
        if close is not None:
            close()
    return report


def _run_method(
    config: Any,
    base_url: str | None,
    method: str | None,
    api_key: str | None,
    plan: EvalPlan,
    seen: list[Outcome],
) -> tuple[str, dict[str, Any]]:
    """(method, its report entry): against the running server, or a fresh one. `seen` gets the
    outcome as soon as the experiment starts (what an interrupted run reports)."""
    if base_url is not None:
        outcome = asyncio.run(
            _remote(base_url=base_url, api_key=api_key, method=method, plan=plan, seen=seen)
        )
        return outcome.method, method_entry(outcome, None)
    outcome, run_dir = _fresh(
        config=config, method=method or config.method, api_key=api_key, plan=plan, seen=seen
    )
    return outcome.method, _fresh_entry(outcome, run_dir)


def _fresh_entry(outcome: Outcome, run_dir: Path) -> dict[str, Any]:
    """A fresh server's report entry: the outcome and its run folder's canary verdicts."""
    entry = method_entry(outcome, str(run_dir))
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        entry["canary"] = canary_rows(store.versions())
    return entry


def _report_interrupted(
    config: Any, base_url: str | None, plan: EvalPlan, entries: dict[str, dict[str, Any]], seen: list[Outcome]
) -> None:
    """Ctrl-C or SIGTERM mid-method: write the report with what that method measured (marked
    `stopped: "interrupted"`) beside the methods already done; nothing if it measured nothing."""
    if not seen or not seen[-1].points:
        return
    outcome = seen[-1]
    outcome.stopped = "interrupted"
    run_dir = plan.run_root / outcome.method if base_url is None else None
    try:
        entry = _fresh_entry(outcome, run_dir) if run_dir is not None else method_entry(outcome, None)
    except StoreError:  # the run folder's store cannot be read: the canary column stays out
        entry = method_entry(outcome, None if run_dir is None else str(run_dir))
    write_report(_report(config, base_url, plan, {**entries, outcome.method: entry}), plan.out)
    print(f"clawrl eval: interrupted; wrote {plan.out / 'report.json'} with what was measured", flush=True)


def _report(
    config: Any, base_url: str | None, plan: EvalPlan, entries: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    command = shlex.join(["clawrl", *sys.argv[1:]])
    # A running server's config is its own (in its run folder); ours would only mislead.
    served = {"base_url": base_url} if base_url is not None else config.dump()
    held_out = [t.id for t in plan.held_out]
    return build_report(
        persona=plan.persona.name,
        methods=entries,
        settings=plan.settings,
        held_out=held_out,
        command=command,
        config=served,
        persona_file=plan.persona_file,
    )


async def _remote(
    base_url: str, api_key: str | None, method: str | None, plan: EvalPlan, seen: list[Outcome]
) -> Outcome:
    async with _client(base_url, api_key, method, plan) as client:
        _, served = check_learning(await client.health(), memory_only=True)
        if method is not None and method != served:
            raise EvalError(f"the server at {base_url} trains with method {served!r}, not {method!r}")
        return await run_experiment(
            client=client,
            persona=plan.persona,
            train=plan.train,
            held_out=plan.held_out,
            settings=plan.settings,
            seen=seen,
        )


def _client(base_url: str, api_key: str | None, method: str | None, plan: EvalPlan) -> EvalClient:
    """The bare API, or the OpenClaw agent with its homes under OUT/openclaw/METHOD."""
    if plan.openclaw is None:
        return EvalClient(base_url, api_key)
    from clawrl.eval.via_openclaw import OpenClawClient

    return OpenClawClient(base_url, api_key, plan.openclaw, plan.out / "openclaw" / (method or "served"))


def _fresh(
    config: Any, method: str, api_key: str | None, plan: EvalPlan, seen: list[Outcome]
) -> tuple[Outcome, Path]:
    from clawrl.launcher import ServerProcess

    run_dir = plan.run_root / method
    cfg = config.model_copy(update={"method": method, "run_dir": run_dir}, deep=True)
    print(f"clawrl eval: method {method}: starting a server in {run_dir}", flush=True)
    with ServerProcess.from_config(cfg, fresh=True) as server:
        outcome = asyncio.run(
            _remote(base_url=server.url, api_key=api_key, method=method, plan=plan, seen=seen)
        )
    return outcome, run_dir


def write_report(report: dict[str, Any], out: Path) -> None:
    """report.json, report.md and scores.png in `out`; report.json also in each run folder."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2) + "\n"
    (out / "report.json").write_text(text)
    (out / "report.md").write_text(markdown(report))
    plot_scores(report, out / "scores.png")
    for entry in report["methods"].values():
        if entry["run_dir"] and Path(entry["run_dir"]).is_dir():
            (Path(entry["run_dir"]) / "report.json").write_text(text)
