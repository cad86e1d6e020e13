"""accuracy_list_meter against numpy, its state, build_meters, and sync over 2 gloo ranks."""
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.meters import AccuracyListMeter, build_meters

NUM_CLASSES = 10


def fixed_batch(seed: int, n: int = 40, outputs: int = 1):
    rng = np.random.RandomState(seed)
    logits = [rng.randn(n, NUM_CLASSES).astype(np.float32) for _ in range(outputs)]
    target = rng.randint(0, NUM_CLASSES, size=n)
    return logits, target


def numpy_topk_percent(logits: np.ndarray, target: np.ndarray, k: int) -> float:
    top = np.argsort(-logits, axis=1)[:, :k]
    return 100.0 * float(np.mean(np.any(top == target[:, None], axis=1)))


def meter_cfg(**overrides):
    cfg = {"num_meters": 1, "topk_values": [1, 5], "meter_names": []}
    cfg.update(overrides)
    return AttrDict(cfg)


def test_top1_top5_match_numpy_over_several_batches():
    meter = AccuracyListMeter.from_config(meter_cfg())
    batches = [fixed_batch(seed) for seed in (0, 1, 2)]
    for (logits,), target in batches:
        meter.update(torch.from_numpy(logits), torch.from_numpy(target))
    all_logits = np.concatenate([b[0][0] for b in batches])
    all_target = np.concatenate([b[1] for b in batches])
    value = meter.value
    assert set(value) == {"top_1", "top_5"}
    assert value["top_1"]["0"] == pytest.approx(numpy_topk_percent(all_logits, all_target, 1))
    assert value["top_5"]["0"] == pytest.approx(numpy_topk_percent(all_logits, all_target, 5))
    assert 0 < value["top_1"]["0"] < value["top_5"]["0"] < 100


def test_hand_counted_accuracy():
    meter = AccuracyListMeter(num_meters=1, topk_values=[1, 2])
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.2], [0.3, 0.2, 0.5], [0.6, 0.3, 0.1]])
    target = torch.tensor([1, 2, 1, 0])  # top-1 hits: rows 0, 3; top-2 adds row 1
    meter.update(logits, target)
    assert meter.value == {"top_1": {"0": 50.0}, "top_2": {"0": 75.0}}


def test_several_outputs_each_get_their_accuracy():
    names = ["res4", "res5", "res5avg"]
    meter = AccuracyListMeter.from_config(
        meter_cfg(num_meters=3, topk_values=[1], meter_names=names)
    )
    logits, target = fixed_batch(7, outputs=3)
    meter.update([torch.from_numpy(x) for x in logits], torch.from_numpy(target))
    expected = {name: numpy_topk_percent(x, target, 1) for name, x in zip(names, logits)}
    assert meter.value["top_1"] == pytest.approx(expected)
    assert len(set(expected.values())) > 1  # the outputs are really told apart


def test_reset_state_round_trip_and_repr():
    meter = AccuracyListMeter(num_meters=1, topk_values=[1])
    (logits,), target = fixed_batch(3)
    meter.update(torch.from_numpy(logits), torch.from_numpy(target))
    restored = AccuracyListMeter(num_meters=1, topk_values=[1])
    restored.set_classy_state(meter.get_classy_state())
    assert restored.value == meter.value
    assert repr(meter) == f"accuracy_list_meter(top_1[0]={meter.value['top_1']['0']:.2f})"
    meter.reset()
    assert meter.value == {"top_1": {"0": 0.0}}
    with pytest.raises(ValueError, match="does not fit accuracy_list_meter with names"):
        AccuracyListMeter(num_meters=2, topk_values=[1]).set_classy_state(meter.get_classy_state())


def test_config_and_output_count_errors():
    with pytest.raises(ValueError, match="meter_names has 1 names for num_meters=2"):
        AccuracyListMeter(num_meters=2, topk_values=[1], meter_names=["a"])
    with pytest.raises(ValueError, match="topk_values of positive ints"):
        AccuracyListMeter(num_meters=1, topk_values=[0])
    meter = AccuracyListMeter(num_meters=2, topk_values=[1])
    with pytest.raises(ValueError, match="num_meters=2 but the model gave 1 output"):
        meter.update(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))


def test_build_meters_by_name():
    cfg = AttrDict(
        {"names": ["accuracy_list_meter"], "accuracy_list_meter": meter_cfg(topk_values=[1])}
    )
    (meter,) = build_meters(cfg)
    assert isinstance(meter, AccuracyListMeter) and meter.name == "accuracy_list_meter"
    assert meter.topk_values == [1]
    assert build_meters(AttrDict({"names": []})) == []
    message = "unknown meter 'acuracy_list_meter': did you mean 'accuracy_list_meter'"
    with pytest.raises(KeyError, match=message):
        build_meters(AttrDict({"names": ["acuracy_list_meter"]}))


def sync_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        meter = AccuracyListMeter(num_meters=2, topk_values=[1, 5])
        logits, target = fixed_batch(seed=100 + rank, n=30 + 10 * rank, outputs=2)
        meter.update([torch.from_numpy(x) for x in logits], torch.from_numpy(target))
        meter.sync_state()
        torch.save(meter.value, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_sync_state_gives_accuracy_of_union_of_ranks(tmp_path):
    world_size = 2
    args = (world_size, str(tmp_path / "init"), str(tmp_path))
    mp.spawn(sync_worker, args=args, nprocs=world_size)
    batches = [fixed_batch(100 + rank, n=30 + 10 * rank, outputs=2) for rank in range(world_size)]
    target = np.concatenate([b[1] for b in batches])
    expected = {
        f"top_{k}": {
            str(i): numpy_topk_percent(np.concatenate([b[0][i] for b in batches]), target, k)
            for i in range(2)
        }
        for k in (1, 5)
    }
    for rank in range(world_size):
        value = torch.load(tmp_path / f"rank{rank}.pt")
        for k in expected:
            assert value[k] == pytest.approx(expected[k])
