"""PNG charts of an evaluation and of a run's training history (matplotlib, Agg backend).

matplotlib is imported inside the functions: `clawrl --help` and the pure report code
never pay for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clawrl.eval.history import RunHistory, hint_rates


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _integer_steps(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_scores(report: dict[str, Any], path: Path) -> Path:
    """scores.png: held-out score against training step, one line per method."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, entry in report["methods"].items():
        ax.plot(entry["steps"], entry["scores"], marker="o", label=method)
    ax.set_xlabel("training step (versions past the start)")
    _integer_steps(ax)
    ax.set_ylabel(f"held-out score ({report['persona']})")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"persona {report['persona']}: {report['signal']}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_history(history: RunHistory, eval_entry: dict[str, Any] | None, path: Path) -> Path:
    """The run's training at a glance: reward per step, hint acceptance over time, eval scores."""
    plt = _pyplot()
    panels = 3 if eval_entry else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7, 3 * panels))
    _reward_panel(axes[0], history)
    _hint_panel(axes[1], history)
    if eval_entry:
        axes[2].plot(eval_entry["steps"], eval_entry["scores"], marker="o", color="tab:green")
        axes[2].set_xlabel("training step")
        _integer_steps(axes[2])
        axes[2].set_ylabel("held-out eval score")
        axes[2].set_ylim(-0.02, 1.02)
        axes[2].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _reward_panel(ax: Any, history: RunHistory) -> None:
    trained = [v for v in history.versions if v.step > 0 and v.mean_reward is not None]
    ax.plot([v.step for v in trained], [v.mean_reward for v in trained], marker="o", label="mean reward")
    ax.set_xlabel("training step")
    _integer_steps(ax)
    ax.set_ylabel("mean rl reward of the step's samples")
    ax.set_ylim(-1.05, 1.05)
    ax.grid(alpha=0.3)


def _hint_panel(ax: Any, history: RunHistory) -> None:
    rates = hint_rates(history)
    ax.plot([r.minutes for r in rates], [r.rate for r in rates], marker="o", color="tab:orange")
    ax.set_xlabel("minutes since the first judgment (one point per interval between versions)")
    ax.set_ylabel("share of judgments with a hint")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
