"""`clawrl envs train` and `clawrl envs eval`: check the options, start the servers, run, report.

Everything a user can get wrong (an environment that does not import or build, a tasks
file that is not JSONL, a tool schedule naming a tool the environment lacks, a number
out of range) is found by `make_plan` before any server starts, as a ValueError or an
`EnvsError` (the command exits 2).

train: without --base-url, `clawrl serve` on the embedded model (or --model) in
`--run-dir` (default OUT/run) with method grpo; the server and its trainer are stopped
afterwards, the run folder kept. eval: each version of `--run-dir` is served by a
fresh server of its own in OUT/servers/<version> (training, judge and canary off),
so the run is only read: v0 is the run's base model as its config names it, a
trained version is first exported (`clawrl export --merged`, into a temporary
folder); with --base-url, the version that server serves now.
"""

from __future__ import annotations

import asyncio
import random
import shlex
import subprocess
import sys
import tempfile
from argparse import Namespace
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from clawrl.envs.client import EnvClient
from clawrl.envs.episode import EpisodeResult, EpisodeSettings
from clawrl.envs.errors import EnvsError
from clawrl.envs.groups import GroupResult, Runner, Task, groups_at_once, run_all
from clawrl.envs.load import EnvSpec, load_env, load_reward, probe, read_tasks, shipped_tasks, task_id
from clawrl.envs.report import build_report, write_report
from clawrl.envs.schedule import parse_schedule
from clawrl.envs.training import train


@dataclass
class EnvPlan:
    """What a `clawrl envs` command will run, checked before any server starts."""

    env: EnvSpec
    reward_fn: Callable[..., Any] | None
    tasks: list[Task]
    tasks_text: str
    settings: EpisodeSettings
    group_size: int
    concurrency: int

    def describe(self, args: Namespace) -> dict[str, Any]:
        """The settings, for report.json."""
        settings = asdict(self.settings) | {"schedule": str(self.settings.schedule)}
        return settings | {
            "group_size": self.group_size,
            "concurrency": self.concurrency,
            "reward": args.reward,
            "seed": args.seed,
            "shuffle_rewards": bool(getattr(args, "shuffle_rewards", False)),
        }


