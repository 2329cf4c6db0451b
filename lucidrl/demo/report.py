"""What the demo prints and writes at the end: the per-seed table, the verdict and the curves."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from lucidrl.demo.plan import SeedResult

# the demo's claim: held-out greedy accuracy at least this many points above the base model's, in every
# one of at least MIN_SEEDS distinct seeds
GOAL_POINTS, MIN_SEEDS = 20, 3


def points(acc: float) -> int:
    """An accuracy as whole points: n / n_val compared in integers (0.75 - 0.55 >= 0.20 is False in floats)."""
    return round(100 * acc)


def verdict(results: list[SeedResult]) -> dict:
    """The goal, seed by seed: held-out greedy accuracy >= GOAL_POINTS above the base in every seed."""
    per_seed = [
        {"seed": r.seed, "gain_points": points(r.final_acc) - points(r.base_acc)}
        for r in results
        if r.final_acc is not None and r.base_acc is not None
    ]
    seeds = len({r.seed for r in results})
    wins = sum(s["gain_points"] >= GOAL_POINTS for s in per_seed)
    return {
        "goal": f">= {GOAL_POINTS} points of held-out greedy accuracy over the base model, in {MIN_SEEDS} of "
        f"{MIN_SEEDS} distinct seeds",
        "seeds": seeds,
        "wins": wins,
        "met": seeds >= MIN_SEEDS and wins == len(results),
        "per_seed": per_seed,
    }


def results_table(results: list[SeedResult]) -> Table:
    table = Table(title="held-out greedy accuracy (problems no run trained on)")
    for name in ("seed", "base", "after GRPO", "gain", "steps", "time"):
        table.add_column(name, justify="right")
    for r in results:
        gain = points(r.final_acc) - points(r.base_acc) if None not in (r.final_acc, r.base_acc) else None
        table.add_row(
            str(r.seed),
            f"{r.base_acc:.2f}" if r.base_acc is not None else "-",
            f"{r.final_acc:.2f}" if r.final_acc is not None else "-",
            f"{gain:+d}" if gain is not None else "-",
            str(r.steps),
            f"{r.seconds:.0f} s",
        )
    return table


def draw_curves(results: list[SeedResult], path: Path) -> str | None:
    """demo_curves.png: training reward and held-out accuracy against steps, a line per seed. Returns why
    not, when matplotlib is missing (the `report` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return "matplotlib is not installed (pip install 'lucidrl[report]')"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        left.plot(
            [p["step"] for p in r.reward], [p["score"] for p in r.reward], marker=".", label=f"seed {r.seed}"
        )
        right.plot(
            [p["step"] for p in r.curve], [p["acc"] for p in r.curve], marker="o", label=f"seed {r.seed}"
        )
    left.set(title="training reward (mean verifier score)", xlabel="GRPO step", ylabel="score")
    right.set(title="held-out greedy accuracy", xlabel="GRPO step", ylabel="accuracy", ylim=(0, 1))
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
