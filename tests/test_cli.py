"""The ``ssl-engine`` command, run in a subprocess as a user runs it, from a folder outside
the checkout: its help, its errors, and one short training run of the SimCLR digits
quickstart followed by extract, evaluate, report and compare on that run."""
import json
import subprocess
import sys
from pathlib import Path

from ssl_engine import cli

COMMAND = Path(sys.executable).parent / "ssl-engine"  # the console script pip installs
# the quickstart, cut to 64 images in batches of 32 for one epoch, without its end-of-run
# evaluations (about 12 s on 2 cores)
TINY_QUICKSTART = [
    "config.OPTIMIZER.num_epochs=1",
    "config.DATA.TRAIN.DATA_LIMIT=64",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=32",
    "config.HOOKS.FEATURE_REPORT.ENABLED=false",
    "config.HOOKS.RUN_REPORT.ENABLED=false",
    "config.HOOKS.ONLINE_LINEAR_PROBE.ENABLED=false",
    "config.MODEL.AMP_PARAMS.USE_AMP=false",
]
SMALL_EXTRACTION = ["config.DATA.TRAIN.DATA_LIMIT=200", "config.DATA.TEST.DATA_LIMIT=100",
                    "config.NEAREST_NEIGHBOR.TOPK=5"]


def ssl_engine(*args, cwd):
    assert COMMAND.is_file(), f"{COMMAND} is missing: pip install -e . installs it"
    return subprocess.run([str(COMMAND), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_help_lists_every_subcommand_on_one_line(tmp_path):
    proc = ssl_engine("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()
             if line.startswith("  ") and line.split()}
    assert list(lines) == ["train", "extract", "evaluate", "report", "compare", "export"]
    assert "k-NN" in lines["evaluate"] and "nearest_neighbor_test.py" in lines["evaluate"]
    proc = ssl_engine(cwd=tmp_path)  # no subcommand: the help, and a failing status
    assert proc.returncode == 2 and "usage: ssl-engine <subcommand>" in proc.stdout


def test_help_imports_no_torch():
    """The command's own module stays light: train forks its out-of-memory watcher before
    torch is imported, and --help answers at once."""
    code = ("import sys; from ssl_engine import cli; cli.main(['--help']); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_an_unknown_subcommand_is_one_line_naming_the_closest(tmp_path):
    proc = ssl_engine("trian", "config=quickstart/simclr_digits", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: unknown subcommand 'trian': did you mean 'train'? the subcommands are train, "
        "extract, evaluate, report, compare, export ('ssl-engine --help')"]


def test_a_subcommand_whose_script_is_missing_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUBCOMMANDS, "export",
                        cli.Subcommand("export a checkpoint", "no_such_tool.py"))
    assert cli.main(["export", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: ssl-engine export runs tools/no_such_tool.py, which is not there")


def test_train_extract_evaluate_report_compare_from_outside_the_checkout(tmp_path):
    run = tmp_path / "run"
    proc = ssl_engine("train", "config=quickstart/simclr_digits", f"config.CHECKPOINT.DIR={run}",
                      *TINY_QUICKSTART, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    checkpoint = run / "model_final_checkpoint_phase0.torch"
    assert checkpoint.is_file()
    steps = [json.loads(line) for line in (run / "metrics.json").read_text().splitlines()]
    assert [r["iteration"] for r in steps if "loss" in r and "phase" in r] == [2]

    features = tmp_path / "features"
    extraction = ["config=feature_extraction/extract_resnet_digits",
                  f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={checkpoint}",
                  f"config.CHECKPOINT.DIR={features}", *SMALL_EXTRACTION]
    proc = ssl_engine("extract", *extraction, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (features / "test_res5avg_features.npy").is_file()
    proc = ssl_engine("evaluate", *extraction, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reusing the extracted features" in proc.stdout and "top-1" in proc.stdout
    knn = [json.loads(line)["knn"] for line in (features / "metrics.json").read_text()
           .splitlines() if "knn" in json.loads(line)]
    assert len(knn) == 1 and 10 < knn[0]["top1"] <= 100  # above chance on the 10 digits

    proc = ssl_engine("report", run, "--no-map", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "report.png").stat().st_size > 0 and (run / "report.html").is_file()
    proc = ssl_engine("compare", run, run, "--out", "runs.png", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "runs.png").is_file() and proc.stdout.count("simclr") >= 2
    proc = ssl_engine("report", cwd=tmp_path)  # argparse's error, under the command's name
    assert proc.returncode == 2 and "usage: ssl-engine report" in proc.stderr


def test_export_runs_the_export_tool(tmp_path):
    proc = ssl_engine("export", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: ssl-engine export") and "--out" in proc.stdout
