"""The PNG of `bench.learning` (and `bench.warmstart`): one panel per series curve, trained vs control."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

PANELS = [("task_acceptance", "task acceptance"), ("solver_format_valid", "solver format-valid"),
          ("ranker_format_valid", "ranker format-valid"), ("proposer_reward", "proposer reward"),
          ("solver_reward", "solver reward"), ("mixed_groups", "mixed solver groups (share)")]


def _panel(ax: Any, arms: dict[str, dict], key: str, title: str) -> None:
    steps: list[int] = []
    plotted = False
    for arm, style in (("trained", "o-"), ("control", "s--")):
        series = (arms.get(arm) or {}).get("series") or {}
        ys = [float("nan") if y is None else y for y in series.get(key, [])]
        xs = series.get("steps", [])[:len(ys)]
        steps += xs
        plotted |= any(y == y for y in ys)
        ax.plot(xs, ys, style, label=arm)
    if not plotted:
        ax.text(0.5, 0.5, "no data (null every step)", ha="center", va="center", transform=ax.transAxes)
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)


def plot(arms: dict[str, dict], path: Path, title: str = "", panels: Sequence[tuple[str, str]] = PANELS) -> None:
    """One panel per curve of `panels` (series key, title; six at most), trained vs control (null: a gap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7), constrained_layout=True)
    for ax, (key, name) in zip(axes.flat, panels):
        _panel(ax, arms, key, name)
    axes.flat[0].legend()
    if title:
        fig.suptitle(title, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
