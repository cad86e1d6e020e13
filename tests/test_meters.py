"""accuracy_list_meter against numpy, its state, build_meters, and sync over 2 gloo ranks."""
import numpy as np
import pytest
import torch
import torch.distributed as dist

from gloo_utils import spawn_ranks
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
        torch.save(list_meter_values(rank), f"{out_dir}/list_rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def list_meter_values(rank: int) -> dict:
    """mean_ap_list_meter and precision_at_k_list_meter after a sync (inside a process group)."""
    from ssl_engine.meters import MeanAPListMeter, PrecisionAtKListMeter

    scores, labels = multi_label_batch(200 + rank, n=20 + 10 * rank)
    values = {}
    for meter in (MeanAPListMeter(num_classes=6),
                  PrecisionAtKListMeter(num_meters=1, topk_values=[2])):
        meter.update(torch.from_numpy(scores), torch.from_numpy(labels))
        meter.sync_state()
        values[meter.name] = meter.value
    return values


def test_sync_state_gives_accuracy_of_union_of_ranks(tmp_path):
    world_size = 2
    spawn_ranks(sync_worker, world_size, tmp_path, lambda init: (world_size, init, str(tmp_path)))
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
    check_list_meters_synced(tmp_path)


def check_list_meters_synced(tmp_path) -> None:
    """Both ranks' mean AP and precision@2 are those of the union of the ranks' samples."""
    from sklearn.metrics import average_precision_score

    batches = [multi_label_batch(200 + rank, n=20 + 10 * rank) for rank in range(2)]
    scores = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    m_ap = 100.0 * np.mean([average_precision_score(labels[:, c], scores[:, c])
                            for c in range(6)])
    precision, _ = numpy_precision_recall_at_k(scores, labels, 2)
    for rank in range(2):
        value = torch.load(tmp_path / f"list_rank{rank}.pt")
        assert value["mean_ap_list_meter"]["mAP"]["0"] == pytest.approx(m_ap)
        assert value["precision_at_k_list_meter"]["top_2"]["0"] == pytest.approx(precision)


# ---------------------------------------------------------------- VISSL's other list meters
def multi_label_batch(seed: int, n: int = 50, classes: int = 6, unknown: bool = False):
    rng = np.random.RandomState(seed)
    scores = rng.randn(n, classes).astype(np.float32)
    labels = (rng.rand(n, classes) < 0.3).astype(np.int64)
    labels[0] = 1  # every class has a positive
    if unknown:
        labels[rng.rand(n, classes) < 0.1] = -1
    return scores, labels


def numpy_precision_recall_at_k(scores, labels, k):
    top = np.argsort(-scores, axis=1)[:, :k]
    hits = np.take_along_axis(labels, top, axis=1).sum()
    return 100.0 * hits / (k * len(scores)), 100.0 * hits / labels.sum()


def test_precision_and_recall_at_k_match_numpy():
    from ssl_engine.meters import PrecisionAtKListMeter, RecallAtKListMeter

    cfg = {"num_meters": 1, "topk_values": [1, 3], "meter_names": ["head"]}
    meters = (PrecisionAtKListMeter.from_config(cfg), RecallAtKListMeter.from_config(cfg))
    batches = [multi_label_batch(seed) for seed in (0, 1)]
    for scores, labels in batches:
        for meter in meters:
            meter.update(torch.from_numpy(scores), torch.from_numpy(labels))
    scores = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    for k in (1, 3):
        precision, recall = numpy_precision_recall_at_k(scores, labels, k)
        assert meters[0].value[f"top_{k}"]["head"] == pytest.approx(precision)
        assert meters[1].value[f"top_{k}"]["head"] == pytest.approx(recall)
    assert meters[0].name == "precision_at_k_list_meter"
    assert meters[1].name == "recall_at_k_list_meter"


def test_mean_ap_matches_scikit_learn_and_skips_unknown_labels():
    from sklearn.metrics import average_precision_score

    from ssl_engine.meters import MeanAPListMeter

    meter = MeanAPListMeter.from_config({"num_classes": 6, "num_meters": 1, "meter_names": []})
    batches = [multi_label_batch(seed, unknown=True) for seed in (3, 4)]
    for scores, labels in batches:
        meter.update(torch.from_numpy(scores), torch.from_numpy(labels))
    scores = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    expected = [average_precision_score(labels[labels[:, c] >= 0, c],
                                        scores[labels[:, c] >= 0, c]) for c in range(6)]
    assert meter.value["AP"]["0"] == pytest.approx(expected)
    assert meter.value["mAP"]["0"] == pytest.approx(100.0 * np.mean(expected))
    # ties count as one threshold, as scikit-learn does
    tied = torch.tensor([[0.5], [0.5], [0.1], [0.9]])
    tied_labels = torch.tensor([[1], [0], [1], [0]])
    tie_meter = MeanAPListMeter(num_classes=1)
    tie_meter.update(tied, tied_labels)
    assert tie_meter.value["AP"]["0"][0] == pytest.approx(
        average_precision_score(tied_labels[:, 0].numpy(), tied[:, 0].numpy()))
    restored = MeanAPListMeter(num_classes=6)
    restored.set_classy_state(meter.get_classy_state())
    assert restored.value["mAP"] == meter.value["mAP"]
    with pytest.raises(ValueError, match="must be 1 \\(present\\), 0 \\(absent\\) or -1"):
        meter.update(torch.zeros(2, 6), torch.full((2, 6), 2))
    with pytest.raises(ValueError, match="max_cpu_capacity=60"):
        capped = MeanAPListMeter(num_classes=6, max_cpu_capacity=60)
        for scores, labels in batches:
            capped.update(torch.from_numpy(scores), torch.from_numpy(labels))


def test_empty_meter_name_means_no_meter_and_old_name_key_counts():
    assert build_meters(AttrDict({"name": "", "names": [""]})) == []
    (meter,) = build_meters(AttrDict({"name": "precision_at_k_list_meter", "names": [],
                                      "precision_at_k_list_meter": meter_cfg()}))
    assert meter.name == "precision_at_k_list_meter"
