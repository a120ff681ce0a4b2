"""What a sandboxed Harbor episode costs outside the model: start, commands, verifier, teardown.

Run: .venv/bin/python bench/sandbox.py [--sets terminal,repository] [--rounds 3] [--json PATH]

For every shipped task, `--rounds` times, in one process: `HarborEnv.reset` (a fresh episode
folder, the task's files copied, handed to the episode's user id), one `bash("true")` (a
sandbox started and torn down: the cost every agent command pays), the reference solution
(replayed as the agent's command), and `get_reward` (the verifier in the sandbox, then the
folder removed). The baseline, in the same run and alternating with it: the same
`/bin/bash -c true` as a plain subprocess, without the sandbox.

Printed: median milliseconds of each part, the sandbox's start cost as a ratio of the plain
subprocess, and the episodes per minute one core would manage with the model's time left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clawrl.envs.harbor.env import HarborEnv, replay_solution  # noqa: E402
from clawrl.envs.harbor.task import load_tasks  # noqa: E402
from clawrl.envs.shipped import HARBOR_SETS  # noqa: E402


def timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="terminal,repository")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    parts: dict[str, list[float]] = {
        k: [] for k in ("reset", "bash true", "solution", "verifier", "plain true")
    }
    rewards = []
    for name in args.sets.split(","):
        tasks, _ = load_tasks(HARBOR_SETS / name)
        for _ in range(args.rounds):
            for task in tasks:
                env = HarborEnv()
                _, ms = timed(lambda env=env, task=task: env.reset(task_dir=str(task.path)))
                parts["reset"].append(ms)
                said, ms = timed(lambda env=env: env.bash("true"))
                assert said.endswith("[exit code 0]"), said
                parts["bash true"].append(ms)
                _, ms = timed(lambda env=env: replay_solution(env))
                parts["solution"].append(ms)
                reward, ms = timed(env.get_reward)
                parts["verifier"].append(ms)
                rewards.append(reward)
                _, ms = timed(lambda: subprocess.run(["/bin/bash", "-c", "true"], check=True))
                parts["plain true"].append(ms)
    median = {k: statistics.median(v) for k, v in parts.items()}
    episode = median["reset"] + median["bash true"] + median["verifier"]
    report = {
        "episodes": len(rewards),
        "reward_mean": sum(rewards) / len(rewards),
        "median_ms": median,
        "sandbox_start_vs_plain": median["bash true"] / median["plain true"],
        "episode_overhead_ms": episode,
        "episodes_per_min_one_core_without_model": 60_000 / episode,
    }
    for key, ms in median.items():
        print(f"{key:<12} {ms:8.1f} ms (median of {len(parts[key])})")
    print(f"a sandboxed command vs a plain one: {report['sandbox_start_vs_plain']:.1f}x")
    print(f"an episode's own cost (reset + one command + verifier): {episode:.0f} ms")
    print(f"reference solutions: mean reward {report['reward_mean']:.3f} over {len(rewards)} episodes")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
