"""Build the transform pipeline of a split from its TRANSFORMS list."""
import inspect
from typing import Any, Dict, List, Optional, Tuple

import torchvision.transforms as tv_transforms
from torchvision.transforms import InterpolationMode

from ssl_engine.data.registry import TRANSFORM_REGISTRY
from ssl_engine.utils.registry import lookup


def known_transforms() -> Dict[str, type]:
    """Every torchvision.transforms class by class name, then the registered SSL transforms."""
    known = {name: obj for name, obj in vars(tv_transforms).items() if inspect.isclass(obj)}
    known.update({name: TRANSFORM_REGISTRY.get(name) for name in TRANSFORM_REGISTRY.names()})
    return known


def _params(spec: Dict[str, Any]) -> Dict[str, Any]:
    params = {key: value for key, value in spec.items() if key != "name"}
    if isinstance(params.get("interpolation"), str):
        params["interpolation"] = InterpolationMode(params["interpolation"].lower())
    return params


class TransformChain:
    """Applies transforms in order. A transform with ``makes_views = True`` turns one image into
    a list of views; every later transform is applied to each view independently, except one
    with ``takes_views = True``, which gets the whole list (e.g. a different probability per
    view). A transform with ``sets_label = True`` returns ``(image, label)``: the label of that
    view becomes ``label`` (e.g. the rotation a RotNet model must predict); one that also
    takes the views returns one image for the whole list, with its label. A transform with
    ``maps_label = True`` (e.g. OneHotEncode) leaves the images alone: its ``map_label(label)``
    rewrites the final label of every view (``map_label`` of the chain applies them in
    order)."""

    def __init__(self, transforms: List[Any]):
        self.transforms = transforms

    def __call__(self, sample):
        return self.apply(sample)[0]

    def apply(self, sample) -> Tuple[Any, Optional[List[Optional[int]]]]:
        """(the image or list of views, the label each view got from a ``sets_label``
        transform: None where none set one; None for all when no such transform ran)."""
        labels = None
        for transform in self.transforms:
            if getattr(transform, "maps_label", False):
                continue
            many = isinstance(sample, list)
            if many and getattr(transform, "takes_views", False):
                sample = transform(sample)
                if getattr(transform, "sets_label", False):  # the list became one labelled
                    sample, label = sample  # tensor (e.g. the patches of a jigsaw puzzle)
                    labels = [label]
                continue
            outputs = [transform(view) for view in sample] if many else [transform(sample)]
            if getattr(transform, "sets_label", False):
                outputs, labels = [out[0] for out in outputs], [out[1] for out in outputs]
            if getattr(transform, "makes_views", False):
                if labels is not None:  # every copy of a view keeps the view's label
                    labels = [label for label, out in zip(labels, outputs) for _ in out]
                outputs = outputs[0]
            sample = outputs if many or getattr(transform, "makes_views", False) else outputs[0]
        return sample, labels

    def map_label(self, label):
        """``label`` through every ``maps_label`` transform, in order."""
        for transform in self.transforms:
            if getattr(transform, "maps_label", False):
                label = transform.map_label(label)
        return label

    def __repr__(self) -> str:
        inner = "".join(f"\n  {t!r}" for t in self.transforms)
        return f"TransformChain({inner}\n)"


def build_transforms(specs: List[Dict[str, Any]], key: str = "TRANSFORMS") -> TransformChain:
    """``specs``: a list of ``{name: <transform>, <params>}``; ``key`` names the list in errors."""
    known = known_transforms()
    transforms, views_made_by = [], None
    for index, spec in enumerate(specs):
        where = f"{key}[{index}]"
        if "name" not in spec:
            raise ValueError(f"{where}: every transform needs a 'name', got {dict(spec)}")
        cls = lookup(known, spec["name"], f"transform ({where})")
        if getattr(cls, "makes_views", False):
            if views_made_by:
                raise ValueError(
                    f"{where}: {spec['name']} after {views_made_by}, which already made views"
                )
            views_made_by = spec["name"]
        try:
            transforms.append(cls(**_params(spec)))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where} ({spec['name']}): {err}") from err
    return TransformChain(transforms)
