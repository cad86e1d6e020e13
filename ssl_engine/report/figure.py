"""The report's picture: one matplotlib figure (headless Agg backend) of a run folder's curves,
evaluations and, when given, the 2-D map of its features. Each panel draws what the folder
holds and says "no data" where it holds nothing."""
from typing import Dict, List, Optional, Sequence

import numpy as np

from ssl_engine.optimizers.weight_decay import build_weight_decay_scheduler
from ssl_engine.report.feature_map import MapPoints
from ssl_engine.report.run_folder import RunFolder

CURVE_TITLES = ("Loss", "Learning rate and weight decay", "Throughput", "Collapse monitor",
                "Accuracy per epoch", "Feature report")
ROW_NAMES = {"learned": "learned", "random_init": "random init", "raw_pixels": "raw pixels"}
RAW_ALPHA = 0.25


def pyplot():
    """matplotlib's pyplot on the headless Agg backend."""
    # inside: 0.3 s to import, paid only by a process that draws (the hooks import this module)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def smooth(values: Sequence[float], window: Optional[int] = None) -> np.ndarray:
    """Trailing moving average over ``window`` points (a twentieth of the curve by default)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 3:
        return values
    window = window or max(1, len(values) // 20)
    sums = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (sums[1:] - sums[np.maximum(np.arange(1, len(values) + 1) - window, 0)]) / counts


def no_data(ax, what: str = "no data") -> None:
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="grey",
            fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_smoothed(ax, series: Dict[str, List[float]], label: str, color) -> None:
    """The raw curve faint, the smoothed one over it with the label."""
    x, y = series["x"], series["y"]
    if len(x) > 2:
        ax.plot(x, y, color=color, alpha=RAW_ALPHA, linewidth=0.8)
    ax.plot(x, smooth(y), color=color, linewidth=1.6, label=label)


def loss_panel(ax, run: RunFolder) -> None:
    ax.set_title("Loss")
    curves = [("loss (total)", run.series("loss"))]
    curves += [(term, run.series(term, "loss_terms")) for term in run.group_keys("loss_terms")]
    curves = [(label, series) for label, series in curves if series["x"]]
    if not curves:
        return no_data(ax)
    for index, (label, series) in enumerate(curves):
        plot_smoothed(ax, series, label, f"C{index}")
    ax.set_xlabel("iteration (optimizer updates)")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8, loc="upper right")


def weight_decay_curve(run: RunFolder, iterations: List[int]) -> Optional[List[float]]:
    """The weight decay at each iteration, from the config (its schedule, or the constant)."""
    optimizer = run.config.get("OPTIMIZER") or {}
    if "weight_decay" not in optimizer:
        return None
    try:
        schedule = build_weight_decay_scheduler(optimizer)
    except (ValueError, KeyError, TypeError):
        schedule = None
    if schedule is None:
        return [float(optimizer["weight_decay"])] * len(iterations)
    ends = run.phase_ends()
    per_epoch = ends[0]["iteration"] if ends and ends[0].get("iteration") else None
    epochs = optimizer.get("num_epochs")
    if not per_epoch or not epochs:
        return None
    total = per_epoch * int(epochs)
    # row i is logged after update i, made at where = (i - 1) / total
    return [float(schedule(min(max(i - 1, 0) / total, 1.0 - 1e-9))) for i in iterations]


def lr_panel(ax, run: RunFolder) -> None:
    ax.set_title("Learning rate and weight decay")
    lr = run.series("lr")
    if not lr["x"]:
        return no_data(ax)
    ax.plot(lr["x"], lr["y"], color="C0", label="learning rate")
    ax.set_xlabel("iteration (optimizer updates)")
    ax.set_ylabel("learning rate", color="C0")
    handles = ax.get_lines()
    wd = weight_decay_curve(run, lr["x"])
    if wd is not None:
        twin = ax.twinx()
        handles += twin.plot(lr["x"], wd, color="C3", linestyle="--", label="weight decay")
        twin.set_ylabel("weight decay", color="C3")
        if len(set(wd)) == 1:  # constant: centred, not an axis of rounding noise
            twin.set_ylim(0, 2 * wd[0] if wd[0] else 1)
        twin.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper right")


def throughput_panel(ax, run: RunFolder) -> None:
    ax.set_title("Throughput")
    series = run.series("images_per_sec")
    if not series["x"]:
        return no_data(ax)
    plot_smoothed(ax, series, "training images/s", "C2")
    ax.set_xlabel("iteration (optimizer updates)")
    ax.set_ylabel("images / s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")


def monitor_panel(ax, run: RunFolder) -> None:
    ax.set_title("Collapse monitor")
    keys = run.group_keys("monitor")
    if not keys:
        return no_data(ax)
    ax.set_xlabel("iteration (optimizer updates)")
    handles = []
    other = [key for key in keys if key != "embedding_std"]
    if "embedding_std" in keys:
        series = run.series("embedding_std", "monitor")
        ax.plot(series["x"], series["y"], color="C0", label="embedding std (x sqrt(dim))")
        level = (run.config.get("HOOKS", {}).get("COLLAPSE_MONITOR", {})
                 .get("MIN_EMBEDDING_STD"))
        if level is not None:
            ax.axhline(float(level), color="C3", linestyle=":",
                       label=f"warning level {float(level):g}")
        ax.set_ylabel("embedding std (1: spread, 0: collapsed)")
        ax.set_ylim(bottom=0)
        handles = ax.get_lines()
    target = ax.twinx() if "embedding_std" in keys and other else ax
    for index, key in enumerate(other):
        series = run.series(key, "monitor")
        handles += target.plot(series["x"], series["y"], color=f"C{index + 4}", label=key)
    if other:
        target.set_ylabel("entropy (fraction of log K)")
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="best")


# the online linear probe's series (HOOKS.ONLINE_LINEAR_PROBE): its TEST evaluation's rows and
# the mean of its accuracy on the training batches it learns from
PROBE_LABELS = {"online_probe": "online probe, TEST split",
                "online_probe_train_top1": "online probe, training batches"}


def accuracy_panel(ax, run: RunFolder) -> None:
    ax.set_title("Accuracy per epoch")
    curves = {PROBE_LABELS.get(name, name.replace("_", " ")): values
              for name, values in run.probe_per_epoch().items()}
    knn = run.knn_per_epoch()
    if knn:
        curves["online k-NN top-1"] = knn
    if not curves:
        return no_data(ax, "no data\n(online k-NN / probe not run)")
    for index, (label, values) in enumerate(curves.items()):
        epochs = sorted(values)
        ax.plot([e + 1 for e in epochs], [values[e] for e in epochs], marker="o",
                color=f"C{index}", label=label)
    ax.set_xlabel("epoch")
    ax.locator_params(axis="x", integer=True)
    ax.set_ylabel("top-1 accuracy (%)")
    ax.legend(fontsize=8, loc="lower right")


def feature_report_rows(report: dict) -> List[List[str]]:
    """[header, rows...] of the feature report: features, k-NN top-1 and each shot's mean±std."""
    shots = sorted({shot for name in ROW_NAMES if isinstance(report.get(name), dict)
                    for shot in report[name].get("low_shot", {})}, key=int)
    rows = [["features", "k-NN top-1 (%)"] + [f"{shot}-shot (%)" for shot in shots]]
    for name, label in ROW_NAMES.items():
        entry = report.get(name)
        if not isinstance(entry, dict):
            continue
        cells = [label, f"{entry.get('knn_top1', float('nan')):.1f}"]
        for shot in shots:
            stats = entry.get("low_shot", {}).get(shot, {})
            cells.append(f"{stats.get('mean', float('nan')):.1f} ± {stats.get('std', 0):.1f}")
        rows.append(cells)
    return rows


