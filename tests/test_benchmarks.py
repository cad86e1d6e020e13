"""The scripts in benchmarks/, each run at tiny sizes, print the tables they exist for.

They call the engine's internals (model and data builders, the extraction loop, the sharded
optimizer, the launcher, metrics.json's records); a change of those breaks one of these tests
instead of the benchmark. Sizes here are far too small for the numbers to mean anything: the
tests check that every row is there and its numbers are real, not the targets.
"""
import importlib
import re
from pathlib import Path

import pytest
import torch
import yaml

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?"


@pytest.fixture
def load_benchmark(monkeypatch):
    """Import a script of benchmarks/ by its name (processes it spawns import it so too). It
    runs on one torch thread (tiny sizes gain nothing from more, and on a busy machine spinning
    threads cost many times the work); the suite's thread count is given back afterwards."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield importlib.import_module
    torch.set_num_threads(threads)


def row_numbers(text: str, label: str) -> list:
    """The numbers printed after ``label`` on the line that starts with it."""
    lines = [line for line in text.splitlines() if line.startswith(label)]
    assert len(lines) == 1, f"no single row {label!r} in:\n{text}"
    return [float(n.replace(",", "")) for n in re.findall(NUMBER, lines[0][len(label):])]


def test_transforms_speed_times_every_transform(load_benchmark, capsys):
    load_benchmark("transforms_speed").main(["--images", "2", "--rounds", "1", "--size", "32"])
    out = capsys.readouterr().out
    assert "2 images of 32x32, 1 thread, median of 1 rounds" in out
    for name in ("ImgPilColorDistortion(1.0), PIL", "ImgPilGaussianBlur(p=1), PIL filter",
                 "torchvision GaussianBlur(3), PIL in", "torchvision GaussianBlur(3), tensor in",
                 "engine GaussianBlur(3), PIL in", "RandomResizedCrop(32), PIL", "ToTensor"):
        [microseconds] = row_numbers(out, name)
        assert microseconds > 0, name


def test_multicrop_speed_compares_the_batch_with_its_groups(load_benchmark, capsys):
    load_benchmark("multicrop_speed").main([
        "--depth", "18", "--batch", "2", "--rounds", "1", "--global-crops", "2",
        "--local-crops", "2", "--global-size", "32", "--local-size", "16"])
    out = capsys.readouterr().out
    assert "ResNet-18, 2x32 + 2x16 crops of 2 images, fp32" in out
    ms = {name: row_numbers(out, name)[0]
          for name in ("multi-crop batch (trunk once per resolution)", "32 group alone",
                       "16 group alone", "trunk once per crop", "sum of the two groups alone")}
    assert all(value > 0 for value in ms.values()), ms
    assert abs(ms["sum of the two groups alone"]
               - ms["32 group alone"] - ms["16 group alone"]) <= 1, ms  # each rounded to 1 ms
    [ratio] = row_numbers(out, "multi-crop batch / sum of its groups:")
    assert ratio > 0


def test_multicrop_collate_ships_each_image_once(load_benchmark, capsys):
    result = load_benchmark("multicrop_collate").main(["--batch", "3", "--size", "32",
                                                       "--rounds", "1"])
    out = capsys.readouterr().out
    assert "batch 3 of 32-pixel images, 8 views each" in out
    (once_ms, once_mib), (copies_ms, copies_mib) = result.values()
    assert once_mib == pytest.approx(3 * 3 * 32 * 32 / 2 ** 20) and copies_mib == 8 * once_mib
    assert row_numbers(out, "each image once (shipped)") == [round(once_ms, 1), round(once_mib, 1)]
    [time_ratio, bytes_ratio] = row_numbers(out, "copies / once:")
    assert bytes_ratio == 8.0 and time_ratio == pytest.approx(copies_ms / once_ms, abs=0.006)


def test_scale_memory_shards_state_and_measures_checkpointing(load_benchmark, capsys):
    from ssl_engine.engines.launcher import find_free_port

    load_benchmark("scale_memory").main([
        "--batch", "1", "--image-size", "32", "--ckpt-batch", "1", "--ckpt-image-size", "32",
        "--ckpt-rounds", "1", "--port", str(find_free_port())])
    out = capsys.readouterr().out
    ddp, zero, fsdp = (row_numbers(out, mode + " ") for mode in ("ddp", "zero", "fsdp"))
    # columns: parameters, gradients, optimizer state, total (MiB per rank)
    assert all(value > 0 for value in ddp + zero + fsdp), out
    assert zero[:2] == ddp[:2] and zero[2] < ddp[2]  # ZeRO shards the optimizer state only
    assert all(f < d for f, d in zip(fsdp, ddp))  # FSDP shards all three
    peaks = re.search(rf"without checkpointing\s+({NUMBER}) MiB, with .*?\s+({NUMBER}) MiB", out)
    assert peaks and all(float(peak) > 0 for peak in peaks.groups()), out
    targets = re.findall(r"^(OK|MISSED) +(.+): (\d+\.\d+)x$", out, re.MULTILINE)
    assert [name.split(" ")[0] for _, name, _ in targets] == ["ZeRO", "FSDP", "activation"], out
    assert all(float(ratio) > 0 for _, _, ratio in targets)


def test_extract_memory_reports_peak_memory_and_throughput(load_benchmark, capsys):
    load_benchmark("extract_memory").main(["--sizes", "64", "128", "--procs", "1",
                                           "--throughput-size", "64", "--repeats", "1"])
    out = capsys.readouterr().out
    for size in (64, 128):  # each child asserted its features file holds size x 2048 rows
        features_mib, peak_mib, seconds, *growth = row_numbers(out, f"    1 {size:>8}")
        assert features_mib == pytest.approx(size * 2048 * 4 / 2**20, abs=0.05)
        assert peak_mib > 100 and seconds >= 0  # a process with torch holds > 100 MiB
        assert len(growth) == (2 if size == 128 else 0)
    assert re.search(r"worst -?\d+\.\d+ \(target <= 0.10\) (OK|MISSED)", out), out
    for name in ("bare no_grad forward", "extraction to disk"):
        seconds, images_per_second = row_numbers(out, name)
        assert images_per_second > 0
    assert re.search(r"extraction / bare = \d+\.\d+ \(target >= 0.9\)", out), out


def test_methods_digits_reports_a_recipe_beside_raw_pixels(load_benchmark, capsys, tmp_path):
    overrides = ["config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.DATA_LIMIT=128",
                 "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=64", "config.DATA.TEST.DATA_LIMIT=64"]
    code = load_benchmark("methods_digits").main(
        [*overrides, "--methods", "simclr", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert (tmp_path / "simclr/metrics.json").is_file()
    # kNN top-1, 1-shot mean, std, 5-shot mean, std[, 1-shot vs raw, wall s, img/s]
    simclr = row_numbers(out, "simclr  ")
    raw, random_init = row_numbers(out, "raw pixels"), row_numbers(out, "random init")
    assert len(simclr) == 8 and len(raw) == len(random_init) == 5, out
    for row in (simclr, raw, random_init):
        assert all(0 <= accuracy <= 100 for accuracy in (row[0], row[1], row[3])), out
    assert simclr[5] == pytest.approx(simclr[1] - raw[1], abs=0.02)
    assert simclr[6] > 0 and simclr[7] > 0  # wall time, training images per second
    assert (tmp_path / "methods_digits.png").read_bytes().startswith(b"\x89PNG")
    assert "online probe" in out  # the side-by-side table's header


def test_train_speed_compares_the_engine_with_the_bare_loop(load_benchmark, capsys):
    # two processes: the bare loop, then the engine from the command line
    assert load_benchmark("train_speed").main([
        "--workload", "resnet18", "--rounds", "1", "--iters", "2", "--warmup", "1",
        "--batch", "2", "--workers", "0", "--variants", "engine fp32"]) == 0
    table, parts = capsys.readouterr().out.split("HOOKS.PERF_STATS")
    assert "data-loading workers: 0 for every variant" in table
    bare_ms, bare_ratio, bare_to_fp32, _ = row_numbers(table, "bare fp32 ")
    engine_ms, ratio, to_fp32, startup = row_numbers(table, "engine fp32 ")
    assert bare_ms > 0 and engine_ms > 0 and startup > 0
    assert (bare_ratio, bare_to_fp32) == (1.0, 1.0)
    # the table prints whole milliseconds and ratios of the unrounded ones: the ratio lies
    # within what the rounded times allow, give or take the ratio's own rounding
    assert ratio == to_fp32
    low, high = (engine_ms - 0.5) / (bare_ms + 0.5), (engine_ms + 0.5) / (bare_ms - 0.5)
    assert low - 0.005 <= ratio <= high + 0.005, (ratio, engine_ms, bare_ms)
    # the engine's step in parts, from HOOKS.PERF_STATS's record in metrics.json
    parts = re.search(r"\nengine fp32 +(.*)\n", parts).group(1)
    for part in ("data", "forward", "loss", "backward", "optimizer", "hooks", "total"):
        assert re.search(rf"\b{part} \d+", parts), parts


def test_train_speed_on_gpu_runs_the_engine_on_one_gpu_in_bfloat16(load_benchmark, monkeypatch,
                                                                   tmp_path):
    """``--device gpu``'s engine command composes to a one-GPU run (CUDA faked: the config's
    checks only count the GPUs), its bf16 variant in bfloat16, not the GPU's float16."""
    from ssl_engine.config import load_config
    from ssl_engine.trainer.amp import amp_dtype

    speed = load_benchmark("train_speed")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for workload, variant, dtype in (("dino_vit_b16", "engine fp32", None),
                                     ("dino_vit_b16", "bf16 autocast", torch.bfloat16),
                                     ("mae_vit_b16", "bf16 autocast", torch.bfloat16)):
        args = speed.argparse.Namespace(workload=workload, batch=4, iters=3, workers=8,
                                        device="gpu")
        command = speed.engine_command(args, speed.VARIANTS[variant], tmp_path)
        _, cfg = load_config(command[2:])  # after python and tools/run_distributed_engines.py
        assert (cfg.MACHINE.DEVICE, cfg.DISTRIBUTED.BACKEND) == ("gpu", "nccl")
        assert (cfg.DISTRIBUTED.NUM_PROC_PER_NODE, cfg.DATA.NUM_DATALOADER_WORKERS) == (1, 8)
        assert cfg.MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM == 768
        assert amp_dtype(cfg.MODEL.AMP_PARAMS, "cuda") == dtype


