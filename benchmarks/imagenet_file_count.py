"""The data path at ImageNet's file count: 1,000 class folders holding 1,281,167 files.

The files are hard links to 32 real JPEGs (crops of about 500x375 from the two photographs
scikit-learn ships; 32, since a file takes at most 65,000 links on ext4), so the folder costs
directory entries, not image bytes. Measured:

1. launch to first iteration: ``tools/run_distributed_engines.py`` on the folder (a tiny
   SimCLR, 2 processes, 2 workers each), from the command's start to the first training row of
   metrics.json; twice (the second run finds the folders in the kernel's cache: the engine keeps
   no listing cache of its own);
2. each data-loading worker's memory while it reads 20,000 samples: its private memory
   (/proc/<pid>/smaps_rollup, clean and dirty) after the first batch and its growth until
   20,000 samples are read, with the workers started as a rank starts them (from a forkserver
   that preloads the data modules), for the listing as the engine holds it
   (data/datasources/sample_table.py) and, beside it, as a Python list of (path, label) tuples
   (how it was held before);
3. the checkpoint's data-position state: its size in bytes, and a search of the whole
   checkpoint for anything as long as the data set (there must be none).

    python benchmarks/imagenet_file_count.py [--root /tmp/imagenet_links] [--keep]

Targets (issue "Real data at real size"): at most 60 s from launch to the first iteration;
worker memory flat (growth under 50 MB over 20,000 samples).
"""
import argparse
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
CLASSES, FILES = 1000, 1_281_167
READS = 20_000


def source_jpegs(folder: Path, count: int = 32):
    """``count`` JPEGs of 500x375 (or 375x500) cut from scikit-learn's two photographs."""
    import sklearn

    images = Path(sklearn.__file__).parent / "datasets" / "images"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        photo = Image.open(images / ("china.jpg", "flower.jpg")[index % 2]).convert("RGB")
        width, height = (500, 375) if index % 4 < 2 else (375, 500)
        width, height = min(width, photo.width), min(height, photo.height)
        left = (index * 41) % (photo.width - width + 1)
        top = (index * 29) % (photo.height - height + 1)
        path = folder / f"source_{index}.JPEG"
        photo.crop((left, top, left + width, top + height)).save(path, quality=90)
        paths.append(path)
    return paths


