"""Draw loss and accuracy curves (`rocmtrain.views.curves`) into a PNG with matplotlib (the `plot` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rocmtrain.views.curves import Curves

DPI = 110


def draw_curves(curves: Sequence[Curves], path: Path, title: str = "Training curves") -> None:
    """Loss (training solid, evaluation dashed) and evaluation accuracy against the optimiser step."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (loss, accuracy) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=DPI, sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, job in enumerate(curves):
        colour = colours[i % len(colours)]
        if job.train_loss:
            loss.plot(*zip(*job.train_loss, strict=True), color=colour, label=f"{job.label} train")
        if job.eval_loss:
            loss.plot(*zip(*job.eval_loss, strict=True), "o--", color=colour, label=f"{job.label} eval")
        if job.eval_accuracy:
            accuracy.plot(*zip(*job.eval_accuracy, strict=True), "o-", color=colour, label=job.label)
    loss.set(title="Loss", xlabel="optimiser step", ylabel="loss")
    accuracy.set(title="Evaluation accuracy", xlabel="optimiser step", ylabel="accuracy", ylim=(0, 1.05))
    for axes in (loss, accuracy):
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
