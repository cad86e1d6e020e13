"""Resuming with other settings: another number of processes, batch size or number of epochs.

The runs train the tiny synthetic SimCLR config (32 images, 2 epochs, a cosine lr from 0.1 to
0.001), save a checkpoint after every iteration, and record on every rank the dataset indices
of each batch and the lr of each update. A resumed run starts from a copy of such a run cut
after one of its checkpoints (``stopped_after``)."""
import json
import math
from pathlib import Path

import pytest

from engine_utils import QUICK, run_engine, stopped_after
from ssl_engine.data.sampler import StatefulDistributedSampler
from ssl_engine.engines.launcher import main
from ssl_engine.hooks import SSLHook
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.utils.distributed import get_rank

SAMPLES = 32
EVERY_ITERATION = ["config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1", "config.SEED_VALUE=3"]


class RecordSteps(SSLHook):
    """Appends, after every train step, this rank's indices of the step's batches (every
    micro-batch), the epoch and the lr of the update to a file."""

    def __init__(self):
        super().__init__()
        self.indices = []

    def on_forward(self, task):
        if task.train:  # each index once (the collator repeats it for every view)
            self.indices += dict.fromkeys(task.last_batch["data_idx"].flatten().tolist())

    def on_step(self, task):
        if not task.train:
            return
        row = {"iteration": task.iteration, "epoch": task.phase["epoch"], "idx": self.indices,
               "lr": task.optimizer.get_lr()}
        self.indices = []
        with open(Path(task.checkpoint_folder) / f"steps_rank{get_rank()}.jsonl", "a") as out:
            out.write(json.dumps(row) + "\n")


class RecordingHooks:
    """A hook generator that pickles (for spawned processes)."""

    def __call__(self, cfg):
        return default_hook_generator(cfg) + [RecordSteps()]


def steps(folder: Path):
    """{rank: [rows]} recorded in ``folder``."""
    return {int(path.stem[len("steps_rank"):]): [json.loads(line) for line in
                                                 path.read_text().splitlines()]
            for path in sorted(Path(folder).glob("steps_rank*.jsonl"))}


def seen_in_epoch(folder: Path, epoch: int, after_iteration: int = 0):
    """The indices all ranks trained in ``epoch`` at updates after ``after_iteration``."""
    return [i for rows in steps(folder).values() for row in rows
            if row["epoch"] == epoch and row["iteration"] > after_iteration for i in row["idx"]]


def lr_by_iteration(folder: Path):
    return {row["iteration"]: row["lr"] for row in steps(folder)[0]}


def cosine(where: float) -> float:
    return 0.001 + (0.1 - 0.001) * (1 + math.cos(math.pi * where)) / 2


