"""The report as one self-contained HTML page: the figure embedded as a base64 data URI, the
tables and the config as text; no network, no JavaScript."""
import base64
import html
import json
from pathlib import Path
from typing import List, Optional

import yaml

from ssl_engine.report.figure import feature_report_rows
from ssl_engine.report.run_folder import RunFolder

STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1700px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: right; }
td:first-child, th:first-child { text-align: left; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
"""


def html_table(rows: List[List[str]]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                   for row in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def summary_rows(run: RunFolder) -> List[List[str]]:
    """[["what", "value"], ...]: the run's method, progress, wall time and last values."""
    steps = run.train_steps()
    wall = run.wall_seconds()
    rows = [["run", run.name], ["method (LOSS.name)", run.method()],
            ["epochs done", str(run.epochs_done())],
            ["iterations", str(steps[-1]["iteration"]) if steps else "-"],
            ["wall time of the phases", "-" if wall is None else f"{wall:.1f} s"],
            ["last logged loss", f"{steps[-1]['loss']:.4f}"
             if steps and isinstance(steps[-1].get("loss"), (int, float)) else "-"]]
    rows += speed_rows(run)
    knn = run.knn_per_epoch()
    if knn:
        rows.append(["last online k-NN top-1", f"{knn[max(knn)]:.2f} %"])
    for name, values in run.probe_per_epoch().items():
        rows.append([f"last {name.replace('_', ' ')}", f"{values[max(values)]:.2f} %"])
    return rows


def speed_rows(run: RunFolder) -> List[List[str]]:
    """The FLOPs of a training iteration and the achieved TFLOP/s and MFU of the run's mean
    step time (metrics.json's rows of hooks/flops_hook.py and HOOKS.PERF_STATS), if written."""
    rows = []
    counted = [row for row in run.rows if "flops_per_iteration" in row]
    if counted:
        rows.append(["FLOPs per training iteration (one process)",
                     f"{counted[-1]['flops_per_iteration'] / 1e9:.4g} GFLOP"])
    timed = [row for row in run.rows if row.get("scope") == "run" and "tflops_per_sec" in row]
    if timed:
        mfu = timed[-1].get("mfu")
        rows.append(["achieved TFLOP/s at the mean step time",
                     f"{timed[-1]['tflops_per_sec']:.3g}" +
                     (f" (MFU {100 * mfu:.1f}%)" if mfu is not None else " (MFU: no peak known "
                      "for this device)")])
    return rows


def config_text(run: RunFolder) -> Optional[str]:
    if not run.config:
        return None
    return yaml.safe_dump({"config": json.loads(json.dumps(run.config, default=str))},
                          sort_keys=False, default_flow_style=None, width=100)


def report_html(run: RunFolder, png: bytes) -> str:
    """The page for ``run`` with ``png`` (the figure's bytes) embedded."""
    image = base64.b64encode(png).decode("ascii")
    title = f"Run report: {run.name}"
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{STYLE}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f"<p>Folder: <code>{html.escape(str(run.folder.resolve()))}</code></p>",
             html_table(summary_rows(run)),
             "<h2>Curves and evaluations</h2>",
             f"<img alt='run report figure' src='data:image/png;base64,{image}'>"]
    report = run.feature_report()
    parts.append("<h2>Feature report" + (f" (layer {html.escape(str(report.get('layer')))})"
                                        if report else "") + "</h2>")
    parts.append(html_table(feature_report_rows(report)) if report else "<p>no data</p>")
    parts.append("<h2>Checkpoints</h2>")
    if run.checkpoints:
        parts.append("<ul>" + "".join(f"<li><code>{html.escape(str(path.resolve()))}</code></li>"
                                      for path in run.checkpoints) + "</ul>")
    else:
        parts.append("<p>no checkpoint in the folder</p>")
    if run.log is not None:
        parts.append(f"<p>Log: <code>{html.escape(str(run.log.resolve()))}</code></p>")
    parts.append("<h2>Config</h2>")
    text = config_text(run)
    if text is None:
        parts.append("<p>no data (no config.yaml and no checkpoint with a config)</p>")
    else:
        parts.append(f"<p>From <code>{html.escape(run.config_source)}</code></p>"
                     f"<pre>{html.escape(text)}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(run: RunFolder, png: bytes, path: Path) -> None:
    Path(path).write_text(report_html(run, png), encoding="utf-8")