def test_bare_loop_runs_in_bf16_with_channels_last(load_benchmark, capsys):
    load_benchmark("bare_simclr_loop").main(["--depth", "18", "--iters", "2", "--batch", "2",
                                             "--bf16", "--channels-last"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["iter", "1"], ["iter", "2"]]
    assert all(float(line.split()[2]) > 0 for line in lines)


def test_train_step_overhead_times_the_trainers_phase_loop(load_benchmark, capsys):
    load_benchmark("train_step_overhead").main(["--steps", "2", "--rounds", "1", "--batch", "4",
                                                "--image", "16"])
    out = capsys.readouterr().out
    bare, engine = row_numbers(out, "bare "), row_numbers(out, "engine ")
    assert len(bare) == len(engine) == 2 and min(bare + engine) > 0
    assert re.search(rf"engine/bare ratio: median {NUMBER}, best round {NUMBER}", out)


def test_bare_dino_loop_trains_a_tiny_vit_multicrop(load_benchmark, capsys):
    dino = load_benchmark("bare_dino_loop")
    dino.main(["--vit", "tiny", "--sizes", "32", "16", "--local-crops", "2", "--out-dim", "32",
               "--iters", "2", "--batch", "2", "--bf16"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["iter", "1"], ["iter", "2"]]
    assert all(float(line.split()[2]) > 0 for line in lines)
    # its loss against lightly's DINOLoss (teacher temperature 0.04, the same center)
    from lightly.loss import DINOLoss

    generator = torch.Generator().manual_seed(0)
    teacher, student, center = (torch.randn(rows, 32, generator=generator) for rows in (6, 12, 1))
    oracle = DINOLoss(output_dim=32, warmup_teacher_temp=0.04, teacher_temp=0.04)
    oracle.center.copy_(center.view(1, 1, 32))
    expected = oracle(list(teacher.chunk(2)), list(student.chunk(4)))
    assert dino.dino_loss(student, teacher, center, 2, 4) == pytest.approx(float(expected))


def write_fashion_idx(root, split, count, seed):
    """A tiny stand-in for Fashion-MNIST's gzipped IDX files: ``count`` images, as many of
    each of the 10 classes, each class a brighter band at its own rows."""
    import numpy as np
    from idx_utils import write_idx

    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 10
    images = rng.integers(0, 60, size=(count, 28, 28), dtype=np.uint8)
    for index, label in enumerate(labels):
        images[index, 2 * label:2 * label + 6] += 150
    write_idx(root / f"{split}-images-idx3-ubyte.gz", images)
    write_idx(root / f"{split}-labels-idx1-ubyte.gz", labels)


def test_fashion_mnist_scores_a_recipe_beside_raw_pixels(load_benchmark, capsys, tmp_path):
    root = tmp_path / "fashion"
    root.mkdir()
    write_fashion_idx(root, "train", 600, seed=0)  # 60 per class: the 1% draw's size
    write_fashion_idx(root, "t10k", 100, seed=1)
    load_benchmark("fashion_mnist").main([
        "--methods", "simclr", "--epochs", "1", "--data-root", str(root),
        "--out", str(tmp_path / "runs"),
        "--override", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=64"])
    table = capsys.readouterr().out.split("runs in")[-1]
    raw, engine = row_numbers(table, "raw pixels"), row_numbers(table, "simclr (engine)")
    assert len(raw) == 4 and len(engine) == 5  # k-NN, linear, 1%, its spread (, seconds)
    for knn, linear, one_percent, spread in (raw, engine[:4]):
        assert 0 <= min(knn, linear, one_percent) and max(knn, linear, one_percent) <= 100
        assert spread >= 0
    assert raw[0] > 90 and engine[-1] > 0  # the bands tell the classes apart; training took time
    assert (tmp_path / "runs" / "fashion_mnist.png").stat().st_size > 0
    run_config = yaml.safe_load((tmp_path / "runs" / "simclr" / "config.yaml").read_text())
    assert run_config["config"]["DATA"]["TRAIN"]["BATCHSIZE_PER_REPLICA"] == 64  # --override


def test_lightly_reference_trains_the_recipes_trunk_with_lightlys_parts(load_benchmark,
                                                                         tmp_path):
    """The reference loop builds the engine recipe's trunk, trains it one epoch with lightly's
    transforms, heads and loss (SimCLR and BYOL), and writes features of every image."""
    import numpy as np

    root = tmp_path / "fashion"
    root.mkdir()
    write_fashion_idx(root, "train", 512, seed=0)
    write_fashion_idx(root, "t10k", 20, seed=1)
    reference = load_benchmark("lightly_reference")
    for method in ("simclr", "byol"):
        out = tmp_path / method
        assert reference.main([method, "--data-root", str(root), "--out", str(out),
                               "--epochs", "1"]) == 0
        train = np.load(out / "train_features.npy")
        assert train.shape == (512, 128) and np.isfinite(train).all()  # res5 at 1/4 width
        assert np.load(out / "t10k_features.npy").shape == (20, 128)
        assert float((out / "train_seconds.txt").read_text()) > 0


def test_lightly_reference_reads_views_and_overrides_from_the_recipe(load_benchmark):
    """What the reference loop shares with the engine's run comes from the recipe, overrides
    included: the batch, and the crop scale and jitter strengths of lightly's views."""
    reference = load_benchmark("lightly_reference")
    views = ("config.DATA.TRAIN.TRANSFORMS=[{name:ImgReplicatePil,num_times:2},"
             "{name:RandomResizedCrop,size:28,scale:[0.55,1.0]},{name:RandomHorizontalFlip},"
             "{name:ColorJitter,brightness:0.25,contrast:0.35},"
             "{name:GaussianBlur,kernel_size:3,sigma:[0.1,1.0]},{name:ToTensor}]")
    cfg = reference.recipe("simclr", ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=64", views])
    assert cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA == 64
    transform, _, _ = reference.lightly_parts("simclr", cfg)
    ops = {type(op).__name__: op for op in transform.transforms[0].transform.transforms}
    crop, jitter = ops["RandomResizedCrop"], ops["RandomApply"].transforms[0]
    assert tuple(crop.scale) == (0.55, 1.0) and tuple(crop.size) == (28, 28)
    assert jitter.brightness == pytest.approx((0.75, 1.25))
    assert jitter.contrast == pytest.approx((0.65, 1.35))