def feature_report_panel(ax, run: RunFolder) -> None:
    report = run.feature_report()
    ax.set_title("Feature report" + (f" (layer {report.get('layer')})" if report else ""))
    if not report:
        return no_data(ax, "no data\n(HOOKS.FEATURE_REPORT off)")
    ax.axis("off")
    rows = feature_report_rows(report)
    table = ax.table(cellText=rows[1:], colLabels=rows[0], loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1.0, 1.6)


def map_panel(ax, points: np.ndarray, labels: Optional[np.ndarray], title: str) -> None:
    ax.set_title(title)
    if labels is None:
        ax.scatter(points[:, 0], points[:, 1], s=10, color="C0")
    else:
        classes = np.unique(labels)
        cmap = pyplot().get_cmap("tab10" if len(classes) <= 10 else "tab20")
        for index, label in enumerate(classes):
            chosen = labels == label
            ax.scatter(points[chosen, 0], points[chosen, 1], s=10, color=cmap(index % cmap.N),
                       label=str(label))
        if len(classes) <= 20:
            ax.legend(title="label", fontsize=7, title_fontsize=8, markerscale=2,
                      loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("map axis 1")
    ax.set_ylabel("map axis 2")


def report_figure(run: RunFolder, feature_map: Optional[MapPoints] = None):
    """The report's figure: six panels of curves and evaluations, then the map when given."""
    rows = 3 if feature_map is not None else 2
    fig = pyplot().figure(figsize=(17, 4.6 * rows), layout="constrained")
    method = run.method() if run.config else "no config found"
    fig.suptitle(f"Run report: {run.name} ({method}, {run.epochs_done()} epochs done)",
                 fontsize=14)
    grid = fig.add_gridspec(rows, 6)
    panels = (loss_panel, lr_panel, throughput_panel, monitor_panel, accuracy_panel,
              feature_report_panel)
    for index, panel in enumerate(panels):
        ax = fig.add_subplot(grid[index // 3, (index % 3) * 2:(index % 3) * 2 + 2])
        ax.locator_params(axis="x", integer=True)
        panel(ax, run)
    if feature_map is not None:
        n = len(next(iter(feature_map.points.values())))
        names = {"learned": f"learned features ({feature_map.layer})", "raw_pixels": "raw pixels"}
        for col, (name, title) in enumerate(names.items()):
            if name in feature_map.points:
                map_panel(fig.add_subplot(grid[2, col * 3:col * 3 + 3]),
                          feature_map.points[name], feature_map.labels,
                          f"{feature_map.method} of the test split: {title}, {n} images")
    return fig
