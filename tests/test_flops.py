"""TFLOP/s and MFU in the log: the first training iteration's FLOPs counted, the achieved
TFLOP/s of each log line and of the run's mean step time, and the peak table."""
import json
import logging

import pytest
import torch

from engine_utils import run_engine
from ssl_engine.utils.peak_flops import PEAK_TFLOPS, known_device, precision_name


def test_a_run_logs_its_tflops(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        run_engine(tmp_path, ["config.LOG_FREQUENCY=1", "config.OPTIMIZER.num_epochs=1"])
    rows = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    [counted] = [row for row in rows if "flops_per_iteration" in row]
    flops = counted["flops_per_iteration"]
    assert flops > 1e6 and counted["peak_tflops"] is None  # a CPU: no peak, no MFU
    steps = [row for row in rows if row.get("phase") == "train" and "iteration" in row]
    assert steps and all("mfu" not in row for row in steps)
    for row in steps:  # each line: the counted FLOPs over its seconds per iteration
        assert row["tflops_per_sec"] == pytest.approx(flops / row["iteration_seconds"] / 1e12)
    [run] = [row for row in rows if row.get("scope") == "run"]
    assert run["tflops_per_sec"] == pytest.approx(
        flops / (run["step_time_ms"]["total"] / 1e3) / 1e12)
    lines = [r.getMessage() for r in caplog.records]
    assert any("TFLOP/s" in line and "| iter 1 " in line for line in lines)
    assert any(line.startswith("step time (mean") and "TFLOP/s" in line for line in lines)


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA GeForce RTX 4090", None)])
def test_the_peak_table_knows_the_gpus_by_name(name, key):
    assert known_device(name) == key


def test_peaks_are_dense_and_ordered():
    for peaks in PEAK_TFLOPS.values():
        assert peaks["bfloat16"] == peaks["float16"] == pytest.approx(2 * peaks["tf32"], rel=0.01)
        assert peaks["float32"] < peaks["tf32"]
    assert PEAK_TFLOPS["H100 SXM"]["bfloat16"] == 989.5  # 1,979 with sparsity, halved
    assert precision_name(torch.bfloat16) == "bfloat16"
    assert precision_name(None) == "float32"
