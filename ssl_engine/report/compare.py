"""Runs side by side: a table of what each run folder holds (method, epochs, wall time, final
loss, k-NN, low-shot, online probe) and one figure of their curves overlaid. Called by
tools/compare_runs.py and benchmarks/methods_digits.py."""
from typing import List, Optional, Sequence

from ssl_engine.report.figure import no_data, pyplot, smooth
from ssl_engine.report.run_folder import RunFolder

COLUMNS = ("run", "method", "epochs", "wall time", "final loss", "k-NN top-1", "1-shot",
           "5-shot", "online probe")
MISSING = "-"


def _percent(value: Optional[float]) -> str:
    return MISSING if value is None else f"{value:.2f}"


def run_row(run: RunFolder) -> List[str]:
    """One row of COLUMNS for ``run``; "-" for what the folder does not hold. k-NN is the
    feature report's (learned features), else the last online k-NN evaluation's."""
    steps = run.train_steps()
    ends = run.phase_ends()
    final_loss = ends[-1].get("loss_avg") if ends else (steps[-1].get("loss") if steps else None)
    report = run.feature_report() or {}
    learned = report.get("learned") or {}
    knn = learned.get("knn_top1")
    if knn is None and run.knn_per_epoch():
        knn = run.knn_per_epoch()[max(run.knn_per_epoch())]
    shots = {shot: (learned.get("low_shot") or {}).get(shot, {}).get("mean") for shot in "15"}
    probes = run.probe_per_epoch()
    probe = None
    if probes:
        values = next(iter(probes.values()))
        probe = values[max(values)]
    wall = run.wall_seconds()
    return [run.name, run.method(), str(run.epochs_done()) if ends else MISSING,
            MISSING if wall is None else f"{wall:.0f} s" if wall >= 100 else f"{wall:.1f} s",
            MISSING if not isinstance(final_loss, (int, float)) else f"{final_loss:.4f}",
            _percent(knn), _percent(shots["1"]), _percent(shots["5"]), _percent(probe)]


def comparison_table(runs: Sequence[RunFolder]) -> str:
    """COLUMNS and one row per run, aligned (text: the first column left, numbers right)."""
    rows = [list(COLUMNS)] + [run_row(run) for run in runs]
    widths = [max(len(row[col]) for row in rows) for col in range(len(COLUMNS))]
    return "\n".join("  ".join([row[0].ljust(widths[0])] +
                               [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])])
                     for row in rows)


def comparison_figure(runs: Sequence[RunFolder]):
    """Loss over iterations and accuracy per epoch (k-NN, online probe) of every run, one
    colour per run."""
    fig, (loss_ax, acc_ax) = pyplot().subplots(1, 2, figsize=(14, 5), layout="constrained")
    fig.suptitle(f"{len(runs)} runs compared", fontsize=13)
    loss_ax.set_title("Training loss (smoothed)")
    acc_ax.set_title("Accuracy per epoch")
    drawn_loss = drawn_acc = False
    for index, run in enumerate(runs):
        color, label = f"C{index % 10}", f"{run.name} ({run.method()})"
        loss = run.series("loss")
        if loss["x"]:
            loss_ax.plot(loss["x"], smooth(loss["y"]), color=color, label=label)
            drawn_loss = True
        curves = [("k-NN", "-", run.knn_per_epoch())]
        curves += [("probe", "--", values) for values in run.probe_per_epoch().values()]
        for kind, style, values in curves:
            if values:
                epochs = sorted(values)
                acc_ax.plot([e + 1 for e in epochs], [values[e] for e in epochs], style,
                            marker="o", color=color, label=f"{label}: {kind}")
                drawn_acc = True
    if drawn_loss:
        loss_ax.set_xlabel("iteration (optimizer updates)")
        loss_ax.set_ylabel("loss")
        loss_ax.legend(fontsize=8)
    else:
        no_data(loss_ax)
    if drawn_acc:
        acc_ax.set_xlabel("epoch")
        acc_ax.set_ylabel("top-1 accuracy (%)")
        acc_ax.locator_params(axis="x", integer=True)
        acc_ax.legend(fontsize=8)
    else:
        no_data(acc_ax, "no data\n(no online k-NN or probe in these runs)")
    return fig
