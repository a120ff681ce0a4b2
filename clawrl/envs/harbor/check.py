"""`clawrl envs check --env harbor:PATH`: prove a task set before an agent sees it.

For each task, in a fresh sandboxed workspace each time: the reference solution
(`solution/solve.sh`) then the verifier, which must give 1; and the verifier on the untouched
workspace ("doing nothing"), which must give 0. One line per task:

    NAME  solution 1.00 (2.1 s)  nothing 0.00 (0.4 s)  [reason when either is wrong]

Exit status 0 when every solution scores 1 and doing nothing scores 0; 1 otherwise; 2 for a
set that cannot be loaded. Refused task folders are listed with their reasons and count as
failures.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from clawrl.envs.harbor.env import HarborEnv, replay_solution
from clawrl.envs.harbor.task import HarborTask, load_tasks


@dataclass(frozen=True)
class Checked:
    name: str
    solution: float | None  # None: the task has no solution/solve.sh
    solution_s: float
    nothing: float
    nothing_s: float
    reason: str | None

    @property
    def ok(self) -> bool:
        return self.solution == 1.0 and self.nothing == 0.0

    def line(self) -> str:
        solved = (
            "no solution"
            if self.solution is None
            else f"solution {self.solution:.2f} ({self.solution_s:.1f} s)"
        )
        text = f"{self.name:<32} {solved:<24} nothing {self.nothing:.2f} ({self.nothing_s:.1f} s)"
        return text if self.ok or not self.reason else f"{text}  {self.reason}"


def check_task(task: HarborTask) -> Checked:
    start = time.monotonic()
    solution, reasons = None, []
    if task.solution is not None:
        env = HarborEnv()
        env.reset(task_dir=str(task.path))
        outcome = replay_solution(env)
        solution = env.get_reward()
        if solution != 1.0:
            ran = f"solve.sh exit {outcome.exit_code}" + (f" ({outcome.reason})" if outcome.reason else "")
            reasons.append(f"{ran}; {env.reward_reason or 'reward below 1'}; {outcome.output[-200:].strip()}")
    else:
        reasons.append("no solution/solve.sh")
    solution_s = time.monotonic() - start
    start = time.monotonic()
    env = HarborEnv()
    env.reset(task_dir=str(task.path))
    nothing = env.get_reward()
    if nothing != 0.0:
        reasons.append(f"doing nothing scores {nothing:g}")
    return Checked(
        name=task.name,
        solution=solution,
        solution_s=solution_s,
        nothing=nothing,
        nothing_s=time.monotonic() - start,
        reason="; ".join(reasons) or None,
    )


def check(
    root: Path, concurrency: int = 2, names: list[str] | None = None
) -> tuple[list[Checked], list[tuple[Path, str]]]:
    """Every task under `root` (or those in `names`), `concurrency` at a time, in name order."""
    tasks, refused = load_tasks(root)
    if names:
        tasks = [t for t in tasks if t.name in names]
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(check_task, tasks)), refused


def cmd_check(root: Path, concurrency: int) -> int:
    start = time.monotonic()
    checked, refused = check(root, concurrency)
    for result in checked:
        print(result.line(), flush=True)
    for folder, reason in refused:
        print(f"{folder.name:<32} refused: {reason}")
    bad = [c for c in checked if not c.ok]
    print(
        f"clawrl envs check: {len(checked) - len(bad)} of {len(checked) + len(refused)} tasks pass "
        f"({len(refused)} refused) in {time.monotonic() - start:.0f} s"
    )
    return 1 if bad or refused else 0
