"""Export and import parity of the convolutional trunks with their timm / torchvision
counterparts: the trunk's weights exported and loaded into the counterpart give the trunk's
features, and the counterpart's own state dict loaded as MODEL.WEIGHTS_INIT gives the
counterpart's, to 1e-5 in float32 (random weights, no download)."""
import pytest

from counterpart_utils import TOLERANCE, both_ways, images, model_cfg

CASES = {
    "resnet50-timm": (model_cfg("resnet"), "timm"),
    "resnet50-torchvision": (model_cfg("resnet"), "torchvision"),
    "resnext50_32x4d-timm": (model_cfg("resnet", "RESNETS", GROUPS=32, WIDTH_PER_GROUP=4),
                             "timm"),
    "resnext50_32x4d-torchvision": (model_cfg("resnet", "RESNETS", GROUPS=32,
                                              WIDTH_PER_GROUP=4), "torchvision"),
    "convnext_tiny-timm": (model_cfg("convnext", "CONVNEXT", DEPTH=[3, 3, 9, 3]), "timm"),
    "regnet_y_400mf-torchvision": (model_cfg("regnet", "REGNET", name="regnet_y_400mf"),
                                   "torchvision"),
    "regnet_by_parameters-torchvision": (model_cfg("regnet", "REGNET", depth=6, w_0=8, w_a=8.0,
                                                   w_m=2.0, group_width=8, stem_width=32),
                                         "torchvision"),
    "efficientnet_b0-torchvision": (model_cfg("efficientnet"), "torchvision"),
    "mobilenet_v3_large-torchvision": (model_cfg("mobilenetv3_tv"), "torchvision"),
    "mobilenetv3_large_100-timm": (model_cfg("mobilenetv3_timm"), "timm"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_exported_and_imported_weights_give_the_same_features(case, tmp_path):
    cfg, library = CASES[case]
    export_diff, import_diff, description = both_ways(cfg, library, images(2, 64), tmp_path)
    print(f"{case}: export {export_diff:.2e}, import {import_diff:.2e}")
    assert description["library"] == library and description["trunk"] == cfg.TRUNK.NAME
    assert export_diff <= TOLERANCE and import_diff <= TOLERANCE
