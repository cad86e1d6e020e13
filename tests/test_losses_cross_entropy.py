"""cross_entropy_multiple_output_single_target against numpy."""
import numpy as np
import pytest
import torch

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.losses import CrossEntropyMultipleOutputSingleTargetLoss, build_loss


def numpy_cross_entropy(logits, target, weight=None, ignore_index=-1, temperature=1.0, normalize=False):
    """Weighted mean of -log softmax at the target over the non-ignored rows (torch's convention)."""
    logits = np.asarray(logits, dtype=np.float64)
    if normalize:
        logits = logits / np.linalg.norm(logits, axis=1, keepdims=True)
    logits = logits / temperature
    weight = np.ones(logits.shape[1]) if weight is None else np.asarray(weight, dtype=np.float64)
    numerator, denominator = 0.0, 0.0
    for row, label in zip(logits, target):
        if label == ignore_index:
            continue
        log_softmax = row - np.log(np.sum(np.exp(row)))
        numerator += -weight[label] * log_softmax[label]
        denominator += weight[label]
    return numerator / denominator


def make_inputs(seed=0, rows=6, classes=4, outputs=3):
    generator = torch.Generator().manual_seed(seed)
    logits = [torch.randn(rows, classes, generator=generator, dtype=torch.float64) for _ in range(outputs)]
    target = torch.tensor([0, 3, 1, -1, 2, 3])
    return logits, target


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"weight": [1.0, 2.0, 0.5, 3.0], "temperature": 0.5},
        {"normalize_output": True, "temperature": 0.1, "ignore_index": 3},
    ],
)
def test_sum_over_outputs_matches_numpy(settings):
    logits, target = make_inputs()
    if settings.get("ignore_index", -1) != -1:
        target[target == -1] = 0
    loss = CrossEntropyMultipleOutputSingleTargetLoss(**settings)(logits, target)
    numpy_settings = {
        "weight": settings.get("weight"),
        "ignore_index": settings.get("ignore_index", -1),
        "temperature": settings.get("temperature", 1.0),
        "normalize": settings.get("normalize_output", False),
    }
    expected = sum(numpy_cross_entropy(x.numpy(), target.numpy(), **numpy_settings) for x in logits)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_lone_tensor_and_column_target_built_from_config():
    cfg = AttrDict(
        {
            "name": "cross_entropy_multiple_output_single_target",
            "cross_entropy_multiple_output_single_target": {
                "weight": None,
                "ignore_index": -1,
                "temperature": 2.0,
                "normalize_output": False,
            },
        }
    )
    loss = build_loss(cfg)
    logits, target = make_inputs(outputs=1)
    value = loss(logits[0], target[:, None])
    expected = numpy_cross_entropy(logits[0].numpy(), target.numpy(), temperature=2.0)
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert dict(loss.get_classy_state()) == {}


def test_integer_one_hot_rows_are_class_weights_as_in_vissl():
    """OneHotEncode's integer [N, C] rows (VISSL's robustness files) give the loss of their
    class indices."""
    loss = CrossEntropyMultipleOutputSingleTargetLoss()
    logits, target = make_inputs(outputs=2)
    target = target.clamp(min=0)  # no ignored rows: a one-hot row names a class
    one_hot = torch.nn.functional.one_hot(target, logits[0].shape[1])
    assert one_hot.dtype == torch.int64
    torch.testing.assert_close(loss(logits, one_hot), loss(logits, target))


def test_bad_target_shape_is_refused():
    loss = CrossEntropyMultipleOutputSingleTargetLoss()
    with pytest.raises(ValueError, match=r"target must have shape \[N\] \(classes\) or \[N, C\] "
                                         r"\(class probabilities\), got \(2, 3, 1\) torch.int64"):
        loss([torch.zeros(2, 4)], torch.zeros(2, 3, 1, dtype=torch.long))