def make_plan(args: Namespace) -> EnvPlan:
    """Load and check everything the run needs; ValueError or EnvsError with a message for the user."""
    for name in ("max_tokens", "concurrency", "group_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.tool_timeout <= 0:
        raise ValueError("--tool-timeout must be positive")
    env = load_env(args.env)
    reward_fn = load_reward(args.reward) if args.reward else None
    tools = probe(env, reward_fn is not None)
    default = env.shipped.tool_choice if env.shipped else "auto"
    schedule = parse_schedule(args.tool_choice or default)
    unknown = schedule.unknown(tools) if tools else []
    if unknown:
        raise ValueError(
            f"--tool-choice names {', '.join(unknown)}; {env.name}'s tools are {', '.join(tools)}"
        )
    max_turns = args.max_turns or (env.shipped.max_turns if env.shipped else 8)
    if max_turns < 1:
        raise ValueError("--max-turns must be at least 1")
    rows, text = _rows(args, env)
    # A Harbor verifier may take longer than a tool call: its task.toml says how long.
    tool_timeout = max(args.tool_timeout, env.min_tool_timeout_s)
    settings = EpisodeSettings(
        schedule=schedule,
        max_turns=max_turns,
        max_tokens=args.max_tokens,
        tool_timeout_s=tool_timeout,
        temperature=args.temperature,
    )
    tasks = [Task(task_id(row, i), row) for i, row in enumerate(rows)]
    return EnvPlan(
        env=env,
        reward_fn=reward_fn,
        tasks=tasks,
        tasks_text=text,
        settings=settings,
        group_size=args.group_size,
        concurrency=args.concurrency,
    )


def _rows(args: Namespace, env: EnvSpec) -> tuple[list[dict[str, Any]], str]:
    if args.tasks is not None:
        rows = read_tasks(args.tasks)
        text = f"{args.tasks} ({len(rows)} rows)"
    else:
        rows = shipped_tasks(env, args.split, args.seed)
        text = f"{env.name} {args.split} split, seed {args.seed} ({len(rows)} rows)"
    limit = getattr(args, "limit", None)
    if limit is not None:
        if limit < 1:
            raise ValueError("--limit must be at least 1")
        if limit < len(rows):
            text = text.replace(f"({len(rows)} rows)", f"(the first {limit} of {len(rows)} rows)")
            rows = rows[:limit]
    return rows, text


def _api_key(config: Any) -> str | None:
    return config.server.api_key.get_secret_value() if config.server.api_key else None


def _command() -> str:
    return shlex.join(["clawrl", *sys.argv[1:]])


def run_train(config: Any, args: Namespace) -> dict[str, Any]:
    """`clawrl envs train`; returns the report, also written to --out."""
    if args.steps < 1:
        raise ValueError("--steps must be at least 1")
    if args.group_size < 2:
        raise ValueError("--group-size must be at least 2: a group of one has no one to compare with")
    if args.base_url is not None and args.model is not None:
        raise ValueError("--model is for the server envs train starts; --base-url uses a running one")
    plan = make_plan(args)
    key = _api_key(config)
    if args.max_ahead is None:
        args.max_ahead = 2 * config.train.batch_size
    if args.max_ahead < 0:
        raise ValueError("--max-ahead must be 0 (off) or more")
    if args.base_url is not None:
        outcome = asyncio.run(_train(args.base_url, key, plan, args))
        where: dict[str, Any] = {"base_url": args.base_url}
    else:
        from clawrl.launcher import ServerProcess

        run_dir = args.run_dir or args.out / "run"
        cfg = config.model_copy(update={"method": "grpo", "run_dir": run_dir}, deep=True)
        print(f"clawrl envs: starting a server (method grpo) in {run_dir}", file=sys.stderr, flush=True)
        with ServerProcess.from_config(cfg) as server:
            outcome = asyncio.run(_train(server.url, key, plan, args))
        where = {"run_dir": str(run_dir), "config": cfg.dump()}
    extra = {"start": outcome.start, "versions_made": outcome.made, "stopped": outcome.stopped, **where}
    report = build_report(
        mode="train",
        env=plan.env.name,
        tasks=plan.tasks_text,
        groups=outcome.groups,
        settings=plan.describe(args),
        command=_command(),
        wall_s=outcome.wall_s,
        **extra,
    )
    write_report(report, outcome.groups, args.out)
    return report


async def _train(url: str, key: str | None, plan: EnvPlan, args: Namespace) -> Any:
    from tqdm import tqdm

    bar = tqdm(total=args.steps, desc="new versions", unit="version", file=sys.stderr, dynamic_ncols=True)
    tally = _Tally(bar)
    async with EnvClient(url, key) as client:
        runner = _runner(client, plan, trained=True, on_episode=tally.episode)
        if args.shuffle_rewards:  # the control: the same runs, each group's rewards permuted
            runner.shuffle = random.Random(args.seed)

        def version(made: int, served: str) -> None:
            bar.update(min(made, args.steps) - bar.n)
            bar.set_description(f"new versions (serving {served})")

        try:
            return await train(
                client, runner, plan.tasks, steps=args.steps, seed=args.seed, max_wall_s=args.max_wall_s,
                on_version=version, max_ahead=args.max_ahead,
            )  # fmt: skip
        finally:
            bar.close()


def _runner(
    client: EnvClient, plan: EnvPlan, trained: bool, on_episode: Callable[[EpisodeResult], None]
) -> Runner:
    """The group runner of `plan`; `trained` false posts evaluation episodes."""
    return Runner(
        client,
        plan.env,
        plan.settings,
        group_size=plan.group_size,
        concurrency=plan.concurrency,
        reward_fn=plan.reward_fn,
        train=trained,
        on_episode=on_episode,
    )


class _Tally:
    """Episodes so far and their success, shown on the progress bar."""

    def __init__(self, bar: Any) -> None:
        self.bar, self.done, self.right, self.dropped = bar, 0, 0, 0

    def episode(self, e: EpisodeResult) -> None:
        self.done += 1
        self.right += e.reward is not None and e.reward >= 1
        self.dropped += e.reward is None
        self.bar.set_postfix(
            episodes=self.done, success=f"{self.right / self.done:.0%}", dropped=self.dropped
        )


def run_eval(config: Any, args: Namespace) -> dict[str, Any]:
    """`clawrl envs eval`; returns the report, also written to --out."""
    if (args.run_dir is None) == (args.base_url is None):
        raise ValueError("give the run to measure with --run-dir, or a running server with --base-url")
    plan = make_plan(args)
    key = _api_key(config)
    groups: list[GroupResult] = []
    wall = 0.0
    if args.base_url is not None:
        found, wall = asyncio.run(_measure(args.base_url, key, plan, None))
        groups += found
        where: dict[str, Any] = {"base_url": args.base_url}
    else:
        for version in pick_versions(args.run_dir, args.versions):
            found, seconds = _serve_and_measure(config=config, args=args, plan=plan, key=key, version=version)
            groups += found
            wall += seconds
        where = {"run_dir": str(args.run_dir)}
    report = build_report(
        mode="eval",
        env=plan.env.name,
        tasks=plan.tasks_text,
        groups=groups,
        settings=plan.describe(args),
        command=_command(),
        wall_s=wall,
        **where,
    )
    write_report(report, groups, args.out)
    return report


def pick_versions(run_dir: Path, text: str | None) -> list[str]:
    """The versions to measure: `--versions`, else every version the canary gate did not hold."""
    from clawrl.store.db import Store, StoreError

    db = run_dir / "clawrl.db"
    if not db.is_file():
        raise EnvsError(f"no clawrl.db in {run_dir} (is it a clawrl run folder?)")
    try:
        with Store.open(db, readonly=True) as store:
            versions = store.versions()
    except StoreError as exc:
        raise EnvsError(str(exc)) from exc
    if text is None:
        return [v.name for v in versions if not v.held]
    names = [v.strip() for v in text.split(",") if v.strip()]
    missing = [n for n in names if n not in {v.name for v in versions}]
    if missing or not names:
        raise ValueError(f"--versions {text!r}: {run_dir} has {', '.join(v.name for v in versions)}")
    return names


def _serve_and_measure(
    config: Any, args: Namespace, plan: EnvPlan, key: str | None, version: str
) -> tuple[list[GroupResult], float]:
    from clawrl.launcher import ServerProcess

    with tempfile.TemporaryDirectory(prefix=f"clawrl-{version}-") as tmp:
        cfg = config.model_copy(update={"run_dir": args.out / "servers" / version}, deep=True)
        if version.rsplit("/", 1)[-1] != "v0":  # v0 (any user's) is the base: served as the run served it
            model = export_version(args.run_dir, version, Path(tmp) / "model")
            cfg.model = cfg.model.model_copy(update={"path": str(model)})
        print(f"clawrl envs: measuring {version} (served in {cfg.run_dir})", file=sys.stderr, flush=True)
        with ServerProcess.from_config(cfg, off=("train", "guard", "judge"), fresh=True) as server:
            return asyncio.run(_measure(server.url, key, plan, version))


def export_version(run_dir: Path, version: str, out: Path) -> Path:
    """`clawrl export --merged out --version version`: the version as a standalone model folder."""
    command = [sys.executable, "-m", "clawrl", "export", "--run-dir", str(run_dir), "--version", version]
    done = subprocess.run([*command, "--merged", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise EnvsError(f"exporting {version} of {run_dir} failed: {done.stderr.strip()[-500:]}")
    return out


async def _measure(
    url: str, key: str | None, plan: EnvPlan, label: str | None
) -> tuple[list[GroupResult], float]:
    """One greedy episode per task, posted as an evaluation episode (`train` false, never trained on);
    `label` names the version (a fresh server serving an exported version says v0)."""
    import time

    from tqdm import tqdm

    started = time.monotonic()
    bar = tqdm(
        total=len(plan.tasks), desc=f"episodes ({label or 'served'})", file=sys.stderr, dynamic_ncols=True
    )
    tally = _Tally(bar)

    def on_episode(e: EpisodeResult) -> None:
        bar.update(1)
        tally.episode(e)

    try:
        async with EnvClient(url, key) as client:
            await client.health()
            runner = _runner(client, plan, trained=False, on_episode=on_episode)
            groups = await run_all(runner, plan.tasks, groups_at_once(plan.concurrency, 1))
    finally:
        bar.close()
    if label is not None:
        for e in (e for g in groups for e in g.episodes):
            e.versions = [label for _ in e.versions]
    return groups, time.monotonic() - started
