"""The experiment trackers (HOOKS.MLFLOW, HOOKS.WANDB) in their local modes: one tiny run with
both logs metrics.json's numbers, the config and the report files; a resumed run continues the
tracker's run; a tracker whose package is missing is refused before launch."""
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from engine_utils import QUICK, metrics, run_engine
from ssl_engine.config import ConfigError, load_config
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.hooks import SSLHook, register_hook
from ssl_engine.hooks.mlflow_hook import MlflowHook
from ssl_engine.hooks.wandb_hook import WandbHook
from ssl_engine.utils.distributed import is_primary

TINY = ["config.OPTIMIZER.num_epochs=1", "config.HOOKS.EXTRA_HOOKS=[test_report_files]"]


@register_hook("test_report_files")
class ReportFiles(SSLHook):
    """Writes a report.png and report.html at the end, as the run report does."""

    def __init__(self, cfg):
        self.folder = Path(cfg.CHECKPOINT.DIR)

    def on_end(self, task):
        if is_primary():
            (self.folder / "report.png").write_bytes(b"\x89PNG test")
            (self.folder / "report.html").write_text("<html>report</html>")


def series(rows, kind, value_key):
    """[(iteration, value)] of the metrics.json rows of one kind, e.g. ("phase", "train")."""
    return [(row["iteration"], row[value_key]) for row in rows
            if row.get(kind[0]) == kind[1]]


def same_series(got, expected) -> bool:
    """Whether two [(step, value)] lists have the same steps and (to float precision) values."""
    return [step for step, _ in got] == [step for step, _ in expected] and \
        [value for _, value in got] == pytest.approx([value for _, value in expected])


SYSTEM_TMP = Path("/tmp")
TRACKER_FILES = ("wandb", "mlflow", "mlruns")


@pytest.fixture(scope="module", autouse=True)
def nothing_left_in_the_system_temporary_folder():
    """After this module's runs, /tmp holds no new file of the trackers (W&B's offline and
    temporary folders, MLflow's store): everything they write stays in the tests' folders."""
    before = set(SYSTEM_TMP.iterdir())
    yield
    left = sorted(str(path) for path in set(SYSTEM_TMP.iterdir()) - before
                  if any(word in path.name.lower() for word in TRACKER_FILES))
    assert left == [], f"left in {SYSTEM_TMP}: {left}"


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One tiny run (4 iterations) with every tracker whose package is installed: (launch
    directory, the run's config). W&B is kept offline and away from ~/.netrc."""
    installed = [key for key, package in (("MLFLOW", "mlflow"), ("WANDB", "wandb"))
                 if importlib.util.find_spec(package) is not None]
    if not installed:
        pytest.skip("neither mlflow nor wandb is installed")
    root = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the default MLflow store is ./mlruns of the launch directory
        for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": root / "wandb_dir",
                            "WANDB_CONFIG_DIR": root / "wandb_config",
                            "WANDB_CACHE_DIR": root / "wandb_cache",
                            "WANDB_DATA_DIR": root / "wandb_data", "WANDB_SILENT": "true",
                            "NETRC": root / "no_netrc"}.items():
            patch.setenv(name, str(value))
        patch.delenv("WANDB_API_KEY", raising=False)
        yield root, run_engine(root / "run", [*TINY, *(f"config.HOOKS.{key}.ENABLED=true"
                                                     for key in installed)])


def test_mlflow_logs_metrics_json_config_and_files_and_resumes_its_run(tracked_run):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    tmp_path, cfg = tracked_run
    run_dir = tmp_path / "run"
    run_id = (run_dir / "mlflow_run_id.txt").read_text().strip()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    rows = metrics(run_dir)

    def history(name):
        return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, name),
                                                  key=lambda m: (m.step, m.timestamp))]

    losses = series(rows, ("phase", "train"), "loss")
    assert [step for step, _ in losses] == [2, 4]
    assert same_series(history("train/loss"), losses)
    assert same_series(history("train/lr"), series(rows, ("phase", "train"), "lr"))
    phase_ends = series(rows, ("phase_end", "train"), "loss_avg")
    assert len(phase_ends) == 1 and same_series(history("train_phase/loss_avg"), phase_ends)
    # the config: params with dotted keys (the first run's), and the composed YAML
    assert run.data.params["LOSS.name"] == "simclr_info_nce_loss"
    assert run.data.params["OPTIMIZER.num_epochs"] == "1"
    config = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml",
                                                           str(tmp_path))).read_text())
    assert config["OPTIMIZER"]["num_epochs"] == 1 and config["CHECKPOINT"]["DIR"] == str(run_dir)
    artifacts = {item.path for item in client.list_artifacts(run_id)}
    assert artifacts == {"config.yaml", "metrics.json", "report.png", "report.html"}
    kept = client.download_artifacts(run_id, "metrics.json", str(tmp_path / "dl"))
    assert Path(kept).read_text() == (run_dir / "metrics.json").read_text()
    # a run resumed from a checkpoint continues the same MLflow run; a new one starts another
    resumed = MlflowHook(cfg)
    resumed.on_start(SimpleNamespace(resume_position=(1, 0)))
    assert resumed.run_id == run_id and client.get_run(run_id).info.status == "RUNNING"
    resumed.on_exception(SimpleNamespace(stopping=True))
    assert client.get_run(run_id).info.status == "KILLED"
    fresh = MlflowHook(cfg)
    fresh.on_start(SimpleNamespace(resume_position=(0, 0)))
    assert fresh.run_id != run_id
    assert (run_dir / "mlflow_run_id.txt").read_text().strip() == fresh.run_id


