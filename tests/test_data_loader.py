"""Per-sample determinism, the resumable distributed sampler, collators and the data loader."""
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from gloo_utils import spawn_ranks
from ssl_engine.data import (
    StatefulDistributedSampler,
    build_collator,
    build_dataloader,
    build_dataset,
)
from ssl_engine.utils.registry import UnknownNameError
from test_data_sources import make_cfg

SIMCLR_TRANSFORMS = [
    {"name": "ImgReplicatePil", "num_times": 2},
    {"name": "RandomResizedCrop", "size": 6},
    {"name": "ImgPilColorDistortion", "strength": 1.0},
    {"name": "ToTensor"},
]


def simclr_cfg(num_samples=16, batch=4, seed=7):
    cfg = make_cfg(
        DATA_SOURCES=["synthetic"],
        SYNTHETIC={"NUM_SAMPLES": num_samples, "IMAGE_SIZE": 8, "NUM_CLASSES": 3},
        TRANSFORMS=SIMCLR_TRANSFORMS,
        COLLATE_FUNCTION="simclr_collator",
        BATCHSIZE_PER_REPLICA=batch,
    )
    cfg.SEED_VALUE = seed
    return cfg


def rng_states():
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def assert_same_rng_states(a, b):
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def batches_of(loader):
    return [batch for batch in loader]


def assert_same_batches(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


# ---- dataset determinism ---------------------------------------------------------------------


def test_sample_format():
    sample = build_dataset(simclr_cfg(), "TRAIN")[5]
    assert sample["data_idx"] == 5 and sample["data_valid"] is True
    assert sample["label"] == [5 % 3, 5 % 3]
    assert [tuple(v.shape) for v in sample["data"]] == [(3, 6, 6), (3, 6, 6)]


def test_augmentation_is_a_function_of_seed_epoch_and_index():
    dataset = build_dataset(simclr_cfg(), "TRAIN")
    first = dataset[3]["data"]
    torch.manual_seed(123)  # the caller's random state must not matter
    again = build_dataset(simclr_cfg(), "TRAIN")[3]["data"]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], first[1])
    dataset.set_epoch(1)
    assert not torch.equal(dataset[3]["data"][0], first[0])
    dataset.set_epoch(0)
    assert torch.equal(dataset[3]["data"][0], first[0])
    other_seed = build_dataset(simclr_cfg(seed=8), "TRAIN")[3]["data"]
    assert not torch.equal(other_seed[0], first[0])


def test_loading_leaves_the_global_random_state_untouched():
    dataset = build_dataset(simclr_cfg(), "TRAIN")
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    before = rng_states()
    dataset[2]
    batches_of(build_dataloader(dataset, simclr_cfg().DATA.TRAIN, 0, pin_memory=False, epoch=1))
    assert_same_rng_states(before, rng_states())


def test_workers_do_not_change_batches():
    cfg = simclr_cfg()
    dataset = build_dataset(cfg, "TRAIN")
    in_main = batches_of(build_dataloader(dataset, cfg.DATA.TRAIN, 0, False, epoch=2))
    in_workers = batches_of(build_dataloader(dataset, cfg.DATA.TRAIN, 2, False, epoch=2))
    assert len(in_main) == 4
    assert_same_batches(in_main, in_workers)


