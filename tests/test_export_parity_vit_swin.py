"""Export and import parity of the ViT trunk with timm's VisionTransformer (ViT-S/16 with the
query/key/value bias, ViT-B/16 with the defaults', one without a class token); of the Swin-T
trunk with timm's SwinTransformer (test_export_parity_transformers.py: XCiT and BEiT): to
1e-5 in float32, random weights, both ways (see counterpart_utils.both_ways)."""
import pytest

from counterpart_utils import TOLERANCE, both_ways, images, model_cfg

CASES = {
    "vit_small_patch16_224": model_cfg("vision_transformer", "VISION_TRANSFORMERS",
                                       HIDDEN_DIM=384, NUM_HEADS=6, MLP_DIM=1536, QKV_BIAS=True),
    "vit_base_patch16_224": model_cfg("vision_transformer"),
    # no class token: model(x), the mean of the normed patch tokens, is the lastPOOL
    "vit without class token": model_cfg("vision_transformer", "VISION_TRANSFORMERS",
                                         IMAGE_SIZE=32, PATCH_SIZE=8, NUM_LAYERS=2, NUM_HEADS=2,
                                         HIDDEN_DIM=64, MLP_DIM=128, USE_CLASS_TOKEN=False),
}


def patch_mean(net, x):
    return net.forward_features(x).mean(dim=1)


@pytest.mark.parametrize("case", list(CASES))
def test_exported_and_imported_weights_give_the_same_features(case, tmp_path):
    cfg = CASES[case]
    size = int(cfg.TRUNK.VISION_TRANSFORMERS.IMAGE_SIZE)
    extra = {} if cfg.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN else {"net_forward": patch_mean}
    export_diff, import_diff, description = both_ways(cfg, "timm", images(1, size), tmp_path,
                                                      **extra)
    print(f"{case}: export {export_diff:.2e}, import {import_diff:.2e}")
    assert description["model_name"] == (case if size == 224 else "vit_base_patch16_224")
    assert export_diff <= TOLERANCE and import_diff <= TOLERANCE


def test_swin_tiny_exported_and_imported_weights_give_the_same_features(tmp_path):
    export_diff, import_diff, description = both_ways(model_cfg("swin_transformer"), "timm",
                                                      images(1, 224), tmp_path)
    print(f"swin_tiny_patch4_window7_224: export {export_diff:.2e}, import {import_diff:.2e}")
    assert description["model_name"] == "swin_tiny_patch4_window7_224"
    assert all(k.endswith("relative_position_index") for k in description["left_out"])
    assert export_diff <= TOLERANCE and import_diff <= TOLERANCE