def make_tree(root: Path) -> float:
    """1,000 class folders with ImageNet's 1,281,167 training files as hard links; seconds."""
    start = time.perf_counter()
    sources = source_jpegs(root.parent / (root.name + "_sources"))
    marker = root / ".complete"
    if marker.exists():
        return 0.0
    per_class = [FILES // CLASSES + (index < FILES % CLASSES) for index in range(CLASSES)]
    for label, count in enumerate(per_class):
        folder = root / f"n{label:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            target = folder / f"n{label:08d}_{index}.JPEG"
            if not target.exists():
                os.link(sources[(label + index) % len(sources)], target)
        if label % 100 == 99:
            print(f"  {label + 1} class folders linked, {time.perf_counter() - start:.0f} s",
                  flush=True)
    marker.write_text("done")
    return time.perf_counter() - start


RUN_OVERRIDES = [
    "config=test/quick_simclr_synthetic", "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=32", "config.DATA.NUM_DATALOADER_WORKERS=2",
    "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.LOG_FREQUENCY=1",
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2",
]


def time_to_first_iteration(root: Path, out: Path, limit: float = 600.0):
    """(seconds from launch to the first training row of metrics.json, the checkpoint written
    after iteration 2 or None); the run is stopped there."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, str(REPO / "tools" / "run_distributed_engines.py"), *RUN_OVERRIDES,
               f"config.DATA.TRAIN.DATA_PATHS=[{root}]", f"config.CHECKPOINT.DIR={out}"]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    first = None
    try:
        while time.perf_counter() - start < limit and process.poll() is None:
            metrics = out / "metrics.json"
            if first is None and metrics.exists() and '"iteration"' in metrics.read_text():
                first = time.perf_counter() - start
            checkpoints = sorted(out.glob("model_iteration*.torch"))
            if first is not None and checkpoints:
                time.sleep(1.0)  # written atomically; let the rename land
                return first, checkpoints[-1]
            time.sleep(0.2)
        return first, None
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def find_long(value, length: int, where: str = "checkpoint"):
    """Paths inside ``value`` holding a sequence of at least ``length`` entries."""
    import torch

    found = []
    if isinstance(value, dict):
        for key, sub in value.items():
            found += find_long(sub, length, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        if len(value) >= length:
            found.append(f"{where} ({len(value)} entries)")
        for index, sub in enumerate(value[:100]):
            found += find_long(sub, length, f"{where}[{index}]")
    elif isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim and \
            max(value.shape) >= length:
        found.append(f"{where} {tuple(value.shape)}")
    return found


def find_key(value, key: str):
    if isinstance(value, dict):
        if key in value:
            return value[key]
        for sub in value.values():
            hit = find_key(sub, key)
            if hit is not None:
                return hit
    return None


def checkpoint_position(path: Path):
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    position = find_key(checkpoint, "position")
    return (len(pickle.dumps(position)), position, find_long(checkpoint, FILES // 2),
            path.stat().st_size)


def private_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("Private_"))


def worker_memory(root: Path, as_list: bool):
    """{worker pid: (KiB after the first batch, KiB after READS samples)} of the engine's data
    loader (2 workers, the tiny SimCLR's transforms) reading the folder in a shuffled order."""
    import ssl_engine.losses  # noqa: F401  (the config's derived settings)
    import ssl_engine.models  # noqa: F401  (the trunks')
    from ssl_engine.config import load_config
    from ssl_engine.data import build_dataloader, build_dataset

    _, cfg = load_config([*RUN_OVERRIDES[:-3], f"config.DATA.TRAIN.DATA_PATHS=[{root}]"])
    start = time.perf_counter()
    dataset = build_dataset(cfg, "TRAIN")
    listing = time.perf_counter() - start
    source = dataset.source
    if as_list:
        source.samples = list(source.samples)
    loader = build_dataloader(dataset, cfg.DATA.TRAIN, num_workers=2, pin_memory=False,
                              seed=0, epoch=0)
    iterator = iter(loader)
    next(iterator)
    pids = [worker.pid for worker in iterator._workers]
    first = {pid: private_kb(pid) for pid in pids}
    read = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    while read < READS:
        next(iterator)
        read += cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    last = {pid: private_kb(pid) for pid in pids}
    del iterator
    return listing, {pid: (first[pid], last[pid]) for pid in pids}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/imagenet_links/train")
    parser.add_argument("--keep", action="store_true", help="keep the folder of links")
    args = parser.parse_args(argv)
    import multiprocessing

    from ssl_engine.trainer.process import WORKER_SERVER_PRELOAD

    multiprocessing.set_start_method("forkserver", force=True)  # as a rank starts its workers
    multiprocessing.set_forkserver_preload(WORKER_SERVER_PRELOAD)
    root = Path(args.root)
    print(f"making {FILES:,} links in {CLASSES} class folders under {root} ...", flush=True)
    made = make_tree(root)
    print(f"tree ready ({made:.0f} s to make it)" if made else "tree already made", flush=True)
    out = Path("/tmp/imagenet_file_count_run")
    rows = []
    for attempt in ("first", "second"):
        seconds, checkpoint = time_to_first_iteration(root, out)
        rows.append((f"launch to first iteration ({attempt} run)",
                     f"{seconds:.1f} s" if seconds else "not reached"))
        print(rows[-1], flush=True)
    if checkpoint is not None:
        size, position, long_entries, file_size = checkpoint_position(checkpoint)
        rows.append(("checkpoint's position state", f"{size} bytes (pickled): "
                     f"{json.dumps(position, default=str)}"))
        rows.append(("entries as long as the data set in the checkpoint",
                     ", ".join(long_entries) or "none"))
        rows.append(("checkpoint file", f"{file_size / 1e6:.1f} MB (a tiny ResNet)"))
    for as_list in (False, True):
        listing, memory = worker_memory(root, as_list)
        kind = "Python list of tuples (before)" if as_list else "SampleTable (the engine)"
        rows.append((f"workers' private memory, {kind}",
                     ", ".join(f"{first / 1024:.0f} MB + {(last - first) / 1024:.1f} MB"
                               for first, last in memory.values())
                     + f" (after the first batch + growth over {READS:,} samples)"))
        print(rows[-1], flush=True)
    print(f"\n{'measure':<62} value")
    for name, value in rows:
        print(f"{name:<62} {value}")
    if not args.keep:
        shutil.rmtree(root.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
