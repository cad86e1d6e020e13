"""The run report (HOOKS.RUN_REPORT, tools/report.py) and runs side by side
(tools/compare_runs.py), on one tiny run with a TEST split, the online k-NN and the feature
report, and on folders holding only part of a run."""
import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine_utils import QUICK, metrics, run_engine
from ssl_engine.config import ConfigError, load_config
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.hooks import RunReportHook
from ssl_engine.report import read_run_folder, report_figure
from ssl_engine.report.feature_map import sample_indices
from ssl_engine.report.figure import CURVE_TITLES, pyplot, smooth
from ssl_engine.trainer.default_hooks import default_hook_generator
from test_eval_hooks import HOOKS_ON, WITH_TEST_SPLIT

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import compare_runs  # noqa: E402
import report as report_tool  # noqa: E402

# no map at the end of this run (tests/test_quickstart.py has one): tools/report.py draws it
REPORT_ON = ["config.HOOKS.RUN_REPORT.ENABLED=true", "config.HOOKS.RUN_REPORT.MAX_SAMPLES=0"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run_report") / "run"
    run_engine(folder, WITH_TEST_SPLIT + HOOKS_ON + REPORT_ON)
    return folder


@pytest.fixture
def metrics_only(run, tmp_path):
    """A folder as a run killed mid-way before any checkpoint leaves it, made before the
    report existed: metrics.json only, its last line half-written."""
    folder = tmp_path / "killed"
    folder.mkdir()
    text = (run / "metrics.json").read_text()
    (folder / "metrics.json").write_text(text + text.splitlines()[0][:25])
    return folder


def axes_by_title(fig):
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_the_run_writes_its_report_and_names_it_in_the_log(run):
    log = (run / "log.txt").read_text()
    assert f"run report: {run / 'report.png'} and {run / 'report.html'}" in log
    png = (run / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    page = (run / "report.html").read_text()
    # self-contained: the figure itself as a data URI, nothing fetched, no script
    assert f"data:image/png;base64,{base64.b64encode(png).decode()}" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "LOSS:" in page and "simclr_info_nce_loss" in page  # the composed config
    assert str((run / "model_final_checkpoint_phase1.torch").resolve()) in page
    assert "config:" in (run / "config.yaml").read_text()


def test_figure_has_every_panel_with_the_runs_curves(run):
    rows = metrics(run)
    steps = [r for r in rows if r.get("phase") == "train"]
    folder = read_run_folder(run)
    fig = report_figure(folder)
    panels = axes_by_title(fig)
    assert set(CURVE_TITLES) <= {title.split(" (")[0] for title in panels}
    loss = panels["Loss"].get_lines()
    raw = [line for line in loss if line.get_alpha()]  # the faint raw curve under the smoothed
    assert [list(line.get_ydata()) for line in raw] in ([], [[r["loss"] for r in steps]])
    smoothed = [line for line in loss if line.get_label() == "loss (total)"][0]
    assert list(smoothed.get_xdata()) == [r["iteration"] for r in steps]
    assert np.allclose(smoothed.get_ydata(), smooth([r["loss"] for r in steps]))
    lr = panels["Learning rate and weight decay"].get_lines()[0]
    assert list(lr.get_ydata()) == pytest.approx([r["lr"] for r in steps])
    monitor = panels["Collapse monitor"].get_lines()
    assert [line.get_ydata()[0] for line in monitor if "warning" in line.get_label()] == [0.05]
    knn = [line for line in panels["Accuracy per epoch"].get_lines()
           if "k-NN" in line.get_label()][0]
    assert list(knn.get_ydata()) == [r["knn"]["top1"] for r in rows if "knn" in r]
    assert list(knn.get_xdata()) == [1, 2]
    pyplot().close(fig)


def test_map_of_the_test_split_beside_raw_pixels(run, tmp_path, monkeypatch):
    """tools/report.py on the run without its config.yaml (as a run made before it): the
    model rebuilt from the last checkpoint, 16 of the 20 TEST images on each map."""
    folder = tmp_path / "old"
    shutil.copytree(run, folder)
    (folder / "config.yaml").unlink()
    (folder / "report.png").unlink()
    drawn = []

    def write_report(folder, points=None):
        drawn.append(points)
        return write_report_of_the_package(folder, points)

    write_report_of_the_package = report_tool.write_report
    monkeypatch.setattr(report_tool, "write_report", write_report)
    assert report_tool.main([str(folder), "--max-samples", "16", "--device", "cpu"]) == 0
    assert (folder / "report.png").is_file() and (folder / "report.html").is_file()
    (points,) = drawn
    assert set(points.points) == {"learned", "raw_pixels"} and points.layer == "res5avg"
    for coords in points.points.values():
        assert coords.shape == (16, 2) and np.isfinite(coords).all()
    assert sorted(set(points.labels)) == [0, 1, 2, 3]
    assert list(sample_indices(20, 16)) == sorted(set(np.linspace(0, 19, 16).round().astype(int)))
    fig = report_figure(read_run_folder(folder), points)
    maps = [ax for title, ax in axes_by_title(fig).items() if title.startswith("t-SNE")]
    assert len(maps) == 2
    assert all(sum(len(c.get_offsets()) for c in ax.collections) == 16 for ax in maps)
    pyplot().close(fig)


def test_report_of_a_folder_with_only_metrics(metrics_only, capsys):
    assert report_tool.main([str(metrics_only)]) == 0
    assert "no feature map: no checkpoint in the folder" in capsys.readouterr().out
    page = (metrics_only / "report.html").read_text()
    assert "no checkpoint in the folder" in page and "no config.yaml" in page
    fig = report_figure(read_run_folder(metrics_only))
    assert axes_by_title(fig)["Loss"].get_lines()  # the curves are drawn
    pyplot().close(fig)
    assert report_tool.main([str(metrics_only / "missing")]) == 2


def test_compare_runs_table_and_picture(run, metrics_only, tmp_path, capsys):
    out = tmp_path / "runs.png"
    no_probe = tmp_path / "no_probe"  # the same rows without the probe's values
    no_probe.mkdir()

    def without_probe(row):
        return {key: without_probe(value) if isinstance(value, dict) else value
                for key, value in row.items() if not key.startswith("online_probe")}
    (no_probe / "metrics.json").write_text("".join(
        json.dumps(without_probe(row)) + "\n" for row in metrics(run)))
    assert compare_runs.main([str(run), str(metrics_only), str(no_probe), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "method", "epochs", "wall", "time", "final", "loss",
                                "k-NN", "top-1", "1-shot", "5-shot", "online", "probe"]
    rows = metrics(run)
    final = [r for r in rows if r.get("phase_end") == "train"][-1]["loss_avg"]
    report = [r["feature_report"] for r in rows if "feature_report" in r][0]["learned"]
    full, partial = lines[1].split(), lines[2].split()
    assert full[0] == "run" and full[1] == "simclr_info_nce_loss" and full[2] == "2"
    assert float(full[5]) == pytest.approx(final, abs=1e-4)
    assert float(full[6]) == pytest.approx(report["knn_top1"], abs=0.01)
    assert float(full[7]) == pytest.approx(report["low_shot"]["1"]["mean"], abs=0.01)
    probe = [r["online_probe"] for r in rows if "online_probe" in r][-1]  # TEST, last epoch
    assert float(full[-1]) == pytest.approx(probe["top1"], abs=0.01)
    assert partial[:2] == ["killed", "-"]  # no config: no method
    assert lines[3].split()[-1] == "-"  # no online probe
    assert out.read_bytes().startswith(b"\x89PNG")


def test_smooth_is_a_trailing_mean():
    values = [4.0, 2.0, 6.0, 0.0, 8.0]
    assert list(smooth(values, window=2)) == [4.0, 3.0, 4.0, 3.0, 4.0]
    assert list(smooth(values, window=1)) == values


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed")
def test_report_page_renders_in_a_headless_browser(run, tmp_path):
    shot = tmp_path / "page.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={shot}", "--window-size=1200,1600",
                    (run / "report.html").resolve().as_uri()],
                   capture_output=True, timeout=120, check=True)
    image = pyplot().imread(str(shot))
    assert image.shape[:2] == (1600, 1200)
    assert image[..., :3].std() > 0.05  # the page drew something, not a blank screen


def test_the_config_switches_the_report_and_refuses_a_bad_sample_count():
    _, cfg = load_config([QUICK])  # the test configs switch it off
    assert not any(isinstance(hook, RunReportHook) for hook in default_hook_generator(cfg))
    _, cfg = load_config([QUICK, "config.HOOKS.RUN_REPORT.ENABLED=true"])
    assert [type(hook) for hook in default_hook_generator(cfg)].count(RunReportHook) == 1
    _, cfg = load_config([QUICK, "config.HOOKS.RUN_REPORT.ENABLED=true",
                          "config.HOOKS.RUN_REPORT.MAX_SAMPLES=-1"])
    with pytest.raises(ConfigError, match=r"config\.HOOKS\.RUN_REPORT\.MAX_SAMPLES"):
        check_before_launch("train", cfg)
