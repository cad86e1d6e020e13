"""Class indices -> a multi-hot label vector (VISSL's ``OneHotEncode``)."""
import numpy as np
import torch

from ssl_engine.data.registry import register_transform


@register_transform("OneHotEncode")
class OneHotEncode:
    """The label of each view becomes a vector of ``num_classes`` int64 values: 1 at each class
    the label names, 0 elsewhere. The label is one class index, or several (a list per image,
    e.g. ImageNet-ReaL's, read as an integer row padded with -1 or from a .json label file);
    negative entries name no class (padding, or -1 for an image without a label: all zeros).
    The image is not changed, whatever the transform's place in the list."""

    maps_label = True

    def __init__(self, num_classes: int = 1000):
        if int(num_classes) < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = int(num_classes)

    def map_label(self, label) -> torch.Tensor:
        if isinstance(label, torch.Tensor):
            label = label.detach().cpu().numpy()
        classes = np.asarray(label).reshape(-1)
        if classes.size and not (np.issubdtype(classes.dtype, np.integer)
                                 or np.array_equal(classes, np.round(classes))):
            raise ValueError(f"OneHotEncode takes class indices, got {label!r}")
        classes = classes.astype(np.int64)
        classes = classes[classes >= 0]
        if classes.size and classes.max() >= self.num_classes:
            raise ValueError(f"OneHotEncode: class {int(classes.max())} is not below "
                             f"num_classes={self.num_classes}")
        encoded = torch.zeros(self.num_classes, dtype=torch.long)
        encoded[torch.from_numpy(classes)] = 1
        return encoded

    def __repr__(self) -> str:
        return f"OneHotEncode(num_classes={self.num_classes})"
