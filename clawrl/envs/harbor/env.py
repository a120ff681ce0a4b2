"""`HarborEnv`: a Harbor task as a TRL environment (`environment_factory`) with one tool, `bash`.

    reset(task_dir=...)   a fresh episode folder: the task's files copied into workspace/
                          (mounted at the task's WORKDIR), an empty logs/ (mounted at /logs)
    bash(command)         the command in the sandbox, cwd the WORKDIR; its output (clipped) and
                          exit code come back; the episode's shell time is the task's
                          [agent] timeout_sec, summed over its commands
    get_reward()          the verifier: tests/ copied in and mounted read-only at /tests,
                          `bash /tests/test.sh` run in the same sandbox within [verifier]
                          timeout_sec; the reward is /logs/verifier/reward.txt (a number) or
                          reward.json ({"reward": x}), clipped to [0, 1]. No reward file, a
                          non-number, or a verifier that hangs: 0, with the reason in
                          `self.reward_reason` and the log. Then the episode folder is removed.

The task rows (`rows(root, split)`) carry `prompt` (instruction.md), `id` (the folder's
name) and `task_dir`. `replay_solution(env)` replays `solution/solve.sh` as the agent's one
command: `clawrl envs check` and the tests use it. `HarborSolutions` replays it through the
gateway instead, as a forced tool call the served model decodes under a grammar.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import types
import weakref
from pathlib import Path
from typing import Any

from clawrl.envs.errors import TaskError
from clawrl.envs.harbor.sandbox import Limits, Mount, Outcome, Sandbox, find_bwrap, give_to, new_uid
from clawrl.envs.harbor.task import HarborTask, load_task, load_tasks

log = logging.getLogger(__name__)

SPLITS = ("all", "train", "held_out")
HELD_OUT_EVERY = 5  # every 5th task by name is held out
COMMAND_WALL_S = 60.0  # one bash call's wall time (at most what is left of the agent's)
VERIFIER_MARGIN_S = 30.0  # the episode's reward timeout is the verifier's plus this


def rows(root: Path, split: str = "all") -> list[dict[str, Any]]:
    """The task rows of the Harbor folder `root` for `split` (refused folders are logged)."""
    if split not in SPLITS:
        raise TaskError(f"--split {split!r}: Harbor tasks have the splits {', '.join(SPLITS)}")
    tasks, refused = load_tasks(root)
    for folder, reason in refused:
        log.warning("harbor: task refused: %s", reason or folder)
    if split != "all":
        held = split == "held_out"
        tasks = [t for i, t in enumerate(tasks) if (i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1) == held]
    return [{"id": t.name, "prompt": t.instruction, "task_dir": str(t.path)} for t in tasks]


def reward_timeout_s(root: Path) -> float:
    """What the episode runner must allow reset() and get_reward() for these tasks."""
    tasks, _ = load_tasks(root)
    return max(t.verifier_timeout_s for t in tasks) + VERIFIER_MARGIN_S


class HarborEnv:
    """A Harbor task: a shell in a sandboxed copy of its workspace; its verifier is the reward."""

    def __init__(self) -> None:
        from clawrl.config import Config

        self._bwrap = find_bwrap(Config().cache_dir())
        self.task: HarborTask | None = None
        self.done = False
        self.reward_reason: str | None = None
        self._folder: Path | None = None
        self._sandbox: Sandbox | None = None
        self._agent_left_s = 0.0

    def reset(self, task_dir: str, **row: Any) -> str:
        self._close()
        self.task = load_task(Path(task_dir))
        self.done, self.reward_reason = False, None
        self._agent_left_s = self.task.agent_timeout_s
        uid = new_uid()
        self._folder = Path(tempfile.mkdtemp(prefix=f"clawrl-harbor-{self.task.name}-"))
        weakref.finalize(self, shutil.rmtree, self._folder, True)
        place_files(self.task, self._folder / "workspace")
        (self._folder / "logs" / "verifier").mkdir(parents=True)
        (self._folder / "logs" / "agent").mkdir()
        give_to(self._folder, uid)
        self._sandbox = Sandbox(self._bwrap, uid)
        for step in self.task.skipped:
            log.warning(
                "harbor %s: Dockerfile step not carried out (no container runtime): %s", self.task.name, step
            )
        return (
            f"\n\nYou are in a Linux shell at {self.task.workdir}. Use the bash tool to run commands; "
            "when the task is done, answer without a tool call."
        )

    def bash(self, command: str) -> str:
        """Run a bash command in the task's workspace and return its output and exit code.

        Args:
            command: The bash command line to run.
        """
        if self.task is None:
            return "error: no task (reset first)"
        if self._agent_left_s <= 0:
            self.done = True
            return f"error: the task's time ({self.task.agent_timeout_s:g} s of commands) is used up"
        limits = self._limits(min(COMMAND_WALL_S, self._agent_left_s))
        outcome = self._run(command, limits)
        self._agent_left_s -= outcome.seconds
        ended = f" ({outcome.reason})" if outcome.reason else ""
        code = "none" if outcome.exit_code is None else str(outcome.exit_code)
        return f"{outcome.output}\n[exit code {code}{ended}]"

    def get_reward(self) -> float:
        if self.task is None or self._folder is None:
            return 0.0
        try:
            reward, self.reward_reason = self._verify()
        finally:
            self._close()
        if self.reward_reason:
            log.warning("harbor %s: reward 0: %s", self.task.name, self.reward_reason)
        return reward

    def _verify(self) -> tuple[float, str | None]:
        """Run the verifier; (reward, why it is 0 or None)."""
        assert self.task is not None and self._folder is not None
        tests = self._folder / "tests"
        shutil.copytree(self.task.tests, tests, dirs_exist_ok=True)
        give_to(tests, self._sandbox.uid if self._sandbox else None)
        limits = self._limits(self.task.verifier_timeout_s)
        outcome = self._run("bash /tests/test.sh", limits, [Mount(tests, "/tests")])
        return read_reward(self._folder / "logs" / "verifier", outcome)

    def _limits(self, wall_s: float) -> Limits:
        assert self.task is not None
        return Limits(wall_s=wall_s, cpu_s=max(1, math.ceil(wall_s)), memory_mb=self.task.memory_mb)

    def _run(self, command: str, limits: Limits, more: list[Mount] | None = None) -> Outcome:
        assert self.task is not None and self._folder is not None and self._sandbox is not None
        mounts = [
            Mount(self._folder / "workspace", self.task.workdir, writable=True),
            Mount(self._folder / "logs", "/logs", writable=True),
            *(more or []),
        ]
        return self._sandbox.run(
            command=command, mounts=mounts, cwd=self.task.workdir, limits=limits, env=self.task.env
        )

    def _close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


class HarborSolutions(HarborEnv):
    """`--env harbor-solutions:PATH`: each task's reference solution as the agent's actions,
    through the gateway: the `bash` tool's schema allows one command only, the text of
    `solution/solve.sh` (a JSON-schema `const`), so a forced call (`--tool-choice bash`) is
    decoded by the served model under that grammar and recorded like any other turn; the
    episode ends after it (`done`) and the verifier scores it. It proves the whole harness
    (gateway, grammar, recorder, sandbox, verifier, rewards) without a model that can solve a
    task: every reward should be 1."""

    def reset(self, task_dir: str, **row: Any) -> str:
        observation = super().reset(task_dir, **row)
        assert self.task is not None
        if self.task.solution is None:
            raise TaskError(f"{self.task.path}: no solution/solve.sh to replay")
        solution = (self.task.solution / "solve.sh").read_text(encoding="utf-8")

        def bash(env: HarborSolutions, command: str) -> str:
            output = HarborEnv.bash(env, command)
            env.done = True
            return output

        bash.json_schema = {  # type: ignore[attr-defined]
            "name": "bash",
            "description": "Run the task's reference solution in its workspace.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "const": solution}},
                "required": ["command"],
                "additionalProperties": False,
            },
        }
        self.bash = types.MethodType(bash, self)  # type: ignore[method-assign]
        return observation


def replay_solution(env: HarborEnv) -> Outcome:
    """The reference solution as the agent's one command (solution/ mounted at /solution), after
    `env.reset(...)`: how `clawrl envs check` proves a task before an agent ever sees it."""
    task, folder = env.task, env._folder
    assert task is not None and folder is not None
    if task.solution is None:
        raise TaskError(f"{task.path}: no solution/solve.sh")
    solution = folder / "solution"
    shutil.copytree(task.solution, solution)
    give_to(solution, env._sandbox.uid if env._sandbox else None)
    return env._run(
        "bash /solution/solve.sh", env._limits(task.agent_timeout_s), [Mount(solution, "/solution")]
    )


def place_files(task: HarborTask, workspace: Path) -> None:
    """The Dockerfile's COPY lines carried out into a fresh workspace folder."""
    workspace.mkdir(parents=True)
    for copy in task.copies:
        dest = workspace / copy.dest
        if copy.source.is_dir():
            shutil.copytree(copy.source, dest, dirs_exist_ok=True, symlinks=True)
        elif copy.into:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(copy.source, dest / copy.source.name)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(copy.source, dest)


def read_reward(folder: Path, outcome: Outcome) -> tuple[float, str | None]:
    """The verifier's reward from reward.txt or reward.json; (0, why) when there is none."""
    ran = f"the verifier ended: {outcome.reason}" if outcome.reason else None
    text_file, json_file = folder / "reward.txt", folder / "reward.json"
    try:
        if text_file.is_file():
            value: Any = text_file.read_text(encoding="utf-8", errors="replace").strip()
            source = "reward.txt"
        elif json_file.is_file():
            data = json.loads(json_file.read_text(encoding="utf-8", errors="replace"))
            value = data.get("reward") if isinstance(data, dict) else None
            source = "reward.json"
        else:
            return (
                0.0,
                ran
                or f"the verifier wrote no reward (exit code {outcome.exit_code}): {outcome.output[-300:]}",
            )
        reward = float(value)
    except (OSError, ValueError, TypeError) as exc:
        return 0.0, f"the verifier's reward is not a number: {type(exc).__name__}: {exc}"
    if not math.isfinite(reward):
        return 0.0, f"the verifier's {source} is not a finite number: {value!r}"
    return min(1.0, max(0.0, reward)), ran
