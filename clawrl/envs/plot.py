"""report.png of `clawrl envs train` / `eval`: success rate, mean reward, dropped groups and
episode length per policy version (matplotlib, Agg backend, imported inside the function)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clawrl.version_folder import version_rank


def plot_report(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = report["versions"]
    x = [version_rank(r["version"]) for r in rows]
    train = report["mode"] == "train"
    fig, axes = plt.subplots(3 if train else 2, 1, figsize=(7, 8 if train else 5.5), sharex=True)
    ax = axes[0]
    ax.plot(x, [r["success_rate"] for r in rows], marker="o", label="success rate")
    ax.plot(x, [r["mean_reward"] for r in rows], marker="s", linestyle="--", label="mean reward")
    ax.set_ylabel("per episode")
    ax.set_title(
        f"clawrl envs {report['mode']}: {report['env']}" + (" (greedy)" if not train else ""), fontsize=9
    )
    ax.legend(fontsize=8)
    axes[1].plot(x, [r["mean_turns"] for r in rows], marker="o", color="tab:purple", label="turns")
    axes[1].plot(x, [r["mean_tool_calls"] for r in rows], marker="s", color="tab:gray", label="tool calls")
    axes[1].set_ylabel("episode length")
    axes[1].legend(fontsize=8)
    if train:
        axes[2].bar(x, [r["groups_dropped"] for r in rows], color="tab:red", label="dropped")
        axes[2].bar(
            x, [r["groups_used"] for r in rows], bottom=[r["groups_dropped"] for r in rows], label="used"
        )
        axes[2].set_ylabel("groups")
        axes[2].legend(fontsize=8)
    for a in axes:
        a.grid(alpha=0.3)
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel("policy version (the one that made the episode's first answer)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