def test_resume_mid_epoch_gives_the_remaining_batches():
    cfg = simclr_cfg()
    dataset = build_dataset(cfg, "TRAIN")
    full = batches_of(build_dataloader(dataset, cfg.DATA.TRAIN, 0, False, epoch=1, seed=5))
    resumed = build_dataloader(dataset, cfg.DATA.TRAIN, 0, False, epoch=1, seed=5,  # 3 batches
                               start_sample=3 * cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    assert len(resumed) == 1
    assert_same_batches(full[3:], batches_of(resumed))
    next_epoch = batches_of(build_dataloader(dataset, cfg.DATA.TRAIN, 0, False, epoch=2, seed=5))
    assert not torch.equal(next_epoch[0]["data_idx"], full[0]["data_idx"])


def test_two_ranks_together_load_the_one_process_batch():
    one = simclr_cfg(batch=8)
    dataset = build_dataset(one, "TRAIN")
    single = batches_of(build_dataloader(dataset, one.DATA.TRAIN, 0, False, epoch=0))
    per_rank = []
    for rank in range(2):
        sampler = StatefulDistributedSampler(16, 4, seed=0, rank=rank, world_size=2)
        collate = build_collator("simclr_collator")
        indices = list(sampler)
        batches = [indices[t * 4 : (t + 1) * 4] for t in range(2)]
        per_rank.append([collate([dataset[i] for i in batch]) for batch in batches])
    for t, batch in enumerate(single):
        rows = {}
        for rank_batch in (per_rank[0][t], per_rank[1][t]):
            for row, idx in enumerate(rank_batch["data_idx"].tolist()):
                rows.setdefault(idx, []).append(rank_batch["input"][row])
        assert sorted(rows) == sorted(set(batch["data_idx"].tolist()))
        for row, idx in enumerate(batch["data_idx"].tolist()):
            assert any(torch.equal(batch["input"][row], other) for other in rows[idx])


# ---- sampler ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size,world", [(10, 2), (7, 3), (5, 2), (2, 4)])
def test_sampler_matches_torch_distributed_sampler(size, world):
    for rank in range(world):
        ours = StatefulDistributedSampler(size, 2, seed=4, rank=rank, world_size=world)
        reference = DistributedSampler(range(size), num_replicas=world, rank=rank, seed=4)
        for epoch in (0, 3):
            ours.set_epoch(epoch)
            reference.set_epoch(epoch)
            assert list(ours) == list(reference)
            assert len(ours) == len(reference)


def test_sampler_partition_padding_and_drop_last():
    permutation = torch.randperm(5, generator=torch.Generator().manual_seed(0)).tolist()
    ranks = [list(StatefulDistributedSampler(5, 1, rank=r, world_size=2)) for r in range(2)]
    assert ranks == [permutation[0::2], permutation[1::2] + [permutation[0]]]
    dropped = [
        list(StatefulDistributedSampler(5, 1, drop_last=True, rank=r, world_size=2))
        for r in range(2)
    ]
    assert dropped == [permutation[0:4:2], permutation[1:4:2]]
    in_order = list(StatefulDistributedSampler(5, 1, shuffle=False, rank=1, world_size=2))
    assert in_order == [1, 3, 0]


def test_sampler_start_iter_skips_whole_batches():
    sampler = StatefulDistributedSampler(20, 3, seed=1, rank=1, world_size=2)
    sampler.set_epoch(2)
    everything = list(sampler)
    assert len(everything) == 10
    sampler.set_start_iter(2)
    assert list(sampler) == everything[6:] and len(sampler) == 4
    sampler.set_start_iter(4)
    assert list(sampler) == [] and len(sampler) == 0


def _sampler_in_process_group(rank, world_size, init_file, folder):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        sampler = StatefulDistributedSampler(9, 2, seed=3)
        sampler.set_epoch(1)
        torch.save(list(sampler), f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_sampler_reads_rank_and_world_from_the_process_group(tmp_path):
    spawn_ranks(_sampler_in_process_group, 2, tmp_path, lambda init: (2, init, str(tmp_path)))
    for rank in range(2):
        expected = StatefulDistributedSampler(9, 2, seed=3, rank=rank, world_size=2)
        expected.set_epoch(1)
        assert torch.load(tmp_path / f"rank{rank}.pt") == list(expected)


# ---- collators -------------------------------------------------------------------------------


def labelled_samples(num_samples, shapes):
    """Sample b's view v is filled with 10*b + v; its label is 100 + b; data_idx 50 + b."""
    return [
        {
            "data": [torch.full((1, *shape), 10.0 * b + v) for v, shape in enumerate(shapes)],
            "label": [100 + b] * len(shapes),
            "data_idx": 50 + b,
            "data_valid": True,
        }
        for b in range(num_samples)
    ]


def test_default_collator_stacks_one_view():
    batch = build_collator("default")(labelled_samples(3, [(2, 2)]))
    assert batch["input"].shape == (3, 1, 2, 2)
    assert batch["input"][:, 0, 0, 0].tolist() == [0.0, 10.0, 20.0]
    assert batch["target"].tolist() == [100, 101, 102] and batch["target"].dtype == torch.long
    assert batch["data_idx"].tolist() == [50, 51, 52]
    assert batch["data_valid"].dtype == torch.bool and batch["data_valid"].all()
    with pytest.raises(ValueError, match="one view per sample, got 2: use simclr_collator"):
        build_collator("default")(labelled_samples(3, [(2, 2), (2, 2)]))


def test_vissl_collator_names_and_siamese_collator():
    samples = labelled_samples(3, [(2, 2)])
    assert_same_batches([build_collator("default_collate")(samples)],
                        [build_collator("default")(samples)])
    tiled = labelled_samples(2, [(4, 1, 2, 2)])  # 4 tiles of [1, 2, 2] per sample
    for b, sample in enumerate(tiled):
        sample["data"][0] = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 1, 2, 2) + 10 * b
    batch = build_collator("siamese_collator")(tiled)
    assert batch["input"].shape == (8, 1, 2, 2)
    assert batch["input"][:, 0, 0, 0].tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    assert batch["target"].tolist() == [100, 101] and batch["data_idx"].tolist() == [50, 51]
    with pytest.raises(ValueError, match="siamese_collator takes one view per sample"):
        build_collator("siamese_collator")(labelled_samples(2, [(2, 2)]))


def test_label_type_zero_and_rotation_labels():
    cfg = make_cfg(DATA_SOURCES=["synthetic"], LABEL_TYPE="zero",
                   SYNTHETIC={"NUM_SAMPLES": 4, "IMAGE_SIZE": 8, "NUM_CLASSES": 3},
                   TRANSFORMS=[{"name": "ToTensor"}])
    assert {build_dataset(cfg, "TRAIN")[i]["label"][0] for i in range(4)} == {0}
    cfg.DATA.TRAIN.TRANSFORMS = [{"name": "ImgReplicatePil", "num_times": 4},
                                 {"name": "ImgRotatePil", "num_angles": 4}]
    labels = [build_dataset(cfg, "TRAIN")[i]["label"] for i in range(4)]
    assert {label for per_view in labels for label in per_view} == {0, 1, 2, 3}


def test_simclr_collator_is_view_major():
    batch = build_collator("simclr_collator")(labelled_samples(3, [(2, 2)] * 2))
    assert batch["input"].shape == (6, 1, 2, 2)
    assert batch["input"][:, 0, 0, 0].tolist() == [0.0, 10.0, 20.0, 1.0, 11.0, 21.0]
    assert batch["target"].tolist() == [100, 101, 102] * 2
    assert batch["data_idx"].tolist() == [50, 51, 52] * 2
    assert batch["data_valid"].shape == (6,)


def test_multicrop_collator_groups_views_by_resolution():
    shapes = [(4, 4)] * 2 + [(2, 2)] * 3
    batch = build_collator("multicrop_collator")(labelled_samples(2, shapes))
    large, small = batch["input"]
    assert large.shape == (4, 1, 4, 4) and small.shape == (6, 1, 2, 2)
    assert large[:, 0, 0, 0].tolist() == [0.0, 10.0, 1.0, 11.0]
    assert small[:, 0, 0, 0].tolist() == [2.0, 12.0, 3.0, 13.0, 4.0, 14.0]
    assert batch["target"].tolist() == [100, 101] * 5
    assert batch["data_idx"].tolist() == [50, 51] * 5


def test_multicrop_loader_end_to_end():
    cfg = make_cfg(
        DATA_SOURCES=["digits"],
        BATCHSIZE_PER_REPLICA=3,
        COLLATE_FUNCTION="multicrop_collator",
        TRANSFORMS=[
            {
                "name": "ImgPilToMultiCrop",
                "total_num_crops": 3,
                "num_crops": [1, 2],
                "size_crops": [8, 4],
                "crop_scales": [[0.5, 1.0], [0.2, 0.5]],
            },
            {"name": "ToTensor"},
        ],
    )
    loader = build_dataloader(build_dataset(cfg, "TRAIN"), cfg.DATA.TRAIN, 0, False, epoch=0)
    batch = next(iter(loader))
    assert [tuple(t.shape) for t in batch["input"]] == [(3, 3, 8, 8), (6, 3, 4, 4)]
    assert batch["target"].shape == (9,)


def test_unknown_collator_name():
    message = "unknown collator 'simclr_colator': did you mean 'simclr_collator'"
    with pytest.raises(UnknownNameError, match=message):
        build_collator("simclr_colator")


def test_a_broken_batch_transfer_is_reported_as_the_worker_death_it_is():
    """Reading a batch from a worker that is being killed can fail with a connection error in
    multiprocessing's resource sharer before the worker's exit is known: the report waits for
    the exit and names it (without it, the run ended with a traceback)."""
    import types

    from ssl_engine.config import load_config
    from ssl_engine.data.loader import worker_death_error

    def broken_transfer():
        code = compile("def detach():\n    raise ConnectionResetError(104, 'reset')\n",
                       "/usr/lib/python3.11/multiprocessing/resource_sharer.py", "exec")
        namespace = {}
        exec(code, namespace)
        try:
            namespace["detach"]()
        except ConnectionResetError as err:
            return err

    _, cfg = load_config(["config=quickstart/simclr_digits"])
    killed = types.SimpleNamespace(_workers=[types.SimpleNamespace(exitcode=-9, pid=123)])
    died = worker_death_error(broken_transfer(), cfg, "TRAIN", killed)
    assert "DataLoader worker (pid 123) was killed by signal SIGKILL" in str(died)
    alive = types.SimpleNamespace(_workers=[types.SimpleNamespace(exitcode=None, pid=124)])
    died = worker_death_error(broken_transfer(), cfg, "TRAIN", alive)
    assert "a worker's connection broke while it handed a batch over" in str(died)
    assert worker_death_error(ConnectionResetError("elsewhere"), cfg, "TRAIN", alive) is None


def test_seeded_rngs_in_a_worker_draw_the_same_and_put_back_torch_only():
    """keep_all=False (a loader worker) draws what keep_all=True draws; it puts back torch's
    global state only, leaving numpy's and python's as the sample's seed left them."""
    from ssl_engine.data.seeding import seeded_rngs

    draws = {}
    for keep_all in (True, False):
        torch.manual_seed(1), np.random.seed(1), random.seed(1)
        torch_before, numpy_before = torch.get_rng_state(), np.random.get_state()[1].copy()
        with seeded_rngs(5, keep_all=keep_all):
            draws[keep_all] = (torch.rand(3), np.random.rand(), random.random())
        assert torch.equal(torch.get_rng_state(), torch_before)
        assert np.array_equal(np.random.get_state()[1], numpy_before) == keep_all
    assert torch.equal(draws[True][0], draws[False][0])
    assert draws[True][1:] == draws[False][1:]
