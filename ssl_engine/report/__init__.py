"""The run report (report.png and a self-contained report.html in a run folder) and the
comparison of runs side by side, read from what run folders hold.

Above data, models, evaluation, optimizers and checkpoint, beside them: the run report hook,
tools/report.py and tools/compare_runs.py call it; it imports no hook, trainer or engine."""
import io
from pathlib import Path
from typing import Optional, Tuple

from ssl_engine.report.compare import comparison_figure, comparison_table
from ssl_engine.report.feature_map import MapPoints, feature_map, has_test_split
from ssl_engine.report.figure import pyplot, report_figure
from ssl_engine.report.html import write_html
from ssl_engine.report.run_folder import CONFIG_NAME, RunFolder, read_run_folder

PNG_NAME, HTML_NAME = "report.png", "report.html"
DPI = 90


def figure_png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    pyplot().close(fig)
    return buffer.getvalue()


def save_figure(fig, path) -> Path:
    """``fig`` as a PNG at ``path`` (then closed)."""
    path = Path(path)
    path.write_bytes(figure_png(fig))
    return path


def write_report(folder, points: Optional[MapPoints] = None) -> Tuple[Path, Path]:
    """Write report.png and report.html into run folder ``folder`` from what it holds (and the
    2-D map ``points`` when given); returns their paths."""
    run = read_run_folder(folder)
    png = figure_png(report_figure(run, points))
    png_path, html_path = run.folder / PNG_NAME, run.folder / HTML_NAME
    png_path.write_bytes(png)
    write_html(run, png, html_path)
    return png_path, html_path


__all__ = ["CONFIG_NAME", "HTML_NAME", "PNG_NAME", "MapPoints", "RunFolder",
           "comparison_figure", "comparison_table", "feature_map", "has_test_split",
           "read_run_folder", "report_figure", "save_figure", "write_report"]