def train(folder: Path, *overrides):
    run_engine(folder, [*EVERY_ITERATION, *overrides], hook_generator=RecordingHooks())
    return folder


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """1 process, batch 8: 4 updates per epoch, 8 in all."""
    return train(tmp_path_factory.mktemp("one") / "run")


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """2 processes of batch 4, loader workers on: the same global batches as ``one_process``."""
    return train(tmp_path_factory.mktemp("two") / "run", "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
                 "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                 "config.DATA.NUM_DATALOADER_WORKERS=auto")


def resumed(run: Path, tmp_path: Path, checkpoint: str, *overrides) -> Path:
    folder = stopped_after(run, tmp_path / "resumed", checkpoint)
    before = {path: path.read_text() for path in folder.glob("steps_rank*.jsonl")}
    for path in before:  # the resumed run records its own steps
        path.unlink()
    train(folder, *overrides)
    return folder


def batches_in_order(folder: Path, epoch: int):
    """The global batches of ``epoch`` (all ranks' indices of each update), in order."""
    by_iteration = {}
    for rows in steps(folder).values():
        for row in rows:
            if row["epoch"] == epoch:
                by_iteration.setdefault(row["iteration"], []).extend(row["idx"])
    return [by_iteration[i] for i in sorted(by_iteration)]


def earlier_steps(run: Path, epoch: int, up_to_iteration: int):
    return [i for rows in steps(run).values() for row in rows
            if row["epoch"] == epoch and row["iteration"] <= up_to_iteration for i in row["idx"]]


@pytest.mark.parametrize("checkpoint,up_to,overrides", [
    ("model_iteration2.torch", 2, ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
                                   "config.DATA.NUM_DATALOADER_WORKERS=auto"]),  # 1 -> 2
    ("model_iteration1.torch", 1, ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16"]),  # 8 -> 16
    ("model_iteration2.torch", 2, ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4"]),  # 8 -> 4
    ("model_iteration2.torch", 2, ["config.OPTIMIZER.gradient_accumulation_steps=2"]),
])
def test_mid_epoch_resume_with_other_processes_or_batch_trains_each_sample_once(
        one_process, tmp_path, checkpoint, up_to, overrides):
    folder = resumed(one_process, tmp_path, checkpoint, *overrides)
    before = earlier_steps(one_process, 0, up_to)
    after = seen_in_epoch(folder, 0)
    assert sorted(before + after) == list(range(SAMPLES))  # nothing skipped, nothing twice
    order = [i for batch in batches_in_order(one_process, 0) for i in batch]
    position = len(before)
    for batch in batches_in_order(folder, 0):  # the uninterrupted run's order, from there on
        assert sorted(batch) == sorted(order[position:position + len(batch)])
        position += len(batch)
    assert sorted(seen_in_epoch(folder, 1)) == list(range(SAMPLES))  # and the next epoch whole


def test_two_to_one_process_mid_epoch_and_the_lr_follows_the_run(two_processes, tmp_path):
    folder = resumed(two_processes, tmp_path, "model_iteration1.torch",
                     "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4")  # 1 process of 4
    before = earlier_steps(two_processes, 0, 1)
    assert sorted(before + seen_in_epoch(folder, 0)) == list(range(SAMPLES))
    # 8 updates per epoch now, 16 in all; the 8 samples done are 2 of them, so the update
    # that ends as iteration n is update n - 1 of the 16 (n - 1 done before it)
    lrs = lr_by_iteration(folder)
    assert sorted(lrs) == list(range(2, 16))
    for iteration, lr in lrs.items():
        assert lr == pytest.approx(cosine(iteration / 16), rel=1e-6), iteration


def test_batch_8_to_16_at_an_epoch_end_continues_the_lr_curve(one_process, tmp_path):
    folder = resumed(one_process, tmp_path, "model_phase0.torch",
                     "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16")
    uninterrupted = lr_by_iteration(one_process)
    lrs = lr_by_iteration(folder)
    assert sorted(lrs) == [5, 6]  # 2 updates of 16 for the second epoch
    # update 4 + k at batch 16 is at the fraction of update 4 + 2k - 1 at batch 8
    for k in (1, 2):
        assert lrs[4 + k] == pytest.approx(uninterrupted[4 + 2 * k - 1], rel=1e-9)
    assert sorted(seen_in_epoch(folder, 1)) == list(range(SAMPLES))
    log = (folder / "log.txt").read_text()
    assert "resumed with other settings (batch per process 8 -> 16)" in log


@pytest.mark.parametrize("mode,expected", [
    ("rescale", lambda k: cosine((8 + k - 1) / 12)),  # the 3-epoch schedule from 2/3
    ("keep", lambda k: cosine(1 - 1e-12)),  # the old 2-epoch schedule's end value
])
def test_more_epochs_rescale_or_keep_the_schedule(one_process, tmp_path, mode, expected):
    folder = resumed(one_process, tmp_path, "model_final_checkpoint_phase1.torch",
                     "config.OPTIMIZER.num_epochs=3", f"config.CHECKPOINT.RESUME_SCHEDULE={mode}")
    lrs = lr_by_iteration(folder)
    assert sorted(lrs) == [9, 10, 11, 12]
    for k, iteration in enumerate(sorted(lrs), start=1):
        assert lrs[iteration] == pytest.approx(expected(k), rel=1e-6)


@pytest.mark.parametrize("checkpoint,epoch", [("model_iteration6.torch", "1.5"),
                                              ("model_phase0.torch", "1")])
def test_fewer_epochs_than_done_ends_before_launch_with_nothing_trained(
        one_process, tmp_path, capsys, checkpoint, epoch):
    folder = stopped_after(one_process, tmp_path / "resumed", checkpoint)
    files = sorted(path.name for path in folder.iterdir())
    code = main([QUICK, f"config.CHECKPOINT.DIR={folder}", "config.OPTIMIZER.num_epochs=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 0
    assert len(err) == 1 and err[0].startswith("nothing to train:")
    assert f"is at epoch {epoch} " in err[0] and "num_epochs=1" in err[0]
    assert sorted(path.name for path in folder.iterdir()) == files  # nothing written


@pytest.mark.parametrize("first,second", [((1, 8), (2, 8)), ((2, 8), (1, 8)),
                                          ((1, 8), (1, 16)), ((1, 8), (1, 4)),
                                          ((3, 5), (2, 7))])
@pytest.mark.parametrize("batches", [0, 1, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_continues_the_global_order_under_other_world_and_batch(first, second, batches,
                                                                        drop_last):
    """The indices of an epoch started with (world, batch) = ``first`` and continued after
    ``batches`` batches with ``second``: the epoch's global order, each index once (without
    drop_last, padding repeats the order's start only to fill the last round of ranks)."""
    size = 37

    def ranks(world, batch):
        return [StatefulDistributedSampler(size, batch, seed=2, rank=r, world_size=world,
                                           drop_last=drop_last) for r in range(world)]

    order = ranks(1, 1)[0].global_order()
    start = ranks(*first)
    taken = [i for s in start for i in s.rank_indices()[:batches * first[1]]]
    position = start[0].samples_consumed(batches)
    assert sorted(taken) == sorted(order[:position])
    rest = ranks(*second)
    for sampler in rest:
        sampler.set_start_sample(position)
    world = second[0]
    per_rank = [s.rank_indices() for s in rest]
    assert len({len(indices) for indices in per_rank}) == 1  # every rank as many samples
    continued = [per_rank[j % world][j // world] for j in range(world * len(per_rank[0]))]
    left = size - position if not drop_last else (size - position) // world * world
    assert continued[:left] == order[position:position + left]  # the same order, once
    assert continued[left:] == order[:len(continued) - left]  # padding: the order's start
    assert len(continued) - left < world  # to fill one round of the ranks at most
