"""Export and import parity of the transformer trunks with their timm counterparts (XCiT-S12/16,
BEiT-B/16; the ViTs and Swin-T: test_export_parity_vit.py): the trunk's weights exported and loaded into timm's
model give the trunk's features, and timm's own state dict loaded as MODEL.WEIGHTS_INIT gives
timm's, to 1e-5 in float32 (random weights, no download)."""
import pytest

from counterpart_utils import TOLERANCE, both_ways, images, model_cfg


def beit_cls(net, x):
    return net.forward_features(x)[:, 0]


def beit_mean(net, x):
    return net.forward_features(x)[:, 1:].mean(dim=1)


BEIT = dict(USE_REL_POS_BIAS=True, QKV_BIAS=True, INIT_VALUES=0.1)
CASES = {  # name: (config, image size, timm's call, trunk output)
    "xcit_small_12_p16": (model_cfg("xcit", "XCIT"), 64, None, None),
    # BEiT-B/16's blocks (2 of its 12: each block converts alike). With mean pooling the
    # trunk has no fc_norm; timm's tokens before it are compared: the trunk has no fc_norm; timm's tokens before it are compared
    "beit_base_patch16_224 (2 blocks, mean pooling, lastCLS)": (model_cfg("beit", "BEIT", NUM_LAYERS=2, **BEIT), 224,
                                                      beit_cls, "lastCLS"),
    "beit_base_patch16_224 (2 blocks, mean pooling, lastPOOL)": (model_cfg("beit", "BEIT", NUM_LAYERS=2,
                                                                 **BEIT), 224, beit_mean,
                                                       "lastPOOL"),
    "beit (class token, final norm)": (model_cfg("beit", "BEIT", NUM_LAYERS=2,
                                                 USE_MEAN_POOLING=False, **BEIT), 224, None,
                                       None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_exported_and_imported_weights_give_the_same_features(case, tmp_path):
    cfg, size, call, key = CASES[case]
    kwargs = {"net_forward": call} if call else {}
    export_diff, import_diff, description = both_ways(cfg, "timm", images(1, size), tmp_path,
                                                      engine_key=key, **kwargs)
    print(f"{case}: export {export_diff:.2e}, import {import_diff:.2e}")
    assert description["trunk"] == cfg.TRUNK.NAME
    # only the buffers timm recomputes are left out of the file
    assert all(k.endswith("relative_position_index") for k in description["left_out"])
    assert export_diff <= TOLERANCE and import_diff <= TOLERANCE
