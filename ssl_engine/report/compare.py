"""Runs side by side: a table of what each run folder holds (method, epochs, wall time, final
loss, k-NN, low-shot, online probe) and one figure of their curves overlaid. Called by
tools/compare_runs.py and benchmarks/methods_digits.py."""
from typing import List, Optional, Sequence

import numpy as np

from ssl_engine.report.figure import no_data, pyplot, smooth
from ssl_engine.report.run_folder import PROBE_PREFIX, RunFolder

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
    if probes:  # the TEST split's accuracy (HOOKS.ONLINE_LINEAR_PROBE's rows) before others
        values = probes.get(PROBE_PREFIX) or next(iter(probes.values()))
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


def _loss_panel(ax, runs: Sequence[RunFolder]) -> None:
    ax.set_title("Training loss (smoothed)")
    drawn = False
    for index, run in enumerate(runs):
        loss = run.series("loss")
        if loss["x"]:
            ax.plot(loss["x"], smooth(loss["y"]), color=f"C{index % 10}",
                    label=f"{run.name} ({run.method()})")
            drawn = True
    if not drawn:
        return no_data(ax)
    if all(y > 0 for line in ax.get_lines() for y in line.get_ydata()):
        ax.set_yscale("log")  # the methods' losses differ in scale by orders of magnitude
    ax.set_xlabel("iteration (optimizer updates)")
    ax.set_ylabel("loss (log scale)" if ax.get_yscale() == "log" else "loss")
    ax.legend(fontsize=8)


def _epoch_curves(run: RunFolder):
    """The run's per-epoch accuracies on the TEST split: the online k-NN's and the online
    probe's (the probe's accuracy on its training batches is the run report's to show)."""
    probes = run.probe_per_epoch()
    probe = probes.get(PROBE_PREFIX) or next(iter(probes.values()), {})
    return [("k-NN", "-", run.knn_per_epoch()), ("online probe", "--", probe)]


def _accuracy_panel(ax, runs: Sequence[RunFolder]) -> None:
    ax.set_title("Accuracy per epoch")
    for index, run in enumerate(runs):
        for kind, style, values in _epoch_curves(run):
            if values:
                epochs = sorted(values)
                ax.plot([e + 1 for e in epochs], [values[e] for e in epochs], style,
                        marker="o", color=f"C{index % 10}", label=f"{run.name}: {kind}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.locator_params(axis="x", integer=True)
    ax.legend(fontsize=8)


REPORT_BARS = (("k-NN top-1", lambda entry: entry.get("knn_top1")),
               ("1-shot", lambda entry: (entry.get("low_shot") or {}).get("1", {}).get("mean")),
               ("5-shot", lambda entry: (entry.get("low_shot") or {}).get("5", {}).get("mean")))


def _feature_report_panel(ax, runs: Sequence[RunFolder]) -> None:
    """Grouped bars: the learned features' k-NN, 1-shot and 5-shot accuracy per run; the raw
    pixels' (of the first run with a report) as dashed lines."""
    ax.set_title("Feature report: learned features (dashed: raw pixels)")
    reported = [(run, run.feature_report()) for run in runs if run.feature_report()]
    width = 0.8 / len(REPORT_BARS)
    positions = np.arange(len(reported))
    for index, (label, value) in enumerate(REPORT_BARS):
        heights = [value(report.get("learned") or {}) or 0.0 for _, report in reported]
        bars = ax.bar(positions + (index - 1) * width, heights, width, color=f"C{index}",
                      label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
        raw = value(reported[0][1].get("raw_pixels") or {})
        if raw is not None:
            ax.axhline(raw, color=f"C{index}", linestyle="--", linewidth=1)
    crowded = len(reported) > 4
    ax.set_xticks(positions, [run.name for run, _ in reported], rotation=30 if crowded else 0,
                  ha="right" if crowded else "center")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 118)  # room above 100 % for the legend
    ax.set_yticks(range(0, 101, 20))
    ax.legend(fontsize=8, loc="upper center", ncols=len(REPORT_BARS))


def comparison_figure(runs: Sequence[RunFolder]):
    """The runs' curves overlaid, one colour per run: the training loss, the accuracy per epoch
    (online k-NN, probe) when a run has it, the feature report's bars when a run has one."""
    panels = [_loss_panel]
    if any(values for run in runs for _, _, values in _epoch_curves(run)):
        panels.append(_accuracy_panel)
    if any(run.feature_report() for run in runs):
        panels.append(_feature_report_panel)
    fig, axes = pyplot().subplots(1, len(panels), figsize=(7 * len(panels), 5.2),
                                  layout="constrained", squeeze=False)
    fig.suptitle(f"{len(runs)} runs compared", fontsize=13)
    for panel, ax in zip(panels, axes[0]):
        panel(ax, runs)
    return fig
