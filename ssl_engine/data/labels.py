"""Sample labels: one class index (an int) or a label vector (a 1-D tensor, e.g. VOC's
1 / 0 / -1 row of 20 classes or a multi-hot row made by ``OneHotEncode``), and the batch
target they stack into."""
from typing import Any, List

import numpy as np
import torch

from ssl_engine.data.worker_errors import OneMessageError


class MixedLabelShapes(OneMessageError, ValueError):
    """The samples of one batch have labels of different shapes (the same message from a
    data-loader worker)."""


def sample_label(value: Any):
    """``value`` as a sample label: an int for a single class (a Python or numpy integer, a
    0-d array or tensor), else a 1-D tensor (int64 for integer or boolean values, float32 for
    floating ones)."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, torch.Tensor):
        array = value.detach().cpu().numpy()
    else:
        array = np.asarray(value)
    if array.ndim == 0:
        return int(array)
    if array.ndim != 1:
        raise ValueError(f"a sample label must be one class index or a vector, got an array of "
                         f"shape {array.shape}")
    if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
        return torch.from_numpy(array.astype(np.int64))
    if np.issubdtype(array.dtype, np.floating):
        return torch.from_numpy(array.astype(np.float32))
    raise ValueError(f"a label vector must hold numbers, got dtype {array.dtype}")


def _describe(label) -> str:
    if isinstance(label, torch.Tensor):
        return f"a vector of {label.shape[0]} {str(label.dtype).replace('torch.', '')}"
    return "one class index"


def stack_labels(labels: List[Any], data_idx: List[int]) -> torch.Tensor:
    """The target of a batch: [B] int64 when every label is a class index, [B, C] when every
    label is a vector of C values (int64, or float32 for floating vectors). Labels of
    different shapes or dtypes raise MixedLabelShapes naming two samples that differ."""
    if all(not isinstance(label, torch.Tensor) for label in labels):
        return torch.tensor([int(label) for label in labels], dtype=torch.long)
    first = labels[0]
    for label, index in zip(labels, data_idx):
        if (not isinstance(label, torch.Tensor) or not isinstance(first, torch.Tensor)
                or label.shape != first.shape or label.dtype != first.dtype):
            raise MixedLabelShapes(
                f"the labels of one batch differ: sample {data_idx[0]} has {_describe(first)}, "
                f"sample {index} has {_describe(label)}. Every label of a split must have the "
                "same shape: one class per image, or one vector of the same length (rows of an "
                "[N, C] label file, or OneHotEncode on every label)")
    return torch.stack(labels)
