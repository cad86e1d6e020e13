"""Export and import parity of the ViT trunk with timm's VisionTransformer (ViT-S/16 with the
query/key/value bias, ViT-B/16 with the defaults'), to 1e-5 in float32; random weights."""
import pytest

from counterpart_utils import TOLERANCE, both_ways, images, model_cfg

CASES = {
    "vit_small_patch16_224": model_cfg("vision_transformer", "VISION_TRANSFORMERS",
                                       HIDDEN_DIM=384, NUM_HEADS=6, MLP_DIM=1536, QKV_BIAS=True),
    "vit_base_patch16_224": model_cfg("vision_transformer"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_exported_and_imported_weights_give_the_same_features(case, tmp_path):
    cfg = CASES[case]
    export_diff, import_diff, description = both_ways(cfg, "timm", images(1, 224), tmp_path)
    print(f"{case}: export {export_diff:.2e}, import {import_diff:.2e}")
    assert description["model_name"] == case
    assert export_diff <= TOLERANCE and import_diff <= TOLERANCE
