"""benchmarks/gpu_suite.sh's CPU smoke test: the whole suite at tiny sizes, one table with a
row of numbers for every workload, side and precision."""
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NUMBER = r"\d+\.\d+"


def test_gpu_suite_prints_one_table_on_a_cpu(tmp_path):
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path), "PYTHON": sys.executable,
           "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["bash", "benchmarks/gpu_suite.sh"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    table = (tmp_path / "gpu_suite.txt").read_text()
    assert table.startswith("CPU, torch ")
    rows = [line for line in table.splitlines()[2:] if line.strip()]
    workloads = {"simclr_r50": 3, "dino_vit_s16": 2, "mae_vit_b16": 2}  # sides per precision
    assert len(rows) == 2 * sum(workloads.values()), table
    for line in rows:
        workload, rest = line.split(maxsplit=1)
        assert workload in workloads, line
        # ms/iter, ratio, img/s; MFU "-" and peak memory "-" on a CPU; the data share in %
        assert re.search(rf"(fp32|bf16)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+-\s+{NUMBER}%\s+-$",
                         line), line
    bare = [line for line in rows if " bare " in line]
    assert len(bare) == 6 and all(re.search(r"\s1\.00\s", line) for line in bare)
