"""The mobilenetv3_tv trunk: VISSL's outputs and parameter names (torchvision's MobileNet-V3
Large under ``model.``, no classifier), TIMM_BN, a VISSL checkpoint."""
import copy
from pathlib import Path

import pytest
import torch
import yaml

from ssl_engine.checkpoint.formats import (load_vissl_model_weights, vissl_checkpoint,
                                           vissl_key_prefix)
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.engines.registered_names import check_registered_names
from ssl_engine.models import build_model

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULTS = AttrDict(yaml.safe_load(f)["config"])


def make_model(seed=0, heads=(), **overrides):
    cfg = copy.deepcopy(DEFAULTS.MODEL)
    cfg.TRUNK.NAME = "mobilenetv3_tv"
    cfg.TRUNK.MOBILE_NET.update(overrides)
    cfg.HEAD.PARAMS = [list(head) for head in heads]
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():  # random batch-norm statistics: loading them is checked
        for name, buffer in model.named_buffers():
            if name.endswith("running_mean"):
                buffer.normal_(0, 0.1)
            elif name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5)
    return model.eval()


def vissl_mobilenet_keys():
    """VISSL's trunk holds torchvision's MobileNet-V3 Large as ``model`` with its classifier
    replaced by an identity: torchvision's keys under ``model.``, without ``classifier.*``."""
    from torchvision.models import mobilenet_v3_large

    return [f"model.{key}" for key in mobilenet_v3_large(weights=None).state_dict()
            if not key.startswith("classifier.")]


def test_outputs_names_and_a_vissl_checkpoint():
    heads = [["eval_mlp", {"in_channels": 960, "dims": [960, 4]}]]
    model = make_model(heads=heads)
    trunk = model.trunk
    assert sorted(trunk.state_dict()) == sorted(vissl_mobilenet_keys())
    assert vissl_key_prefix("mobilenetv3_tv") == ""
    assert trunk.default_out_feat_key == "trunk_pool" and trunk.output_dim == 960
    x = torch.randn(2, 3, 32, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pool, norm, feature_map = trunk(x, ["trunk_pool", "trunk_pool_norm", "trunk"])
        (default,) = trunk(x)
    assert feature_map.shape == (2, 960, 1, 2) and pool.shape == norm.shape == (2, 960)
    torch.testing.assert_close(pool, feature_map.mean(dim=(2, 3)), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm, pool / pool.norm(dim=1, keepdim=True))
    torch.testing.assert_close(default, pool, rtol=0, atol=0)
    with pytest.raises(ValueError, match="flatten"):
        trunk(x, ["flatten"])
    # a VISSL linear-evaluation checkpoint (trunk under base_model.) loads as it is
    written = vissl_checkpoint(model.get_classy_state()["model"], "")
    vissl_model = written["classy_state_dict"]["base_model"]["model"]
    vissl_model["trunk"] = {f"base_model.{k}": v for k, v in vissl_model["trunk"].items()}
    target = make_model(seed=2, heads=heads)
    load_vissl_model_weights(target, written)
    with torch.no_grad():
        torch.testing.assert_close(target.trunk(x)[0], pool, rtol=0, atol=0)
    for key, value in model.heads.state_dict().items():
        assert torch.equal(target.heads.state_dict()[key], value), key


def test_timm_bn_pretrained_and_the_name_checks():
    torch.manual_seed(0)
    default_bn = make_model().trunk.model.features[0][1]
    timm_bn = make_model(TIMM_BN=True).trunk.model.features[0][1]
    assert (default_bn.eps, default_bn.momentum) == (0.001, 0.01)
    assert (timm_bn.eps, timm_bn.momentum) == (1e-5, 0.1)
    with pytest.raises(ValueError, match="MOBILE_NET.PRETRAINED=true is not supported"):
        make_model(PRETRAINED=True)
    with pytest.raises(ValueError, match="MOBILE_NET.NAME='mobilenetv3_small_100' is not"):
        make_model(NAME="mobilenetv3_small_100")
    cfg = copy.deepcopy(DEFAULTS)
    cfg.DATA.TRAIN.DATA_SOURCES = cfg.DATA.TEST.DATA_SOURCES = ["synthetic"]
    cfg.MODEL.TRUNK.NAME = "mobilenetv3_tv"
    check_registered_names("train", cfg)


def timm_model_cfg(heads=(), **overrides):
    cfg = copy.deepcopy(DEFAULTS.MODEL)
    cfg.TRUNK.NAME = "mobilenetv3_timm"
    cfg.TRUNK.MOBILE_NET.update({"NAME": "mobilenetv3_small_050", **overrides})
    cfg.HEAD.PARAMS = [list(head) for head in heads]
    return cfg


def test_timm_trunk_outputs_are_timms_features():
    import timm

    torch.manual_seed(0)
    model = build_model(timm_model_cfg()).eval()
    trunk = model.trunk
    reference = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=0).eval()
    reference.load_state_dict({k[len("model."):]: v for k, v in trunk.state_dict().items()})
    assert trunk.default_out_feat_key == "flatten"
    assert trunk.stage_dims == {"trunk": 288, "trunk_pool": 288, "flatten": 1024}
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        flat, pool, feature_map = trunk(x, ["flatten", "trunk_pool", "trunk"])
        expected_map = reference.forward_features(x)
        expected = reference(x)  # num_classes=0: timm's pre-logits features
    torch.testing.assert_close(feature_map, expected_map)
    torch.testing.assert_close(pool, expected_map.mean(dim=(2, 3)))
    torch.testing.assert_close(flat, expected)


def test_timm_trunk_only_with_the_timm_head_is_timms_classifier():
    import timm

    heads = [["mobilenet_v3_head_timm", {"in_channels": 288, "mid_channels": 1024,
                                         "num_classes": 5}]]
    torch.manual_seed(0)
    model = build_model(timm_model_cfg(heads, TRUNK_ONLY=True)).eval()
    assert model.trunk.default_out_feat_key == "trunk"
    assert not any(key.startswith("model.conv_head") for key in model.trunk.state_dict())
    reference = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=5).eval()
    state = {k[len("trunk.model."):]: v for k, v in model.state_dict().items()
             if k.startswith("trunk.")}
    head = model.heads[0]
    state.update({"conv_head.weight": head.conv_head.weight, "conv_head.bias": head.conv_head.bias,
                  "classifier.weight": head.classifier.weight,
                  "classifier.bias": head.classifier.bias})
    reference.load_state_dict(state)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        (output,) = model(x)
        torch.testing.assert_close(output, reference(x))
        # pooled features give the same logits as the map they were pooled from
        pooled = model.trunk(x, ["trunk_pool"])[0]
        torch.testing.assert_close(head(pooled), output)
    with pytest.raises(ValueError, match="expects \\[N, 288, H, W\\]"):
        head(torch.zeros(2, 7))
    with pytest.raises(ValueError, match="not one of timm's MobileNet-V3"):
        build_model(timm_model_cfg(NAME="resnet50"))
