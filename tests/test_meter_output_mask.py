"""METERS.model_output_mask: the meters score only the classes the split's labels name."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine_utils import FunctionLoss
from ssl_engine.config import compose_config
from ssl_engine.data import build_dataset
from ssl_engine.meters import AccuracyListMeter
from ssl_engine.meters.output_mask import OutputMask, label_classes
from ssl_engine.trainer.amp import MixedPrecision
from ssl_engine.trainer.task import SelfSupervisionTask
from ssl_engine.trainer.train_steps.standard_train_step import forward_loss_and_meters
from ssl_engine.utils.metrics_store import MetricsStore


def test_label_classes_of_indices_and_of_label_vectors():
    assert label_classes(np.array([7, 2, 7, -1, 2, 4])).tolist() == [2, 4, 7]
    vectors = np.array([[0, 1, 0, 0], [0, 1, 0, 1], [-1, 0, 0, 0]])
    assert label_classes(vectors).tolist() == [1, 3]
    with pytest.raises(ValueError, match="class indices or label vectors"):
        label_classes(np.zeros((2, 2, 2)))


def test_accuracy_of_masked_output_is_the_accuracy_among_the_subset():
    rng = np.random.RandomState(0)
    logits = rng.randn(50, 10).astype(np.float32)
    subset = np.array([1, 4, 6, 9])
    target = subset[rng.randint(0, 4, size=50)]
    # by hand: the prediction is the best-scoring class of the subset
    expected = 100.0 * np.mean(subset[np.argmax(logits[:, subset], axis=1)] == target)
    unmasked = 100.0 * np.mean(np.argmax(logits, axis=1) == target)
    assert expected != unmasked  # the mask changes the score on this data
    mask = OutputMask(label_classes(target))
    meter = AccuracyListMeter.from_config({"num_meters": 2, "topk_values": [1]})
    output = torch.from_numpy(logits)
    meter.update(mask([output, output]), torch.from_numpy(target))
    assert meter.value["top_1"] == {"0": pytest.approx(expected), "1": pytest.approx(expected)}
    with pytest.raises(ValueError, match="name class 9, but the model gives 5 scores"):
        mask(torch.zeros(2, 5))


def test_the_step_feeds_the_meters_the_masked_output_and_the_loss_the_whole_output():
    output = torch.tensor([[5.0, 1.0, 2.0], [0.0, 3.0, 9.0]])
    seen = []
    task = SimpleNamespace(
        model=lambda inputs: output, train=False, run_hook=lambda event: None,
        amp=MixedPrecision(None, "cpu"), metrics=MetricsStore(), iteration=0, phase_idx=0,
        iteration_num_in_phase=0, schedule_iteration=0, schedule_length=1,
        loss=FunctionLoss(lambda out, target: seen.append(out) or out.sum() * 0),
        meters=[AccuracyListMeter.from_config({"num_meters": 1, "topk_values": [1]})],
        meter_output=OutputMask(torch.tensor([1, 2])))
    forward_loss_and_meters(task, {"input": torch.zeros(2, 1), "target": torch.tensor([2, 1])})
    assert torch.equal(seen[0], output)  # the loss sees every class
    assert task.meters[0].value["top_1"]["0"] == pytest.approx(50.0)  # sample 0: 2 among {1, 2}


def test_the_task_masks_with_the_classes_of_the_phase_split(monkeypatch, tmp_path):
    _, cfg = compose_config([
        "config=test/quick_simclr_synthetic", "config.METERS.model_output_mask=true",
        "config.TEST_MODEL=true", "config.DATA.TEST.DATA_SOURCES=[synthetic]",
        "config.DATA.TEST.SYNTHETIC.NUM_SAMPLES=6", "config.DATA.TEST.SYNTHETIC.NUM_CLASSES=3",
        "config.DATA.TEST.DATA_LIMIT=4"])
    task = SelfSupervisionTask.__new__(SelfSupervisionTask)
    task.config, task.train = cfg, False
    task.datasets = {"TEST": build_dataset(cfg, "TEST")}
    task.meter_masks = task._meter_masks()
    assert task.meter_masks["TEST"].classes.tolist() == [0, 1, 2]
    masked = task.meter_output(torch.zeros(1, 5))
    assert masked.tolist() == [[0.0, 0.0, 0.0, float("-inf"), float("-inf")]]
    task.train = True  # no TRAIN mask here: the output is left as it is
    assert task.meter_output(torch.zeros(1, 5)).tolist() == [[0.0] * 5]