def wandb_records(path: Path) -> list:
    """The records of an offline W&B run file (a LevelDB-style log: a 7-byte header, then
    32 KiB blocks of chunks, each with a 7-byte header: checksum, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if left < 7 or kind == 0:  # the zero padding at a block's end
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_logs_metrics_json_config_and_files(tracked_run):
    pytest.importorskip("wandb")
    run_dir, cfg = tracked_run[0] / "run", tracked_run[1]
    run_id = (run_dir / "wandb_run_id.txt").read_text().strip()
    [offline] = (run_dir / "wandb").glob(f"offline-run-*-{run_id}")
    records = wandb_records(offline / f"run-{run_id}.wandb")
    kinds = [record.WhichOneof("record_type") for record in records]
    assert "exit" in kinds and all(r.exit.exit_code == 0 for r in records if r.HasField("exit"))
    logged = [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
               for item in record.history.item} for record in records
              if record.HasField("history")]
    rows = metrics(run_dir)
    losses = series(rows, ("phase", "train"), "loss")
    assert len(losses) == 2 and same_series(
        [(h["iteration"], h["train/loss"]) for h in logged if "train/loss" in h], losses)
    assert same_series([(h["iteration"], h["train_phase/loss_avg"]) for h in logged
                        if "train_phase/loss_avg" in h],
                       series(rows, ("phase_end", "train"), "loss_avg"))
    config = {item.key: json.loads(item.value_json) for record in records
              for item in (record.run.config.update if record.HasField("run")
                           else record.config.update if record.HasField("config") else [])}
    assert config["OPTIMIZER"]["num_epochs"] == 1 and config["LOSS"]["name"] == \
        "simclr_info_nce_loss"
    for name in ("report.png", "report.html", "metrics.json"):
        assert (offline / "files" / name).read_bytes() == (run_dir / name).read_bytes()
    resumed = WandbHook(cfg)  # a run resumed from a checkpoint continues the same W&B run
    resumed.on_start(SimpleNamespace(resume_position=(1, 0)))
    assert resumed.run.id == run_id
    resumed.on_end(SimpleNamespace())


@pytest.mark.parametrize("package, key", [("mlflow", "MLFLOW"), ("wandb", "WANDB")])
def test_a_tracker_without_its_package_is_refused_before_launch(tmp_path, monkeypatch,
                                                                package, key):
    monkeypatch.setitem(sys.modules, package, None)  # as if it were not installed
    engine_name, cfg = load_config([QUICK, f"config.CHECKPOINT.DIR={tmp_path}",
                                    f"config.HOOKS.{key}.ENABLED=true"])
    with pytest.raises(ConfigError) as refusal:
        check_before_launch(engine_name, cfg)
    assert str(refusal.value) == (
        f"config.HOOKS.{key}.ENABLED=true needs the {package} package, which is not "
        f'installed: pip install -e ".[{package}]" (in a source checkout of ssl_engine) or '
        f"pip install {package}")
    check_before_launch(*load_config([QUICK, f"config.CHECKPOINT.DIR={tmp_path}"]))  # off: ok


@pytest.mark.parametrize("overrides, message", [
    (["config.HOOKS.WANDB.MODE=onlin"],
     r"^config.HOOKS.WANDB.MODE='onlin' is not one of offline, online, disabled$"),
    (["config.HOOKS.MLFLOW.ENABLED=true", "config.HOOKS.MLFLOW.EXPERIMENT_NAME=''"],
     r"^config.HOOKS.MLFLOW.EXPERIMENT_NAME is empty"),
])
def test_bad_tracker_settings_are_refused_before_launch(tmp_path, monkeypatch, overrides,
                                                         message):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # the settings are checked first
    engine_name, cfg = load_config([QUICK, f"config.CHECKPOINT.DIR={tmp_path}", *overrides])
    with pytest.raises(ConfigError, match=message):
        check_before_launch(engine_name, cfg)
